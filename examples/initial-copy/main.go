// Command initial-copy DSN SLOT PUBLICATION... copies the published tables in the snapshot of a
// new slot, then streams what follows, printing one JSON line per row: "read" for a copied row,
// "insert", "update" or "delete" for a streamed change. A table added to a publication later is
// copied when its first change arrives, from a temporary slot named SLOT_sync.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

func main() {
	if len(os.Args) < 4 {
		log.Fatal("usage: initial-copy DSN SLOT PUBLICATION...")
	}
	ctx := context.Background()
	rcfg := replication.Config{ConnString: os.Args[1], Slot: os.Args[2], Publications: os.Args[3:]}
	conn, err := replication.Connect(ctx, rcfg)
	check(err)
	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot) // the slot must not exist
	check(err)
	sess, err := snapshot.Open(ctx, snapshot.Config{ConnString: rcfg.ConnString, Publications: rcfg.Publications}, snap)
	check(err)
	stream, err := conn.StartStreaming(ctx) // allowed now: every worker holds the snapshot
	check(err)
	res, err := sess.Run(ctx, printRows)
	check(err)
	check(sess.Close(ctx))
	copies := []*snapshot.Result{res}

	dec := pgvalue.NewDecoder(nil)
	for { // the stream, read only once every copied row is out
		txn, err := stream.Next(ctx)
		check(err)
		for ch, err := range dec.Changes(txn) {
			check(err)
			if ch.Relation == nil {
				fmt.Println(`{"op":"truncate"}`)
				continue
			}
			id := ch.Relation.RelationID
			if !slices.ContainsFunc(copies, func(r *snapshot.Result) bool { return r.Copied(id) }) {
				sync := rcfg
				sync.Slot += "_sync"
				r, err := snapshot.SyncTables(ctx, sync, snapshot.Config{Tables: func(t *snapshot.Table) bool { return t.OID == id }}, printRows)
				check(err)
				copies = append(copies, r)
			}
			if !slices.ContainsFunc(copies, func(r *snapshot.Result) bool { return r.Covers(id, txn.CommitLSN) }) {
				emit(strings.ToLower(ch.Op.String()), ch)
			}
		}
		check(stream.Ack(txn))
	}
}

// printRows prints the rows of a chunk; Run calls it from several goroutines at once.
func printRows(ctx context.Context, c *snapshot.Chunk) error {
	dec := pgvalue.NewDecoder(nil)
	for ch, err := range dec.Changes(c) {
		if err != nil {
			return err
		}
		emit("read", ch) // ch.Op is an Insert: the same code handles copied and streamed rows
	}
	return nil
}

var mu sync.Mutex

// emit writes one line: the operation, the table and the row (the old key for a delete), its
// values in PostgreSQL's text format.
func emit(op string, ch pgvalue.Change) {
	row := ch.New
	if !row.Present() {
		row = ch.Old
	}
	vals := map[string]any{}
	for c := range row.Columns() {
		if !c.Unchanged() && (ch.Op.String() != "Delete" || c.Key) {
			vals[c.Name] = nil
			if !c.Null() {
				vals[c.Name] = string(c.Data)
			}
		}
	}
	b, err := json.Marshal(map[string]any{"op": op, "table": ch.Relation.Namespace + "." + ch.Relation.Name, "row": vals})
	check(err)
	mu.Lock()
	defer mu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
