package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestApply runs the example in each mode against a source with a large transaction that rolls
// back a savepoint, and checks that the target ends equal to the source.
func TestApply(t *testing.T) {
	for _, major := range []int{15, 18} {
		for _, mode := range []string{"buffered", "eager", "parallel"} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				srv := pgtest.Shared(t, major)
				srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
				src, dst := srv.ConnString(srcDB), srv.ConnString(dstDB)
				const table = `CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)`
				must(t, pgtest.Exec(ctx, src, table, `CREATE PUBLICATION pub FOR TABLE items`,
					`SELECT pg_create_logical_replication_slot('example', 'pgoutput')`))
				must(t, pgtest.Exec(ctx, dst, table))
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() {
					done <- run(runCtx, []string{"-source", src, "-target", dst, "-slot", "example", "-publication", "pub",
						"-mode", mode, "-work-mem", "64kB"}, io.Discard)
				}()
				must(t, pgtest.Exec(ctx, src,
					`BEGIN; INSERT INTO items SELECT g, g, 'n' FROM generate_series(1, 3000) g; SAVEPOINT a;
					 UPDATE items SET qty = 0; ROLLBACK TO a; DELETE FROM items WHERE id % 10 = 0; COMMIT`,
					`UPDATE items SET note = NULL WHERE id < 100`))
				conn, err := pgx.Connect(ctx, dst)
				must(t, err)
				defer conn.Close(context.Background())
				for {
					var n, sum, nulls int
					must(t, conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(qty), 0), count(*) FILTER (WHERE note IS NULL) FROM items`).Scan(&n, &sum, &nulls))
					if n == 2700 && nulls == 90 {
						if want := 3000*3001/2 - 300*301*10/2; sum != want {
							t.Fatalf("sum(qty) = %d, want %d", sum, want)
						}
						break
					}
					select {
					case err := <-done:
						t.Fatalf("stopped: %v", err)
					case <-ctx.Done():
						t.Fatalf("the target has %d rows", n)
					case <-time.After(20 * time.Millisecond):
					}
				}
				stop()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestFlags(t *testing.T) {
	if err := run(context.Background(), []string{"-mode", "fast"}, io.Discard); err == nil {
		t.Fatal("an unknown mode is accepted")
	}
	err := run(context.Background(), []string{"-source", "x"}, io.Discard)
	if !errors.Is(err, apply.ErrInvalidConfig) {
		t.Fatalf("missing flags: %v, want ErrInvalidConfig", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
