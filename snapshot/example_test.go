package snapshot_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// A Chunk is a pgvalue.Source, as a streamed transaction is.
var _ pgvalue.Source = (*snapshot.Chunk)(nil)

// The initial copy, then the stream from the slot's consistent point: every committed change
// exactly once. Copied rows are handled as inserts, by the code that handles streamed ones.
func Example() {
	ctx := context.Background()
	dsn := "host=db.example.com user=cdc dbname=shop"
	rcfg := replication.Config{ConnString: dsn, Slot: "cdc", Publications: []string{"orders"}}
	conn, err := replication.Connect(ctx, rcfg)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
	if err != nil {
		log.Fatal(err)
	}
	sess, err := snapshot.Open(ctx, snapshot.Config{ConnString: dsn, Publications: rcfg.Publications,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}, snap)
	if err != nil {
		log.Fatal(err) // the replication connection is still idle: the snapshot can be opened again
	}
	defer sess.Close(ctx)
	// Every worker holds the snapshot: the replication connection may start streaming.
	stream, err := conn.StartStreaming(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer stream.Close(ctx)

	apply := func(ch pgvalue.Change) error { // the consumer's code for every change
		fmt.Println(ch) // "Insert public.orders", ...
		return nil
	}
	_, err = sess.Run(ctx, func(ctx context.Context, c *snapshot.Chunk) error {
		dec := pgvalue.NewDecoder(nil) // Run calls in parallel: a Decoder per call
		for ch, err := range dec.Changes(c) {
			if err != nil {
				return err
			}
			if err := apply(ch); err != nil { // ch.Op is decoding.MsgInsert
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err) // drop the slot and start again
	}
	sess.Close(ctx)

	dec := pgvalue.NewDecoder(nil)
	for {
		txn, err := stream.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		for ch, err := range dec.Changes(txn) {
			if err != nil {
				log.Fatal(err)
			}
			if err := apply(ch); err != nil {
				log.Fatal(err)
			}
		}
		if err := stream.Ack(txn); err != nil {
			log.Fatal(err)
		}
	}
}

// Copying a table added to the publication while the stream runs: when a change shows a table
// that no copy covers, copy it in a snapshot of its own, then skip the streamed changes that
// copy holds already.
func ExampleSyncTables() {
	ctx := context.Background()
	rcfg := replication.Config{ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "cdc",
		Publications: []string{"orders"}}
	var copies []*snapshot.Result // the initial copy's Result, and those of later syncs
	covered := func(rel uint32, commit decoding.LSN) bool {
		for _, r := range copies {
			if r.Covers(rel, commit) {
				return true
			}
		}
		return false
	}
	copied := func(rel uint32) bool {
		for _, r := range copies {
			if r.Copied(rel) {
				return true
			}
		}
		return false
	}
	stream, err := replication.Start(ctx, rcfg)
	if err != nil {
		log.Fatal(err)
	}
	dec := pgvalue.NewDecoder(nil)
	for {
		txn, err := stream.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		for ch, err := range dec.Changes(txn) {
			if err != nil {
				log.Fatal(err)
			}
			if ch.Relation != nil && !copied(ch.Relation.RelationID) {
				sync := rcfg
				sync.Slot = "cdc_sync" // a temporary slot, dropped when the copy has started
				res, err := snapshot.SyncTables(ctx, sync, snapshot.Config{
					Tables: func(t *snapshot.Table) bool { return !copied(t.OID) },
				}, func(ctx context.Context, c *snapshot.Chunk) error {
					return nil // apply the rows, as in the initial copy
				})
				if err != nil {
					log.Fatal(err)
				}
				copies = append(copies, res)
			}
			if ch.Relation != nil && covered(ch.Relation.RelationID, txn.CommitLSN) {
				continue // the copy has it
			}
			// apply ch
		}
		stream.Ack(txn)
	}
}

// Covers tells which streamed changes a copy holds already: those of the tables it copied, in
// transactions that committed before its consistent point.
func ExampleResult_Covers() {
	res := &snapshot.Result{ConsistentPoint: 0x3000060, Slot: "cdc_sync",
		Tables: []*snapshot.Table{{OID: 16402, Schema: "public", Name: "invoices"}}}
	for _, c := range []struct {
		rel    uint32
		commit decoding.LSN
	}{
		{16402, 0x3000010}, // before the consistent point: the copy has it
		{16402, 0x3000060}, // at it: streamed, not copied
		{16399, 0x3000010}, // another table
	} {
		fmt.Printf("table %d, commit %s: covered %t\n", c.rel, c.commit, res.Covers(c.rel, c.commit))
	}
	// Output:
	// table 16402, commit 0/3000010: covered true
	// table 16402, commit 0/3000060: covered false
	// table 16399, commit 0/3000010: covered false
}

// Reading a chunk's rows as pgoutput messages, without pgvalue: each is a *decoding.Insert of the
// table, its columns in the text format (or binary, with Config.Binary).
func ExampleChunk_Changes() {
	handler := func(ctx context.Context, c *snapshot.Chunk) error {
		for ch, err := range c.Changes() {
			if err != nil {
				return err
			}
			ins := ch.Msg.(*decoding.Insert)
			for i, col := range ins.New {
				name := c.Table.Relation.Columns[i].Name
				fmt.Printf("%s.%s = %q (kind %c)\n", c.Table, name, col.Data, col.Kind) // valid until the next row
			}
		}
		return nil
	}
	_ = handler // pass it to Session.Run or Copy
}
