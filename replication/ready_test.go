package replication_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// TestReady: Ready is false while nothing is there, becomes true once a committed transaction's
// messages arrived (without Next), and Next then returns it at once; after the last one Ready is
// false again, and false after Close.
func TestReady(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, TemporarySlot: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		if s.Ready() {
			t.Fatal("Ready with nothing committed")
		}
		if err := pgtest.Exec(ctx, srv.ConnString(db), `INSERT INTO pub_t VALUES (1)`, `INSERT INTO pub_t VALUES (2)`); err != nil {
			t.Fatal(err)
		}
		for !s.Ready() {
			if ctx.Err() != nil {
				t.Fatal("never ready")
			}
		}
		for range 2 {
			// Both are there (or on their way: Ready waits for them no longer than it takes).
			nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
			x, err := s.Next(nctx)
			ncancel()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Ack(x); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if s.Ready() {
			t.Fatal("Ready after the last transaction")
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Ready took %v while idle", d)
		}
		s.Close(ctx)
		if s.Ready() {
			t.Fatal("Ready after Close")
		}
	})
}
