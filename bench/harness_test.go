package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/cputime"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// full runs the benchmarks at PostgreSQL's published sizes (10M rows, 1M subtransactions,
// 100000×32 transactions): set PGREORDER_BENCH_FULL=1. An environment variable rather than a
// flag, so that it works with package patterns like ./bench/... (a test flag would have to follow
// the packages, and every package of the pattern would have to define it).
var full = new(os.Getenv("PGREORDER_BENCH_FULL") == "1")

// size returns the published size with PGREORDER_BENCH_FULL=1, and reduced otherwise (the -short run and
// the default): small enough that the whole package runs in a few minutes on 2 cores.
func size(fullSize, reduced int64) int64 {
	if *full {
		return fullSize
	}
	return reduced
}

// outcome is what a consumer handed out.
type outcome struct {
	changes int64 // Insert, Update and Delete messages handed out
	txns    int64
	stats   reorderbuffer.Stats // zero for the naive baseline
}

// sampleEvery is how many messages pass between two samples of the heap.
const sampleEvery = 4096

// meter samples the Go heap during a run. Peaks are relative to the heap after a GC at start:
// the generators hold no input, so the baseline is the test binary itself.
type meter struct {
	s                  [2]metrics.Sample
	baseObj, baseLive  uint64
	peakObj, peakLive  uint64
	mallocs, allocated uint64
	n                  int
}

func (m *meter) start() {
	m.s[0].Name = "/memory/classes/heap/objects:bytes" // live and not yet swept dead objects
	m.s[1].Name = "/gc/heap/live:bytes"                // live heap as marked by the last GC
	runtime.GC()
	metrics.Read(m.s[:])
	m.baseObj, m.baseLive = m.s[0].Value.Uint64(), m.s[1].Value.Uint64()
	m.peakObj, m.peakLive = m.baseObj, m.baseLive
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.mallocs, m.allocated = ms.Mallocs, ms.TotalAlloc
}

// tick counts one message and samples the heap every sampleEvery messages.
func (m *meter) tick() {
	m.n++
	if m.n%sampleEvery == 0 {
		m.sample()
	}
}

func (m *meter) sample() {
	metrics.Read(m.s[:])
	m.peakObj = max(m.peakObj, m.s[0].Value.Uint64())
	m.peakLive = max(m.peakLive, m.s[1].Value.Uint64())
}

// stop samples once more and returns the mallocs and bytes allocated since start.
func (m *meter) stop() (mallocs, bytes uint64) {
	m.sample()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs - m.mallocs, ms.TotalAlloc - m.allocated
}

// runPgreorder feeds the workload to a Buffer, and reads every committed transaction's changes
// as soon as it is handed out, as a consumer does.
func runPgreorder(wl *Workload, cfg reorderbuffer.Config, m *meter) (outcome, error) {
	var out outcome
	buf, err := reorderbuffer.New(cfg)
	if err != nil {
		return out, err
	}
	defer buf.Close()
	drain := func() error {
		for t, ok := buf.Next(); ok; t, ok = buf.Next() {
			out.txns++
			for c, err := range t.Changes() {
				if err != nil {
					return err
				}
				if _, ok := c.Msg.(decoding.RowChange); ok {
					out.changes++
					m.tick()
				}
			}
			buf.Ack(t)
		}
		return nil
	}
	for lsn, data := range wl.Messages() {
		if err := buf.Add(lsn, data); err != nil {
			return out, err
		}
		m.tick()
		switch decoding.MessageType(data[0]) {
		case decoding.MsgCommit, decoding.MsgStreamCommit, decoding.MsgCommitPrepared:
			if err := drain(); err != nil {
				return out, err
			}
		}
	}
	if err := drain(); err != nil {
		return out, err
	}
	out.stats = buf.Stats()
	return out, buf.Close()
}

// naive is what most Go CDC tools do today: parse every message with pglogrepl and keep it in a
// map from transaction id to a slice, with no memory limit, until the commit.
type naive struct {
	txns     map[uint32][]pglogrepl.Message
	cur      uint32
	inStream bool
}

func changeXid(m pglogrepl.Message) uint32 {
	switch m := m.(type) {
	case *pglogrepl.InsertMessageV2:
		return m.Xid
	case *pglogrepl.UpdateMessageV2:
		return m.Xid
	case *pglogrepl.DeleteMessageV2:
		return m.Xid
	case *pglogrepl.RelationMessageV2:
		return m.Xid
	}
	return 0
}

func (nv *naive) add(data []byte, emit func(xid uint32, msgs []pglogrepl.Message)) error {
	m, err := pglogrepl.ParseV2(data, nv.inStream)
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		nv.cur = m.Xid
	case *pglogrepl.CommitMessage:
		emit(nv.cur, nv.txns[nv.cur])
		delete(nv.txns, nv.cur)
	case *pglogrepl.StreamStartMessageV2:
		nv.cur, nv.inStream = m.Xid, true
	case *pglogrepl.StreamStopMessageV2:
		nv.inStream = false
	case *pglogrepl.StreamCommitMessageV2:
		emit(m.Xid, nv.txns[m.Xid])
		delete(nv.txns, m.Xid)
	case *pglogrepl.StreamAbortMessageV2:
		if m.Xid == m.SubXid {
			delete(nv.txns, m.Xid)
		} else if msgs, ok := nv.txns[m.Xid]; ok {
			nv.txns[m.Xid] = slices.DeleteFunc(msgs, func(c pglogrepl.Message) bool { return changeXid(c) == m.SubXid })
		}
	default:
		nv.txns[nv.cur] = append(nv.txns[nv.cur], m)
	}
	return nil
}

func runNaive(wl *Workload, m *meter) (outcome, error) {
	var out outcome
	nv := naive{txns: map[uint32][]pglogrepl.Message{}}
	emit := func(_ uint32, msgs []pglogrepl.Message) {
		out.txns++
		for _, c := range msgs {
			switch c.(type) {
			case *pglogrepl.InsertMessageV2, *pglogrepl.UpdateMessageV2, *pglogrepl.DeleteMessageV2:
				out.changes++
				m.tick()
			}
		}
	}
	for _, data := range wl.Messages() {
		if err := nv.add(data, emit); err != nil {
			return out, err
		}
		m.tick()
	}
	return out, nil
}

// impl is one consumer under test.
type impl struct {
	name string
	run  func(b testing.TB, wl *Workload, m *meter) (outcome, error)
}

// withBuffer returns the pgreorder consumer at the given work mem (spill files in a temporary
// directory of the benchmark).
func withBuffer(name string, workMem int64) impl {
	return impl{name: name, run: func(b testing.TB, wl *Workload, m *meter) (outcome, error) {
		return runPgreorder(wl, reorderbuffer.Config{WorkMem: workMem, Dir: b.TempDir(), Decoding: Options}, m)
	}}
}

var naiveImpl = impl{name: "naive", run: func(_ testing.TB, wl *Workload, m *meter) (outcome, error) {
	return runNaive(wl, m)
}}

// unlimited is a work mem no workload reaches.
const unlimited = int64(1) << 62

// measure runs one consumer over the workload b.N times and reports the per-change metrics.
// budget is the memory limit the buffer had (0 for none): it is reported as workmem-bytes
// so that the chart script can check peak heap ≤ work mem + 16 MiB.
func measure(b *testing.B, wl *Workload, im impl, budget int64) {
	b.Logf("%v", wl)
	b.ReportAllocs()
	var m meter
	var last outcome
	m.start()
	b.ResetTimer()
	cpu0 := cputime.Process()
	for range b.N {
		out, err := im.run(b, wl, &m)
		if err != nil {
			b.Fatal(err)
		}
		if out.changes != wl.Kept || out.txns != wl.Txns {
			b.Fatalf("%s handed out %d changes in %d transactions, want %d in %d", im.name, out.changes, out.txns, wl.Kept, wl.Txns)
		}
		last = out
	}
	b.StopTimer()
	cpu := cputime.Process() - cpu0
	mallocs, bytes := m.stop()
	changes := float64(b.N) * float64(wl.Changes)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/changes, "ns/change")
	// The process's CPU time (every thread: the collector's too), which other work on the
	// machine inflates less than the elapsed time.
	b.ReportMetric(float64(cpu.Nanoseconds())/changes, "cpu-ns/change")
	b.ReportMetric(float64(mallocs)/changes, "allocs/change")
	b.ReportMetric(float64(bytes)/changes, "B/change")
	b.ReportMetric(float64(last.stats.SpillBytes), "spilled-bytes")
	b.ReportMetric(float64(m.peakObj-m.baseObj), "peak-heap-bytes")
	b.ReportMetric(float64(m.peakLive-m.baseLive), "peak-live-bytes")
	if im.name != naiveImpl.name {
		b.ReportMetric(float64(last.stats.PeakMemoryBytes), "peak-records-bytes")
		if budget == 0 {
			budget = last.stats.PeakMemoryBytes // no limit: the bound is what it had to hold
		}
		b.ReportMetric(float64(budget), "workmem-bytes")
	}
}

// workMems are the work mem settings of the parallel-apply study.
var workMems = []struct {
	name  string
	bytes int64
}{{"64kB", 64 << 10}, {"256kB", 256 << 10}, {"64MB", 64 << 20}}

func rowsName(n int64) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// seed is the generators' seed; every benchmark logs its workload with it.
const seed = 20240501

// generatorOnly only generates the workload: its time is what every consumer's time includes
// for producing the input.
var generatorOnly = impl{name: "generator-only", run: func(_ testing.TB, wl *Workload, m *meter) (outcome, error) {
	var out outcome
	for _, data := range wl.Messages() {
		switch decoding.MessageType(data[0]) {
		case decoding.MsgInsert, decoding.MsgUpdate, decoding.MsgDelete:
			out.changes++
		case decoding.MsgCommit, decoding.MsgStreamCommit:
			out.txns++
		}
		m.tick()
	}
	out.changes = min(out.changes, wl.Kept) // rolled-back changes are generated but not kept
	return out, nil
}}

type pglogreplMessage = pglogrepl.Message

// naiveChange returns the relation and first column of a change parsed by pglogrepl.
func naiveChange(m pglogrepl.Message) (rel uint32, first []byte, ok bool) {
	switch m := m.(type) {
	case *pglogrepl.InsertMessageV2:
		return m.RelationID, m.Tuple.Columns[0].Data, true
	case *pglogrepl.UpdateMessageV2:
		return m.RelationID, m.NewTuple.Columns[0].Data, true
	}
	return 0, nil, false
}
