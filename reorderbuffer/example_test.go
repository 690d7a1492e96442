package reorderbuffer_test

import (
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Example feeds a small streamed pgoutput session, as a server with streaming on sends it: two
// transactions interleave, one rolls back a savepoint, the other aborts; a small transaction
// commits in between. The buffer hands back what the server would have sent with streaming off.
func Example() {
	b, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: 64 << 10})
	if err != nil {
		panic(err)
	}
	defer b.Close()

	rel := &decoding.Relation{RelationID: 16384, Namespace: "public", Name: "t",
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "v", TypeOID: 25, TypeMod: -1}}}
	row := func(xid uint32, v string) *decoding.Insert {
		return &decoding.Insert{Xid: xid, RelationID: 16384, New: decoding.Tuple{{Kind: 't', Data: []byte(v)}}}
	}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	withXid := func(r *decoding.Relation, xid uint32) *decoding.Relation { c := *r; c.Xid = xid; return &c }
	stream := []struct {
		m        decoding.Message
		inStream bool
	}{
		{&decoding.StreamStart{Xid: 700, FirstSegment: true}, false},
		{withXid(rel, 700), true},
		{row(700, "a"), true},
		{row(701, "b, in a savepoint"), true}, // subtransaction 701
		{&decoding.StreamStop{}, true},
		{&decoding.StreamStart{Xid: 800, FirstSegment: true}, false},
		{withXid(rel, 800), true},
		{row(800, "never committed"), true},
		{&decoding.StreamStop{}, true},
		{&decoding.Begin{FinalLSN: 0x1F00, CommitTime: at, Xid: 750}, false},
		{rel, false},
		{row(0, "small"), false},
		{&decoding.Commit{CommitLSN: 0x1F00, EndLSN: 0x1F30, CommitTime: at}, false},
		{&decoding.StreamAbort{Xid: 700, SubXid: 701}, false}, // ROLLBACK TO SAVEPOINT
		{&decoding.StreamStart{Xid: 700}, false},
		{withXid(rel, 700), true}, // pgoutput describes the relation again after an abort
		{row(700, "c"), true},
		{&decoding.StreamStop{}, true},
		{&decoding.StreamAbort{Xid: 800, SubXid: 800}, false}, // ROLLBACK
		{&decoding.StreamCommit{Xid: 700, CommitLSN: 0x2F00, EndLSN: 0x2F30, CommitTime: at}, false},
	}
	for i, s := range stream {
		data, err := decoding.Append(nil, s.m, s.inStream, decoding.Options{})
		if err != nil {
			panic(err)
		}
		if err := b.Add(decoding.LSN(0x1000+i), data); err != nil {
			panic(err)
		}
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			fmt.Printf("xid %d ends at %s:", x.Xid, x.EndLSN)
			for c, err := range x.Changes() {
				if err != nil {
					panic(err)
				}
				if ins, ok := c.Msg.(*decoding.Insert); ok {
					r := c.Relation // as described at the change's position
					fmt.Printf(" %s.%s+%q", r.Namespace, r.Name, ins.New[0].Data)
				}
			}
			fmt.Println()
			b.Ack(x) // once durably applied
		}
	}
	fmt.Println("flush position:", b.FlushPosition())
	// Output:
	// xid 750 ends at 0/1F30: public.t+"small"
	// xid 700 ends at 0/2F30: public.t+"a" public.t+"c"
	// flush position: 0/2F30
}

// ExampleTxn_Heads routes a transaction's changes by relation without parsing their rows: each
// Head carries the record (Raw) for whoever applies it to parse.
func ExampleTxn_Heads() {
	b, err := reorderbuffer.New(reorderbuffer.Config{})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	rel := func(id uint32, name string) *decoding.Relation {
		return &decoding.Relation{RelationID: id, Namespace: "public", Name: name,
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23, TypeMod: -1}}}
	}
	row := func(id uint32, v string) *decoding.Insert {
		return &decoding.Insert{RelationID: id, New: decoding.Tuple{{Kind: 't', Data: []byte(v)}}}
	}
	for i, m := range []decoding.Message{
		&decoding.Begin{FinalLSN: 0x1F00, Xid: 750},
		rel(16384, "accounts"), row(16384, "1"),
		rel(16390, "history"), row(16390, "2"), row(16384, "3"),
		&decoding.Commit{CommitLSN: 0x1F00, EndLSN: 0x1F30},
	} {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		if err != nil {
			panic(err)
		}
		if err := b.Add(decoding.LSN(0x1000+i), data); err != nil {
			panic(err)
		}
	}
	x, _ := b.Next()
	perRelation := map[string]int{}
	for h, err := range x.Heads() {
		if err != nil {
			panic(err)
		}
		if h.Type == decoding.MsgInsert { // h.Msg is nil: the row is in h.Raw, unparsed
			perRelation[h.Relation.Name] += len(h.Raw)
		}
	}
	fmt.Println("bytes of rows for accounts:", perRelation["accounts"], "for history:", perRelation["history"])
	// Output:
	// bytes of rows for accounts: 28 for history: 14
}
