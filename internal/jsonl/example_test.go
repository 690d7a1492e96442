package jsonl_test

import (
	"os"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/jsonl"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Example writes one committed transaction in the txn format.
func Example() {
	b, err := reorderbuffer.New(reorderbuffer.Config{})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, m := range []decoding.Message{
		&decoding.Begin{FinalLSN: 0x16B3750, CommitTime: at, Xid: 750},
		&decoding.Relation{RelationID: 16384, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id"}, {Name: "note"}}},
		&decoding.Insert{RelationID: 16384, New: decoding.Tuple{{Kind: 't', Data: []byte("1")}, {Kind: 'n'}}},
		&decoding.Commit{CommitLSN: 0x16B3750, EndLSN: 0x16B3780, CommitTime: at},
	} {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		if err != nil {
			panic(err)
		}
		if err := b.Add(0, data); err != nil {
			panic(err)
		}
	}
	w := jsonl.NewWriter(os.Stdout)
	for x, ok := b.Next(); ok; x, ok = b.Next() {
		if err := w.WriteTxn(x); err != nil {
			panic(err)
		}
		b.Ack(x)
	}
	// Output:
	// {"xid":750,"commit_lsn":"0/16B3750","end_lsn":"0/16B3780","commit_time":"2026-11-29T12:00:00.000000Z","changes":[{"op":"insert","relation":"public.t","schema":"public","table":"t","new":{"id":"1","note":null}}]}
}
