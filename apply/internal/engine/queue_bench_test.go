package engine

import (
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
