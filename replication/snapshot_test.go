package replication_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// TestExportSnapshot: a slot created with an exported snapshot on a Conn. A copy made in that
// snapshot sees the row committed before the slot was created and not the one committed after;
// the stream, started afterwards on the same connection, sends the one after and not the one
// before. Together: every row exactly once.
func TestExportSnapshot(t *testing.T) {
	for _, major := range installedMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			cs := srv.ConnString(db)
			ctx := pgtest.Context(t, time.Minute)
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (1)`)
			cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s", Publications: []string{"pub"}}
			conn, err := replication.Connect(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, ok := conn.Slot(); ok {
				t.Fatal("the slot exists before CreateSlot")
			}
			snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
			if err != nil {
				t.Fatal(err)
			}
			if snap.Name == "" || snap.Slot != "s" || snap.ConsistentPoint == 0 {
				t.Fatalf("snapshot %+v", snap)
			}
			if _, err := conn.CreateSlot(ctx, replication.NoSnapshot); !errors.Is(err, replication.ErrSlotExists) {
				t.Fatalf("second CreateSlot: %v", err)
			}
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (2)`)

			// The initial copy, in the exported snapshot.
			copyConn, err := pgx.Connect(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			defer copyConn.Close(ctx)
			tx, err := copyConn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SET TRANSACTION SNAPSHOT '`+snap.Name+`'`); err != nil {
				t.Fatal(err)
			}
			var copied []int32
			if err := tx.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM pub_t`).Scan(&copied); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if len(copied) != 1 || copied[0] != 1 {
				t.Fatalf("the snapshot sees %v, want [1]", copied)
			}

			s, err := conn.StartStreaming(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			if err := conn.Close(ctx); err != nil {
				t.Fatalf("Close after StartStreaming: %v", err)
			}
			if _, err := conn.StartStreaming(ctx); !errors.Is(err, replication.ErrClosed) {
				t.Fatalf("second StartStreaming: %v", err)
			}
			if p := s.Progress(); p.Start != snap.ConsistentPoint {
				t.Errorf("stream starts at %s, want the consistent point %s", p.Start, snap.ConsistentPoint)
			}
			x := next(ctx, t, s)
			wantTxn(t, x, "", []string{"2"})
			if x.CommitLSN <= snap.ConsistentPoint {
				t.Errorf("commit %s not after the consistent point %s", x.CommitLSN, snap.ConsistentPoint)
			}
			expectNothingBefore(ctx, t, s, cs, 9000) // the copied row is not streamed too
		})
	}
}
