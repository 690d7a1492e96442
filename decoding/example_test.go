package decoding_test

import (
	"fmt"

	"github.com/pgreorder/pgreorder/decoding"
)

// A Decoder validates the stream and decodes each message; Next is the allocation-free header
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
	for _, data := range stream {
		m, err := d.Decode(data)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		switch m := m.(type) {
		case *decoding.Insert:
			rel, _ := d.Relations().Relation(m.RelationID)
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
