package decoding_test

import (
	"fmt"

	"github.com/pgreorder/pgreorder/decoding"
)

// A Decoder validates the stream and decodes each message; Accept is the allocation-free header
// path. The messages here are built with Append; a real program gets them from XLogData.
func ExampleDecoder() {
	var stream [][]byte
	for _, m := range []struct {
		m        decoding.Message
		inStream bool
	}{
		{&decoding.StreamStart{Xid: 700, FirstSegment: true}, false},
		{&decoding.Relation{Xid: 700, RelationID: 16384, Namespace: "public", Name: "t", ReplicaIdentity: 'd',
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23, TypeMod: -1}}}, true},
		{&decoding.Insert{Xid: 701, RelationID: 16384, New: decoding.Tuple{{Kind: decoding.ColumnText, Data: []byte("42")}}}, true},
		{&decoding.StreamStop{}, true},
		{&decoding.StreamAbort{Xid: 700, SubXid: 701}, false},
		{&decoding.StreamAbort{Xid: 999, SubXid: 999}, false}, // never streamed: PostgreSQL 18 sends such strays
	} {
		b, err := decoding.Append(nil, m.m, m.inStream, decoding.Options{})
		if err != nil {
			panic(err)
		}
		stream = append(stream, b)
	}

	d := decoding.NewDecoder(decoding.Options{ProtoVersion: 2})
	// A program that reads transactions gets a change's relation from reorderbuffer's Txn,
	// which knows which description is in effect; this one has a single Relation message.
	rels := map[uint32]*decoding.Relation{}
	for _, data := range stream {
		m, err := d.Decode(data)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		switch m := m.(type) {
		case *decoding.Relation:
			rels[m.RelationID] = m
			fmt.Println(m.Type())
		case *decoding.Insert:
			rel := rels[m.RelationID]
			fmt.Printf("insert by xid %d into %s: %s=%s\n", m.Xid, rel.Name, rel.Columns[0].Name, m.New[0].Data)
		case *decoding.StreamAbort:
			fmt.Printf("abort %d of %d\n", m.SubXid, m.Xid)
		default:
			fmt.Println(m.Type())
		}
	}
	// A change outside any transaction is a protocol violation.
	_, err := d.Decode(stream[2])
	fmt.Println(err)
	// Output:
	// Stream Start
	// Relation
	// insert by xid 701 into t: id=42
	// Stream Stop
	// abort 701 of 700
	// abort 999 of 999
	// decoding: Insert message at offset 0: protocol violation: change outside any transaction or stream block
}

// A Parser overwrites the message it returned on its next call, and the message's column data
// alias the input buffer, which the caller reuses. Clone keeps a message beyond both.
func ExampleInsert_Clone() {
	var p decoding.Parser
	buf := make([]byte, 0, 64) // reused for every message, as pgconn reuses its receive buffer
	var kept, aliased []*decoding.Insert
	for _, v := range []string{"first", "second"} {
		var err error
		buf, err = decoding.Append(buf[:0], &decoding.Insert{RelationID: 1,
			New: decoding.Tuple{{Kind: decoding.ColumnText, Data: []byte(v)}}}, false, decoding.Options{})
		if err != nil {
			panic(err)
		}
		m, err := p.Parse(buf, false)
		if err != nil {
			panic(err)
		}
		ins := m.(*decoding.Insert)
		aliased = append(aliased, ins)
		kept = append(kept, ins.Clone())
	}
	for i := range kept {
		fmt.Printf("clone %s, original %s\n", kept[i].New[0].Data, aliased[i].New[0].Data)
	}
	// Output:
	// clone first, original second
	// clone second, original second
}
