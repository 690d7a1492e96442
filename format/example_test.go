package format_test

import (
	"os"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// oneTxn returns a buffer holding one committed transaction: an insert into public.person.
func oneTxn() *reorderbuffer.Buffer {
	b, err := reorderbuffer.New(reorderbuffer.Config{})
	if err != nil {
		panic(err)
	}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, m := range []decoding.Message{
		&decoding.Begin{FinalLSN: 0x16B3750, CommitTime: at, Xid: 750},
		&decoding.Relation{RelationID: 16384, Namespace: "public", Name: "person",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 20}, {Name: "born", TypeOID: 1082},
				{Name: "note", TypeOID: 25}}},
		&decoding.Insert{RelationID: 16384, New: decoding.Tuple{{Kind: 't', Data: []byte("1")},
			{Kind: 't', Data: []byte("1990-05-17")}, {Kind: 'n'}}},
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
	return b
}

// Example writes a transaction in the txn format: one line per transaction.
func Example() {
	b := oneTxn()
	defer b.Close()
	w := format.NewWriter(os.Stdout, format.Config{})
	defer w.Close()
	for x, ok := b.Next(); ok; x, ok = b.Next() {
		if err := w.WriteTxn(x); err != nil {
			panic(err)
		}
		b.Ack(x)
	}
	// Output:
	// {"xid":750,"commit_lsn":"0/16B3750","end_lsn":"0/16B3780","commit_time":"2026-11-29T12:00:00.000000Z","changes":[{"op":"insert","relation":"public.person","schema":"public","table":"person","new":{"id":"1","born":"1990-05-17","note":null}}]}
}

// Example_debezium writes the same transaction as Debezium change events: one line per change,
// typed values.
func Example_debezium() {
	b := oneTxn()
	defer b.Close()
	w := format.NewWriter(os.Stdout, format.Config{Kind: format.KindDebezium, Server: "inventory", Database: "app",
		Now: func() time.Time { return time.Date(2026, 11, 29, 12, 0, 1, 0, time.UTC) }})
	defer w.Close()
	for x, ok := b.Next(); ok; x, ok = b.Next() {
		if err := w.WriteTxn(x); err != nil {
			panic(err)
		}
		b.Ack(x)
	}
	// Output:
	// {"before":null,"after":{"id":1,"born":7441,"note":null},"source":{"version":"","connector":"pgreorder","name":"inventory","ts_ms":1795953600000,"snapshot":"false","db":"app","sequence":null,"ts_us":1795953600000000,"ts_ns":1795953600000000000,"schema":"public","table":"person","txId":750,"lsn":23803728,"xmin":null,"origin":null,"origin_lsn":null},"transaction":{"id":"750:23803728","total_order":1,"data_collection_order":1},"op":"c","ts_ms":1795953601000,"ts_us":1795953601000000,"ts_ns":1795953601000000000}
}
