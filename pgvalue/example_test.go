package pgvalue_test

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// committed feeds messages of one transaction through a reorder buffer and returns it.
func committed(msgs ...decoding.Message) (*reorderbuffer.Buffer, *reorderbuffer.Txn) {
	b, err := reorderbuffer.New(reorderbuffer.Config{})
	if err != nil {
		panic(err)
	}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	msgs = append([]decoding.Message{&decoding.Begin{FinalLSN: 0x16B3750, CommitTime: at, Xid: 750}}, msgs...)
	msgs = append(msgs, &decoding.Commit{CommitLSN: 0x16B3750, EndLSN: 0x16B3780, CommitTime: at})
	for _, m := range msgs {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		if err != nil {
			panic(err)
		}
		if err := b.Add(0, data); err != nil {
			panic(err)
		}
	}
	x, _ := b.Next()
	return b, x
}

// Example prints each change of a transaction with its table, column names, types and Go values.
func Example() {
	b, txn := committed(
		&decoding.DataType{TypeOID: 16390, Namespace: "public", Name: "mood"},
		&decoding.Relation{RelationID: 16384, Namespace: "public", Name: "person", ReplicaIdentity: 'd',
			Columns: []decoding.RelationColumn{
				{Flags: 1, Name: "id", TypeOID: pgtype.Int8OID, TypeMod: -1},
				{Name: "born", TypeOID: pgtype.DateOID, TypeMod: -1},
				{Name: "score", TypeOID: pgtype.NumericOID, TypeMod: -1},
				{Name: "mood", TypeOID: 16390, TypeMod: -1},
				{Name: "bio", TypeOID: pgtype.TextOID, TypeMod: -1},
			}},
		&decoding.Insert{RelationID: 16384, New: decoding.Tuple{
			{Kind: 't', Data: []byte("42")}, {Kind: 't', Data: []byte("1990-05-17")},
			{Kind: 't', Data: []byte("12.50")}, {Kind: 't', Data: []byte("happy")}, {Kind: 'n'}}},
		&decoding.Update{RelationID: 16384, New: decoding.Tuple{
			{Kind: 't', Data: []byte("42")}, {Kind: 'n'}, {Kind: 't', Data: []byte("13")},
			{Kind: 't', Data: []byte("ok")}, {Kind: 'u'}}},
	)
	defer b.Close()
	dec := pgvalue.NewDecoder(nil)
	for c, err := range txn.Changes() {
		if err != nil {
			panic(err)
		}
		ch, ok, err := dec.Change(c.Schema, c.Msg)
		if err != nil {
			panic(err)
		}
		if !ok {
			continue // the Relation and Type messages
		}
		fmt.Printf("%s %s.%s\n", ch.Op, ch.Relation.Namespace, ch.Relation.Name)
		for c := range ch.New.Columns() {
			if c.Unchanged() {
				fmt.Printf("  %s %s: unchanged\n", c.Name, c.TypeName())
				continue
			}
			v, err := c.Value()
			if err != nil {
				panic(err)
			}
			fmt.Printf("  %s %s key=%t: %T %v\n", c.Name, c.TypeName(), c.Key, v, v)
		}
	}
	// Output:
	// Insert public.person
	//   id int8 key=true: int64 42
	//   born date key=false: time.Time 1990-05-17 00:00:00 +0000 UTC
	//   score numeric key=false: pgtype.Numeric {1250 -2 false finite true}
	//   mood mood key=false: string happy
	//   bio text key=false: <nil> <nil>
	// Update public.person
	//   id int8 key=true: int64 42
	//   born date key=false: <nil> <nil>
	//   score numeric key=false: pgtype.Numeric {13 0 false finite true}
	//   mood mood key=false: string ok
	//   bio text: unchanged
}

// Example_scan decodes a column into a variable of the caller's type, and registers a codec for
// a type the server describes only by name.
func Example_scan() {
	b, txn := committed(
		&decoding.DataType{TypeOID: 16390, Namespace: "public", Name: "mood"},
		&decoding.Relation{RelationID: 16384, Namespace: "public", Name: "person",
			Columns: []decoding.RelationColumn{
				{Flags: 1, Name: "id", TypeOID: pgtype.Int4OID},
				{Name: "mood", TypeOID: 16390},
			}},
		// A binary-format row (a slot read with binary 'true').
		&decoding.Insert{RelationID: 16384, New: decoding.Tuple{
			{Kind: 'b', Data: []byte{0, 0, 0, 7}}, {Kind: 'b', Data: []byte("sad")}}},
	)
	defer b.Close()
	m := pgtype.NewMap()
	m.RegisterType(&pgtype.Type{Name: "public.mood", OID: 16390, Codec: &pgtype.EnumCodec{}})
	dec := pgvalue.NewDecoder(m)
	for c, err := range txn.Changes() {
		if err != nil {
			panic(err)
		}
		ch, ok, err := dec.Change(c.Schema, c.Msg)
		if err != nil || !ok {
			continue
		}
		var id int64
		var mood string
		idCol, _ := ch.New.Lookup("id")
		moodCol, _ := ch.New.Lookup("mood")
		if err := idCol.Scan(&id); err != nil {
			panic(err)
		}
		if err := moodCol.Scan(&mood); err != nil {
			panic(err)
		}
		v, _ := moodCol.Value()
		fmt.Println(id, mood, moodCol.TypeSchema()+"."+moodCol.TypeName(), v)
	}
	// Output:
	// 7 sad public.mood sad
}
