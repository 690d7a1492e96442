package apply

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// newCopyEnv is newEnv without the slot: Copy creates it.
func newCopyEnv(t *testing.T, major int, extraTarget ...string) *env {
	t.Helper()
	e := newEnv(t, major, extraTarget...)
	ctx := pgtest.Context(t, time.Minute)
	must(t, pgtest.Exec(ctx, e.src, `SELECT pg_drop_replication_slot('apply')`))
	return e
}

// preload fills the source before the copy: the mixed workload (marker 1, so every table has
// rows of every kind), and 20,000 more rows in big, copied in many chunks.
func preload(t *testing.T, ctx context.Context, e *env, rng *rand.Rand) {
	t.Helper()
	must(t, workload(ctx, e.src, rng, 1, nil))
	must(t, pgtest.Exec(ctx, e.src,
		`INSERT INTO big SELECT g, -3, md5(g::text) || repeat('p', 200) FROM generate_series(5000001, 5020000) g`,
		`INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, 20) g`))
}

// writer changes the source from the copy's chunk hook: updates, deletes and inserts spread
// over big's pages (rows in chunks copied already and in chunks not copied yet), the keyless
// events table and items. Each call commits before the chunk is read, after the snapshot.
type writer struct {
	mu    sync.Mutex
	conn  *pgx.Conn
	calls int
}

func newWriter(t *testing.T, dsn string) *writer {
	ctx := pgtest.Context(t, time.Minute)
	c, err := pgx.Connect(ctx, dsn)
	must(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return &writer{conn: c}
}

func (w *writer) write(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.calls >= 8 {
		return nil
	}
	w.calls++
	i := w.calls
	for _, sql := range []string{
		fmt.Sprintf(`UPDATE big SET payload = 'during %d' WHERE id > 5000000 AND id %% 61 = %d`, i, i),
		fmt.Sprintf(`DELETE FROM big WHERE id > 5000000 AND id %% 89 = %d`, i),
		fmt.Sprintf(`INSERT INTO big SELECT g, %d, 'new' FROM generate_series(%d, %d) g`, 100+i, 6000000+i*100, 6000000+i*100+49),
		fmt.Sprintf(`INSERT INTO events VALUES ('during', %d), ('during', %d)`, i, i),
		fmt.Sprintf(`UPDATE items SET qty = qty + 1, note = 'during %d' WHERE id %% 5 = %d`, i, i%5),
		fmt.Sprintf(`BEGIN; DELETE FROM dup WHERE ctid = (SELECT ctid FROM dup LIMIT 1); INSERT INTO dup VALUES (%d, 'd'); COMMIT`, i),
	} {
		if _, err := w.conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// waitProgress waits until the target has the slot's progress row (the copy is complete), or
// the applier stops.
func (e *env) waitProgress(t *testing.T, r *running) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	defer conn.Close(context.Background())
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pgreorder_apply_progress WHERE slot = $1`, e.slot).Scan(&n)
		if err == nil && n > 0 {
			return
		}
		select {
		case err := <-r.done:
			r.stop = nil
			t.Fatalf("apply stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("timed out waiting for the copy (stats %+v)", r.a.Stats())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (e *env) slotExists(t testing.TB) bool {
	return pgtest.Count(t, e.src, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.slot) > 0
}

// TestCopy copies a source with data into an empty target in each mode while the source changes
// (a writer in the copy's chunk hook, so that its changes land between the snapshot and the rows
// they touch being read, and concurrent clients throughout), then streams the mixed workload,
// and checks that the target equals the source: a change both copied and streamed would
// duplicate a keyless row or break a key, one neither copied nor streamed would be missing, and
// either would show as a conflict.
func TestCopy(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Eager, Parallel} {
			bin := mode == Eager
			name := fmt.Sprintf("pg%d/%s/text", major, mode)
			if bin {
				name = fmt.Sprintf("pg%d/%s/binary", major, mode)
			}
			t.Run(name, func(t *testing.T) {
				e := newCopyEnv(t, major)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				rng := seeded(t)
				preload(t, ctx, e, rng)
				w := newWriter(t, e.src)
				cfg := e.config(t, mode)
				cfg.Copy, cfg.CopyWorkers, cfg.Source.Binary = true, 3, bin
				cfg.hooks = &hooks{copyChunkSize: 256 << 10, stage: func(ctx context.Context, stage string, x txnRef) error {
					if stage == "copy-chunk" {
						return w.write(ctx)
					}
					return nil
				}}
				done := make(chan error, 1)
				go func() { done <- concurrent(ctx, e.src, rand.New(rand.NewPCG(rng.Uint64(), 2)), 2, 150) }()
				r := start(t, cfg)
				e.waitProgress(t, r)
				must(t, <-done)
				must(t, workload(ctx, e.src, rng, 2, nil))
				e.waitMarker(t, r, 2)
				r.halt(t)
				e.compare(t)

				st := r.a.Stats()
				t.Logf("stats %+v", st)
				if st.UpdateMissing != 0 || st.DeleteMissing != 0 {
					t.Errorf("conflicts: %d updates and %d deletes found no row", st.UpdateMissing, st.DeleteMissing)
				}
				if w.calls < 8 {
					t.Errorf("the source changed during %d chunks, want 8 (too few chunks?)", w.calls)
				}
				if st.InitialCopyRows < 20000 {
					t.Errorf("the initial copy wrote %d rows, want 20,000 at least", st.InitialCopyRows)
				}
				if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pgreorder_apply_progress_copy`); n != 0 {
					t.Errorf("the copy table holds %d rows after the copy", n)
				}
				if st.Sessions != 1 {
					t.Errorf("%d sessions, want 1", st.Sessions)
				}
			})
		}
	}
}

// TestCopyKill kills the applier (SIGKILL, in a process of its own) in the middle of the copy,
// with some chunks committed on the target and others not, and once every chunk has committed
// but before the progress row; the next run must discard the copy (slot and rows) and make it
// again, and the target end equal to the source.
func TestCopyKill(t *testing.T) {
	points := []struct {
		name       string
		stall      string
		stallAfter int32
	}{
		{"mid-copy", "copy-chunk", 4},
		{"before-progress", "copy-done", 0},
	}
	for _, major := range testMajors {
		for _, p := range points {
			t.Run(fmt.Sprintf("pg%d/%s", major, p.name), func(t *testing.T) {
				e := newCopyEnv(t, major)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				rng := seeded(t)
				preload(t, ctx, e, rng)
				cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Eager, WorkMem: 256 << 10,
					Copy: true, CopyChunkSize: 128 << 10, Stall: p.stall, StallAfter: p.stallAfter}
				first := startChild(t, cc)
				for !strings.Contains(first.stderr.String(), "stalled at "+p.stall) ||
					pgtest.Count(t, e.dst, `SELECT count(*) FROM big`) == 0 {
					select {
					case err := <-first.done:
						first.done <- err
						t.Fatalf("the child stopped: %v\n%s", err, first.stderr)
					case <-ctx.Done():
						t.Fatalf("the child did not stall with rows on the target:\n%s", first.stderr)
					case <-time.After(20 * time.Millisecond):
					}
				}
				copied := pgtest.Count(t, e.dst, `SELECT count(*) FROM big`)
				all := pgtest.Count(t, e.src, `SELECT count(*) FROM big`)
				t.Logf("killed with %d of %d rows of big on the target", copied, all)
				if p.stall == "copy-done" && copied != all {
					t.Errorf("every chunk committed, but the target has %d rows of big, the source %d", copied, all)
				}
				first.kill(t)
				if !e.slotExists(t) {
					t.Fatal("the slot does not exist after the kill")
				}
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO events VALUES ('between', 1)`, `UPDATE big SET payload = 'between' WHERE id % 7 = 0`))
				cc.Stall = ""
				second := startChild(t, cc)
				// The copy commits its chunks one by one: wait until it committed whole, before
				// the workload, whose marker could otherwise be copied (and seen) ahead of rows
				// other chunks have yet to commit.
				for !strings.Contains(second.stderr.String(), "initial copy complete") {
					select {
					case err := <-second.done:
						second.done <- err // for the cleanup
						t.Fatalf("the second child stopped: %v\n%s", err, second.stderr)
					case <-ctx.Done():
						t.Fatalf("the second child did not finish the copy:\n%s", second.stderr)
					case <-time.After(20 * time.Millisecond):
					}
				}
				must(t, workload(ctx, e.src, rng, 2, nil))
				for pgtest.Count(t, e.dst, `SELECT count(*) FROM marker WHERE id = 2`) == 0 {
					select {
					case err := <-second.done:
						second.done <- err // for the cleanup
						t.Fatalf("the second child stopped: %v", err)
					case <-ctx.Done():
						t.Fatal("timed out waiting for marker 2")
					case <-time.After(20 * time.Millisecond):
					}
				}
				e.compare(t)
				if !strings.Contains(second.stderr.String(), "an earlier initial copy did not finish") {
					t.Errorf("the second run did not start the copy over:\n%s", second.stderr)
				}
			})
		}
	}
}

// TestCopyPreconditions: a target table with rows stops the copy (and leaves no slot behind)
// unless CopyTruncate is set; a slot the copy did not make, and a missing target table, stop it
// too.
func TestCopyPreconditions(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d/not-empty", major), func(t *testing.T) {
			e := newCopyEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			must(t, workload(ctx, e.src, seeded(t), 1, nil))
			must(t, pgtest.Exec(ctx, e.dst, `INSERT INTO items VALUES (1, 1, 'stale')`, `INSERT INTO events VALUES ('stale', 1)`))
			cfg := e.config(t, Buffered)
			cfg.Copy = true
			err := Run(ctx, cfg)
			if !errors.Is(err, ErrTargetNotEmpty) {
				t.Fatalf("Run: %v, want ErrTargetNotEmpty", err)
			}
			if !strings.Contains(err.Error(), `"public"."items"`) || !strings.Contains(err.Error(), `"public"."events"`) {
				t.Errorf("the error does not name the tables: %v", err)
			}
			if e.slotExists(t) {
				t.Error("the slot was left behind")
			}
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM items`); n != 1 {
				t.Errorf("the target's items has %d rows, want its own 1", n)
			}
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pgreorder_apply_progress_copy`); n != 0 {
				t.Errorf("the copy table holds %d rows", n)
			}

			cfg.CopyTruncate = true
			r := start(t, cfg)
			e.waitProgress(t, r)
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
			e.waitMarker(t, r, 2)
			r.halt(t)
			e.compare(t)
			// The copy's rows are counted apart from the inserts streamed (the marker).
			if st := r.a.Stats(); st.InitialCopyRows == 0 || st.Inserts != 1 {
				t.Errorf("%d rows copied and %d inserts, want the copy's rows and the marker's insert", st.InitialCopyRows, st.Inserts)
			}
		})
		t.Run(fmt.Sprintf("pg%d/foreign-slot", major), func(t *testing.T) {
			e := newEnv(t, major) // with a slot the copy did not make
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cfg := e.config(t, Buffered)
			cfg.Copy = true
			if err := Run(ctx, cfg); !errors.Is(err, ErrCopySlotExists) {
				t.Fatalf("Run: %v, want ErrCopySlotExists", err)
			}
			if !e.slotExists(t) {
				t.Error("the slot was dropped")
			}
		})
		t.Run(fmt.Sprintf("pg%d/missing-table", major), func(t *testing.T) {
			e := newCopyEnv(t, major, `DROP TABLE typed`)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO typed (id) VALUES (1)`))
			cfg := e.config(t, Buffered)
			cfg.Copy = true
			err := Run(ctx, cfg)
			if !errors.Is(err, ErrMissingTable) || !strings.Contains(err.Error(), `"public"."typed"`) {
				t.Fatalf("Run: %v, want ErrMissingTable naming typed", err)
			}
			if e.slotExists(t) {
				t.Error("the slot was left behind")
			}
		})
	}
}

// TestCopyRetry terminates the copy's connections in the middle of the copy, on the target or
// on the source: the session fails, discards the copy, and the next session makes it again.
func TestCopyRetry(t *testing.T) {
	sides := []struct {
		name string
		dsn  func(e *env) string
		cond string
	}{
		{"target", func(e *env) string { return e.dst }, `application_name LIKE 'pgreorder apply % c%'`},
		{"source", func(e *env) string { return e.src }, `application_name = 'pgreorder-copy'`},
	}
	for _, major := range testMajors {
		for _, side := range sides {
			t.Run(fmt.Sprintf("pg%d/%s", major, side.name), func(t *testing.T) {
				e := newCopyEnv(t, major)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				rng := seeded(t)
				preload(t, ctx, e, rng)
				killer := newTerminator(t, side.dsn(e))
				var (
					mu       sync.Mutex
					chunks   int
					killed   int
					killFail bool
				)
				cfg := e.config(t, Parallel)
				cfg.Copy, cfg.CopyWorkers = true, 2
				cfg.hooks = &hooks{copyChunkSize: 256 << 10, stage: func(ctx context.Context, stage string, x txnRef) error {
					if stage != "copy-chunk" {
						return nil
					}
					mu.Lock()
					defer mu.Unlock()
					if chunks++; chunks >= 5 && killed == 0 && !killFail {
						// Not on the copy's context: another worker's failure may end it while
						// the query runs, and a query cut short closes the terminator's
						// connection for every later attempt.
						kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
						defer cancel()
						n, err := killer.kill(kctx, side.cond)
						killed = n
						if err != nil {
							killFail = true // reported below as no connection terminated
							t.Logf("terminating the copy's connections: %v", err)
						}
					}
					return nil
				}}
				r := start(t, cfg)
				e.waitProgress(t, r)
				must(t, workload(ctx, e.src, rng, 2, nil))
				e.waitMarker(t, r, 2)
				r.halt(t)
				e.compare(t)
				st := r.a.Stats()
				if killed == 0 {
					t.Error("no connection was terminated")
				}
				if st.Sessions < 2 {
					t.Errorf("%d sessions: the copy was not made again", st.Sessions)
				}
				if st.UpdateMissing != 0 || st.DeleteMissing != 0 {
					t.Errorf("conflicts: %d updates and %d deletes found no row", st.UpdateMissing, st.DeleteMissing)
				}
			})
		}
	}
}
