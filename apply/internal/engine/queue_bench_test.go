package engine

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// noTypes resolves no data type: the benchmark's columns are built in.
type noTypes struct{}

func (noTypes) Type(uint32) (*decoding.DataType, bool) { return nil, false }

// BenchmarkQueueChange measures what a change of a streamed transaction costs between the
// reorder buffer and the target: the leader's enqueue (the queue record made and pushed) and
// the worker's decode (popped and parsed), for an in-stream Update of four text columns.
func BenchmarkQueueChange(b *testing.B) {
	rel := &decoding.Relation{RelationID: 16384, Namespace: "public", Name: "t", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{
			{Flags: 1, Name: "id", TypeOID: 23}, {Name: "a", TypeOID: 25}, {Name: "b", TypeOID: 25}, {Name: "c", TypeOID: 25}}}
	col := func(s string) decoding.Column { return decoding.Column{Kind: 't', Data: []byte(s)} }
	up := &decoding.Update{Xid: 1234, RelationID: rel.RelationID,
		New: decoding.Tuple{col("42"), col("some text of a row"), col("more text, a little longer"), {Kind: 'u'}}}
	raw, err := decoding.Append(nil, up, true, decoding.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var p decoding.Parser
	m, err := p.Parse(raw, true) // as the reorder buffer's iteration yields it
	if err != nil {
		b.Fatal(err)
	}
	c := decoding.Change{Msg: m, Relation: rel, Raw: raw, InStream: true}
	e := &Engine{reg: target.NewRegistry()}
	rels := []*target.Relation{e.reg.Intern(rel, noTypes{})}
	var spilled atomic.Int64
	q := schedule.NewQueue(schedule.NewSpillStore(b.TempDir(), nil), schedule.NewBudget(reorderbuffer.NewMemory(1<<20)), 1<<20, &spilled)
	defer q.Close()
	var wp decoding.Parser
	var wrels []*target.Relation
	b.ReportAllocs()
	for b.Loop() {
		rec, err := encodeChange(c, rels)
		if err != nil {
			b.Fatal(err)
		}
		if err := q.Push(rec); err != nil {
			b.Fatal(err)
		}
		rec, ok, err := q.TryPop()
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		if _, wrels, err = e.decodeChange(&wp, rec, wrels); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/change")
	b.ReportMetric(float64(testing.AllocsPerRun(100, func() {
		rec, _ := encodeChange(c, rels)
		_ = q.Push(rec)
		rec, _, _ = q.TryPop()
		_, wrels, _ = e.decodeChange(&wp, rec, wrels)
	})), "allocs/change")
}

// BenchmarkHandOver measures what handing a whole committed transaction (a run's member in
// Parallel) from the leader to a worker costs, through a real reorder buffer, on one goroutine:
// the leader's reading of it (which resolving relations and dependencies needs either way) and
// then either a copy of each change into the queue, popped and parsed again by the worker
// (copied), or the transaction kept where the buffer holds it, one record queued, and the worker
// reading it there and releasing it (kept).
func BenchmarkHandOver(b *testing.B) {
	rel := &decoding.Relation{RelationID: 16384, Namespace: "public", Name: "t", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{
			{Flags: 1, Name: "id", TypeOID: 23}, {Name: "a", TypeOID: 25}, {Name: "b", TypeOID: 25}, {Name: "c", TypeOID: 25}}}
	col := func(s string) decoding.Column { return decoding.Column{Kind: 't', Data: []byte(s)} }
	up := &decoding.Update{RelationID: rel.RelationID,
		New: decoding.Tuple{col("42"), col("some text of a row"), col("more text, a little longer"), {Kind: 'u'}}}
	enc := func(m decoding.Message) []byte {
		out, err := decoding.Append(nil, m, false, decoding.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	relMsg, upMsg := enc(rel), enc(up)
	for _, changes := range []int{2, 20} {
		for _, how := range []string{"copied", "kept", "kept-heads"} {
			kept, heads := how != "copied", how == "kept-heads"
			name := fmt.Sprintf("changes=%d/%s", changes, how)
			b.Run(name, func(b *testing.B) {
				mem := reorderbuffer.NewMemory(64 << 20)
				buf, err := reorderbuffer.New(reorderbuffer.Config{Dir: b.TempDir(), Incremental: true, Memory: mem})
				if err != nil {
					b.Fatal(err)
				}
				defer buf.Close()
				e := &Engine{reg: target.NewRegistry(), stats: &Counters{}}
				var spilled atomic.Int64
				q := schedule.NewQueue(schedule.NewSpillStore(b.TempDir(), nil), schedule.NewBudget(mem), 8<<20, &spilled)
				defer q.Close()
				j := &job{q: q}
				var wp decoding.Parser
				var wrels []*target.Relation
				rels := make([]*target.Relation, 1)
				lsn := decoding.LSN(0x1000)
				xid := uint32(1000)
				add := func(data []byte) {
					lsn += 0x100
					if err := buf.Add(lsn, data); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					xid++
					add(enc(&decoding.Begin{FinalLSN: lsn + decoding.LSN(0x100*(changes+3)), Xid: xid}))
					if xid == 1001 {
						add(relMsg)
					}
					for range changes {
						add(upMsg)
					}
					end := lsn + 0x200
					add(enc(&decoding.Commit{CommitLSN: lsn + 0x100, EndLSN: end}))
					t, ok := buf.Next()
					if !ok {
						b.Fatal("no transaction")
					}
					var kp *keptPart
					if kept {
						if kp = e.keep(j, t); kp == nil {
							b.Fatal("not kept")
						}
					}
					lead := func(c decoding.Change) {
						if c.Relation == nil || c.Msg != nil && c.Msg.Type() == decoding.MsgRelation {
							return
						}
						rels[0] = e.reg.Intern(c.Relation, c.Schema)
						if kept {
							kp.note(rels)
							return
						}
						rec, err := encodeChange(c, rels)
						if err != nil {
							b.Fatal(err)
						}
						if err := q.Append(rec); err != nil {
							b.Fatal(err)
						}
					}
					if heads { // the leader reads only the relations, as for a streamed part
						for h, err := range t.Heads() {
							if err != nil {
								b.Fatal(err)
							}
							lead(h.Change)
						}
					} else {
						for c, err := range t.Changes() {
							if err != nil {
								b.Fatal(err)
							}
							lead(c)
						}
					}
					if kept {
						if err := e.addPart(j, kp); err != nil {
							b.Fatal(err)
						}
					}
					for {
						rec, ok, err := q.TryPop()
						if err != nil {
							b.Fatal(err)
						}
						if !ok {
							break
						}
						if !kept {
							if _, wrels, err = e.decodeChange(&wp, rec, wrels); err != nil {
								b.Fatal(err)
							}
							continue
						}
						kp, _ := j.part(binary.BigEndian.Uint32(rec[1:]))
						kp.txn.UseParser(&wp)
						for c, err := range kp.txn.Changes() {
							if err != nil {
								b.Fatal(err)
							}
							if wrels, err = kp.resolve(c, wrels); err != nil {
								b.Fatal(err)
							}
						}
						j.letGo(kp)
					}
					j.parts = j.parts[:0]
					if err := buf.Ack(t); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/txn")
			})
		}
	}
}
