package snapshot_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

func TestConfigErrors(t *testing.T) {
	ctx := context.Background()
	snap := replication.Snapshot{Name: "00000003-00000002-1", Slot: "s"}
	pc, err := pgconn.ParseConfig("host=/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  snapshot.Config
		snap replication.Snapshot
	}{
		{"no connection", snapshot.Config{Publications: []string{"p"}}, snap},
		{"both connections", snapshot.Config{ConnString: "host=x", ConnConfig: pc, Publications: []string{"p"}}, snap},
		{"no publications", snapshot.Config{ConnString: "host=x"}, snap},
		{"empty publication", snapshot.Config{ConnString: "host=x", Publications: []string{""}}, snap},
		{"negative workers", snapshot.Config{ConnString: "host=x", Publications: []string{"p"}, Workers: -1}, snap},
		{"bad connection string", snapshot.Config{ConnString: "host=x port=notaport", Publications: []string{"p"}}, snap},
		{"config not parsed", snapshot.Config{ConnConfig: &pgconn.Config{}, Publications: []string{"p"}}, snap},
		{"no snapshot name", snapshot.Config{ConnString: "host=x", Publications: []string{"p"}}, replication.Snapshot{Slot: "s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := snapshot.Open(ctx, tc.cfg, tc.snap)
			if !errors.Is(err, snapshot.ErrInvalidConfig) || s != nil {
				t.Fatalf("Open = %v, %v; want ErrInvalidConfig", s, err)
			}
			if _, err := snapshot.Copy(ctx, tc.cfg, tc.snap, func(context.Context, *snapshot.Chunk) error { return nil }); !errors.Is(err, snapshot.ErrInvalidConfig) {
				t.Fatalf("Copy = %v; want ErrInvalidConfig", err)
			}
		})
	}
}

// errorsSetup creates a table of 40 pages, a published copy of it, and returns the connection
// string and a function that creates a slot with an exported snapshot.
func errorsSetup(t *testing.T, srv *pgtest.Server) (string, func(ctx context.Context, t *testing.T) (*replication.Conn, replication.Snapshot)) {
	db := pgtest.NewDatabase(t, srv)
	cs := srv.ConnString(db)
	pgtest.ExecAll(t, cs, `CREATE TABLE t (id int PRIMARY KEY, pad text)`,
		`INSERT INTO t SELECT i, repeat('x', 200) FROM generate_series(1, 1200) i`,
		`CREATE PUBLICATION pub FOR TABLE t`)
	n := 0
	return cs, func(ctx context.Context, t *testing.T) (*replication.Conn, replication.Snapshot) {
		n++
		conn, snap, _ := connectSlot(ctx, t, srv, db, fmt.Sprintf("s%d", n), false, "pub")
		return conn, snap
	}
}

func drain(ctx context.Context, c *snapshot.Chunk) error {
	for _, err := range c.Changes() {
		if err != nil {
			return err
		}
	}
	return nil
}

func TestErrors(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		cs, slot := errorsSetup(t, srv)
		cfg := snapshot.Config{ConnString: cs, Publications: []string{"pub"}, Workers: 2, ChunkSize: 64 << 10}
		ctx := pgtest.Context(t, 2*time.Minute)

		t.Run("unknown snapshot", func(t *testing.T) {
			_, err := snapshot.Open(ctx, cfg, replication.Snapshot{Name: "00000003-0000FFFF-1", Slot: "x"})
			if !errors.Is(err, snapshot.ErrSnapshotNotExported) {
				t.Fatalf("Open = %v; want ErrSnapshotNotExported", err)
			}
		})
		t.Run("snapshot ended by StartStreaming", func(t *testing.T) {
			conn, snap := slot(ctx, t)
			s, err := conn.StartStreaming(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			_, err = snapshot.Open(ctx, cfg, snap)
			var pgErr *pgconn.PgError
			if !errors.Is(err, snapshot.ErrSnapshotNotExported) || !errors.As(err, &pgErr) {
				t.Fatalf("Open = %v; want ErrSnapshotNotExported with the server's error", err)
			}
		})
		t.Run("publication changed", func(t *testing.T) {
			_, snap := slot(ctx, t)
			pgtest.ExecAll(t, cs, `CREATE TABLE later (id int PRIMARY KEY)`, `ALTER PUBLICATION pub ADD TABLE later`)
			defer pgtest.ExecAll(t, cs, `DROP TABLE later`)
			if _, err := snapshot.Open(ctx, cfg, snap); !errors.Is(err, snapshot.ErrPublicationChanged) {
				t.Fatalf("Open = %v; want ErrPublicationChanged", err)
			}
		})
		t.Run("publication missing", func(t *testing.T) {
			_, snap := slot(ctx, t)
			c := cfg
			c.Publications = []string{"pub", "nope"}
			if _, err := snapshot.Open(ctx, c, snap); !errors.Is(err, snapshot.ErrPublicationNotFound) || !strings.Contains(err.Error(), `"nope"`) {
				t.Fatalf("Open = %v; want ErrPublicationNotFound naming it", err)
			}
		})
		t.Run("different column lists", func(t *testing.T) {
			pgtest.ExecAll(t, cs, `CREATE TABLE cols (id int PRIMARY KEY, a int, b int)`,
				`CREATE PUBLICATION ca FOR TABLE cols (id, a)`, `CREATE PUBLICATION cb FOR TABLE cols (id, b)`)
			defer pgtest.ExecAll(t, cs, `DROP PUBLICATION ca, cb`, `DROP TABLE cols`)
			_, snap := slot(ctx, t)
			c := cfg
			c.Publications = []string{"ca", "cb"}
			if _, err := snapshot.Open(ctx, c, snap); !errors.Is(err, snapshot.ErrColumnLists) {
				t.Fatalf("Open = %v; want ErrColumnLists", err)
			}
		})

		handlerErr := errors.New("handler failed")
		for _, tc := range []struct {
			name string
			h    snapshot.Handler
			want error
		}{
			{"handler error", func(ctx context.Context, c *snapshot.Chunk) error {
				if err := drain(ctx, c); err != nil {
					return err
				}
				return handlerErr
			}, handlerErr},
			{"handler error mid-chunk", func(ctx context.Context, c *snapshot.Chunk) error {
				for range c.Changes() {
					return handlerErr
				}
				return nil
			}, handlerErr},
			{"chunk not read", func(ctx context.Context, c *snapshot.Chunk) error { return nil }, snapshot.ErrNotConsumed},
			{"loop broken", func(ctx context.Context, c *snapshot.Chunk) error {
				for range c.Changes() {
					break
				}
				return nil
			}, snapshot.ErrNotConsumed},
			{"read twice", func(ctx context.Context, c *snapshot.Chunk) error {
				if err := drain(ctx, c); err != nil {
					return err
				}
				return drain(ctx, c)
			}, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, snap := slot(ctx, t)
				s, err := snapshot.Open(ctx, cfg, snap)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close(ctx)
				_, err = s.Run(ctx, tc.h)
				var ce *snapshot.ChunkError
				if !errors.As(err, &ce) || ce.Table != `"public"."t"` || (tc.want != nil && !errors.Is(err, tc.want)) {
					t.Fatalf("Run = %v; want a *ChunkError wrapping %v", err, tc.want)
				}
				if _, err := s.Run(ctx, drain); !errors.Is(err, snapshot.ErrRunning) {
					t.Fatalf("second Run = %v; want ErrRunning", err)
				}
			})
		}

		t.Run("lifecycle", func(t *testing.T) {
			_, snap := slot(ctx, t)
			s, err := snapshot.Open(ctx, cfg, snap)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Run(ctx, nil); !errors.Is(err, snapshot.ErrInvalidConfig) {
				t.Fatalf("Run(nil) = %v", err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if _, err := s.Run(ctx, drain); !errors.Is(err, snapshot.ErrClosed) {
				t.Fatalf("Run after Close = %v; want ErrClosed", err)
			}
		})
		t.Run("tables filter", func(t *testing.T) {
			pgtest.ExecAll(t, cs, `CREATE TABLE other (id int PRIMARY KEY)`, `INSERT INTO other VALUES (1)`, `ALTER PUBLICATION pub ADD TABLE other`)
			defer pgtest.ExecAll(t, cs, `ALTER PUBLICATION pub DROP TABLE other`, `DROP TABLE other`)
			_, snap := slot(ctx, t)
			c := cfg
			var offered []string
			c.Tables = func(tab *snapshot.Table) bool {
				offered = append(offered, tab.String())
				return tab.Name == "other"
			}
			res, err := snapshot.Copy(ctx, c, snap, drain)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(offered, ",") != "public.other,public.t" || len(res.Tables) != 1 || res.Rows != 1 ||
				!res.Copied(res.Tables[0].OID) {
				t.Fatalf("offered %v, copied %v (%d rows)", offered, res.Tables, res.Rows)
			}
		})
	})
}

// TestCancel: cancelling the context in the middle of a chunk, or closing the Session while its
// Run waits in a handler, stops every worker; Run returns the cancellation and every connection
// is gone.
func TestCancel(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		cs, slot := errorsSetup(t, srv)
		cfg := snapshot.Config{ConnString: cs, Publications: []string{"pub"}, Workers: 3, ChunkSize: 32 << 10,
			BeforeConnect: func(ctx context.Context, c *pgconn.Config) error {
				c.RuntimeParams["application_name"] = "cancel_test"
				return nil
			}}
		ctx := pgtest.Context(t, 2*time.Minute)
		backends := func() string {
			return pgtest.QueryText(t, cs, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cancel_test'`)
		}
		waitGone := func(t *testing.T) {
			t.Helper()
			pgtest.Eventually(t, 10*time.Second, "the copy connections to be gone", func() bool { return backends() == "0" })
		}

		t.Run("context", func(t *testing.T) {
			_, snap := slot(ctx, t)
			s, err := snapshot.Open(ctx, cfg, snap)
			if err != nil {
				t.Fatal(err)
			}
			if n := backends(); n != "3" {
				t.Fatalf("%s connections, want 3", n)
			}
			runCtx, cancel := context.WithCancel(ctx)
			var rows atomic.Int64
			_, err = s.Run(runCtx, func(ctx context.Context, c *snapshot.Chunk) error {
				for _, err := range c.Changes() {
					if err != nil {
						return err
					}
					if rows.Add(1) == 100 {
						cancel()
					}
				}
				return nil
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v; want context.Canceled", err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			waitGone(t)
		})
		t.Run("close", func(t *testing.T) {
			_, snap := slot(ctx, t)
			s, err := snapshot.Open(ctx, cfg, snap)
			if err != nil {
				t.Fatal(err)
			}
			waiting := make(chan struct{}, 3)
			ran := make(chan error, 1)
			var handlers atomic.Int64 // handlers that have not returned
			go func() {
				_, err := s.Run(ctx, func(ctx context.Context, c *snapshot.Chunk) error {
					handlers.Add(1)
					defer handlers.Add(-1)
					for _, err := range c.Changes() {
						if err != nil {
							return err
						}
						waiting <- struct{}{}
						<-ctx.Done() // a handler that waits for its target, until told to stop
						return ctx.Err()
					}
					return nil
				})
				ran <- err
			}()
			<-waiting
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			// Close waits for Run's handlers to return (Run itself returns just after).
			if n := handlers.Load(); n != 0 {
				t.Fatalf("Close returned while %d handlers still ran", n)
			}
			select {
			case err := <-ran:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Run = %v; want context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after Close")
			}
			waitGone(t)
		})
	})
}

// errLost stands for a lost connection: the error that another attempt can cure.
var errLost = errors.New("connection lost")

// TestCauseWins: a chunk's handler fails and, before Run hears of it, its failure cancels the
// work of another chunk (as a store whose chunks share one transaction aborts it when one of
// them fails); that chunk's handler returns the cancellation first. Run returns the failure
// that caused it, not the cancellation, whatever order they came back in; and a failure that
// comes first still wins over the cancellations that the stop of the other workers causes.
func TestCauseWins(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		cs, slot := errorsSetup(t, srv)
		cfg := snapshot.Config{ConnString: cs, Publications: []string{"pub"}, Workers: 2, ChunkSize: 64 << 10}
		ctx := pgtest.Context(t, 2*time.Minute)
		run := func(t *testing.T, h snapshot.Handler) error {
			t.Helper()
			_, snap := slot(ctx, t)
			s, err := snapshot.Open(ctx, cfg, snap)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			if s.Workers() != 2 || len(s.Tables()) != 1 || s.Tables()[0].Chunks < 2 {
				t.Fatalf("%d workers, tables %v: want 2 workers on 2 chunks or more", s.Workers(), s.Tables())
			}
			_, err = s.Run(ctx, h)
			return err
		}
		check := func(t *testing.T, err error) {
			t.Helper()
			var ce *snapshot.ChunkError
			if !errors.As(err, &ce) || !errors.Is(err, errLost) || errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v; want the *ChunkError of the lost connection, not a cancellation", err)
			}
		}

		t.Run("cancellation first", func(t *testing.T) {
			shared, abort := context.WithCancel(ctx) // the chunks' shared work
			defer abort()
			var n atomic.Int64
			check(t, run(t, func(ctx context.Context, c *snapshot.Chunk) error {
				if err := drain(ctx, c); err != nil {
					return err
				}
				switch n.Add(1) {
				case 1:
					// Its connection is lost; it aborts the shared work, and hands its
					// error back only once Run has stopped the copy for the other's.
					abort()
					<-ctx.Done()
					return errLost
				case 2:
					<-shared.Done()
					return context.Cause(shared)
				}
				return ctx.Err()
			}))
		})
		t.Run("stopped without reading", func(t *testing.T) {
			// A handler that returns without reading its chunk when Run is stopped is stopped,
			// not failed: Run returns the cancellation.
			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			var n atomic.Int64
			_, snap := slot(ctx, t)
			s, err := snapshot.Open(ctx, cfg, snap)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			_, err = s.Run(runCtx, func(ctx context.Context, c *snapshot.Chunk) error {
				if n.Add(1) == 2 {
					cancel()
				}
				<-ctx.Done()
				if c.Index%2 == 0 {
					return nil
				}
				return ctx.Err()
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v; want context.Canceled", err)
			}
		})
		t.Run("cause first", func(t *testing.T) {
			var n atomic.Int64
			check(t, run(t, func(ctx context.Context, c *snapshot.Chunk) error {
				if err := drain(ctx, c); err != nil {
					return err
				}
				if n.Add(1) == 1 {
					return errLost
				}
				<-ctx.Done() // stopped by Run for the other's failure
				return ctx.Err()
			}))
		})
	})
}
