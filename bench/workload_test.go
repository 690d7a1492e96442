package bench

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// testWorkloads are small instances of every generator, with sizes chosen to hit their edge
// cases: blocks that end exactly at the rollback, a subtransaction entirely in the last partial
// block (no Stream Abort), one spanning several blocks.
func testWorkloads(seed uint64) []*Workload {
	return []*Workload{
		ManySubxacts(5000, 64<<10, seed),
		BulkInsert(5000, 64<<10, seed),
		BulkInsert(436*3, 64<<10, seed), // exactly three full blocks, no tail
		RollbackToSavepoint(5000, 10, 64<<10, seed),
		RollbackToSavepoint(5000, 50, 64<<10, seed),
		RollbackToSavepoint(5000, 10, 64<<20, seed), // one partial block: the rollback is never sent
		RollbackToSavepoint(436*10, 10, 64<<10, seed),
		SmallTxns(20, 32, seed),
		SmallTxnsStreamed(100, 32, 30, 7, seed),
		ManyOpenTxns(2000, 5, seed),
	}
}

// TestWorkloadsDecode checks that every generated stream is valid pgoutput (the decoder's state
// machine accepts it and every message parses), and that its declared counts are right.
func TestWorkloadsDecode(t *testing.T) {
	const seed = 1
	t.Logf("seed %d", seed)
	for _, wl := range testWorkloads(seed) {
		t.Run(wl.Name, func(t *testing.T) {
			dec := decoding.NewDecoder(Options)
			var changes, txns int64
			var last decoding.LSN
			for lsn, data := range wl.Messages() {
				if lsn <= last {
					t.Fatalf("LSN %v after %v", lsn, last)
				}
				last = lsn
				if _, err := dec.Decode(data); err != nil {
					t.Fatalf("message %d: %v", changes, err)
				}
				switch decoding.MessageType(data[0]) {
				case decoding.MsgInsert, decoding.MsgUpdate, decoding.MsgDelete:
					changes++
				case decoding.MsgCommit, decoding.MsgStreamCommit:
					txns++
				}
			}
			if changes != wl.Changes || txns != wl.Txns {
				t.Errorf("%v: stream has %d changes in %d transactions", wl, changes, txns)
			}
		})
	}
}

// TestConsumersAgree feeds every workload to pgreorder at several work mems and to the naive
// baseline; all must hand out the workload's kept changes in the same order.
func TestConsumersAgree(t *testing.T) {
	const seed = 2
	t.Logf("seed %d", seed)
	for _, wl := range testWorkloads(seed) {
		t.Run(wl.Name, func(t *testing.T) {
			want := naiveDigest(t, wl)
			for _, wm := range []int64{reorderbuffer.SpillEverything, 4 << 10, 64 << 10, unlimited} {
				if got := pgreorderDigest(t, wl, wm); got != want {
					t.Errorf("work mem %d: pgreorder's output differs from the naive baseline's", wm)
				}
			}
			var m meter
			m.start()
			out, err := runPgreorder(wl, reorderbuffer.Config{WorkMem: 4 << 10, Dir: t.TempDir(), Decoding: Options}, &m)
			if err != nil {
				t.Fatal(err)
			}
			if out.changes != wl.Kept || out.txns != wl.Txns {
				t.Errorf("handed out %d changes in %d transactions, want %d in %d", out.changes, out.txns, wl.Kept, wl.Txns)
			}
		})
	}
}

// digest hashes the (relation, first column) of each change handed out, in order.
type digest struct {
	h interface {
		Write([]byte) (int, error)
		Sum([]byte) []byte
	}
	n int
}

func (d *digest) add(rel uint32, first []byte) {
	fmt.Fprintf(d.h, "%d:%s;", rel, first)
	d.n++
}

func (d *digest) String() string { return fmt.Sprintf("%d changes %x", d.n, d.h.Sum(nil)) }

func pgreorderDigest(t *testing.T, wl *Workload, workMem int64) string {
	t.Helper()
	buf, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: workMem, Dir: t.TempDir(), Decoding: Options})
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	d := digest{h: sha256.New()}
	for lsn, data := range wl.Messages() {
		if err := buf.Add(lsn, data); err != nil {
			t.Fatal(err)
		}
		for x, ok := buf.Next(); ok; x, ok = buf.Next() {
			for c, err := range x.Changes() {
				if err != nil {
					t.Fatal(err)
				}
				switch m := c.Msg.(type) {
				case *decoding.Insert:
					d.add(m.RelationID, m.New[0].Data)
				case *decoding.Update:
					d.add(m.RelationID, m.New[0].Data)
				}
			}
			buf.Ack(x)
		}
	}
	return d.String()
}

func naiveDigest(t *testing.T, wl *Workload) string {
	t.Helper()
	var m meter
	m.start()
	d := digest{h: sha256.New()}
	nv := naive{txns: map[uint32][]pglogreplMessage{}}
	for _, data := range wl.Messages() {
		err := nv.add(data, func(_ uint32, msgs []pglogreplMessage) {
			for _, c := range msgs {
				if rel, first, ok := naiveChange(c); ok {
					d.add(rel, first)
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return d.String()
}

// TestDeterministic checks that a workload yields the same bytes every time, and other bytes
// with another seed.
func TestDeterministic(t *testing.T) {
	sum := func(wl *Workload) [32]byte {
		h := sha256.New()
		for _, data := range wl.Messages() {
			h.Write(data)
		}
		return [32]byte(h.Sum(nil))
	}
	for i, wl := range testWorkloads(7) {
		a, b := sum(wl), sum(wl)
		if a != b {
			t.Errorf("%v: two iterations differ", wl)
		}
		// Bulk inserts and rollbacks insert 1..n, as generate_series does: only the
		// other workloads draw random values.
		random := strings.HasPrefix(wl.Name, "many-subxacts") || strings.HasPrefix(wl.Name, "small-txns")
		if c := sum(testWorkloads(8)[i]); random && c == a {
			t.Errorf("%v: seeds 7 and 8 give the same stream", wl)
		}
	}
}

// TestGeneratorAllocs checks that generating a message allocates nothing, so that the
// benchmarks' allocation counts are the consumer's.
func TestGeneratorAllocs(t *testing.T) {
	for _, wl := range testWorkloads(3) {
		var msgs int
		allocs := testing.AllocsPerRun(3, func() {
			msgs = 0
			for range wl.Messages() {
				msgs++
			}
		})
		if per := allocs / float64(msgs); per > 0.01 {
			t.Errorf("%v: %.3f allocations per message", wl, per)
		}
	}
}

// TestStopEarly checks that a consumer may stop iterating.
func TestStopEarly(t *testing.T) {
	wl := BulkInsert(1000, 64<<10, 1)
	n := 0
	for range wl.Messages() {
		n++
		if n == 10 {
			break
		}
	}
	if n != 10 {
		t.Fatalf("got %d messages", n)
	}
}
