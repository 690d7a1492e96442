package snapshot_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/snapshot"
)

// TestTruncateDuringCopy: a TRUNCATE of a published table on the source while the copy runs
// waits for the copy, which must finish: no worker may queue behind the TRUNCATE's lock, which
// waits for the first worker's (held until the copy ends), a wait PostgreSQL cannot see as a
// deadlock. The TRUNCATE is queued once the first chunk of t1 is copied, so that chunks of t2
// are still to come on every worker.
func TestTruncateDuringCopy(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		db := pgtest.NewDatabase(t, srv)
		cs := srv.ConnString(db)
		ctx := pgtest.Context(t, 2*time.Minute)
		pgtest.ExecAll(t, cs, `CREATE TABLE t1 (id int PRIMARY KEY, pad text NOT NULL)`,
			`CREATE TABLE t2 (id int PRIMARY KEY, pad text NOT NULL)`,
			`INSERT INTO t1 SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g`,
			`INSERT INTO t2 SELECT g, repeat('y', 200) FROM generate_series(1, 5000) g`,
			`CREATE PUBLICATION pub FOR TABLE t1, t2`)
		_, snap, _ := connectSlot(ctx, t, srv, db, "locks", false, "pub")
		s, err := snapshot.Open(ctx, snapshot.Config{ConnString: cs, Publications: []string{"pub"}, Workers: 2, ChunkSize: 16 << 10}, snap)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)

		truncated := make(chan error, 1)
		var started atomic.Bool
		truncate := func() {
			if started.Swap(true) {
				return
			}
			go func() {
				c, err := pgx.Connect(ctx, cs)
				if err != nil {
					truncated <- err
					return
				}
				defer c.Close(context.Background())
				_, err = c.Exec(ctx, `TRUNCATE t2`)
				truncated <- err
			}()
			// Queued behind the copy's locks before the copy goes on.
			c, err := pgx.Connect(ctx, cs)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close(context.Background())
			waits := pgtest.Until(ctx, func() bool {
				var n int
				err = c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'TRUNCATE t2' AND wait_event_type = 'Lock'`).Scan(&n)
				return err != nil || n > 0
			})
			if err != nil || !waits {
				t.Errorf("the TRUNCATE does not wait for the copy's lock: %v, %v", err, ctx.Err())
			}
		}
		var rows atomic.Int64
		runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err = s.Run(runCtx, func(ctx context.Context, c *snapshot.Chunk) error {
			if c.Table.Name == "t1" {
				truncate()
			}
			for _, err := range c.Changes() {
				if err != nil {
					return err
				}
				rows.Add(1)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("the copy did not finish with a TRUNCATE waiting: %v", err)
		}
		if got := rows.Load(); got != 10000 {
			t.Errorf("copied %d rows, want 10000", got)
		}
		s.Close(ctx)
		if !started.Load() {
			t.Fatal("no chunk of t1 was copied")
		}
		if err := <-truncated; err != nil {
			t.Fatalf("TRUNCATE: %v", err)
		}
	})
}
