package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// addedEnv is a source whose publication holds marker and t_main, with t_late and t_later beside
// them (rows, not published), and the slot; and a target with all four tables, holding what
// t_main held when the slot was created. With copy, the slot is not created, and the target
// tables are empty.
func addedEnv(t *testing.T, major int, copy bool) *env {
	t.Helper()
	srv := pgtest.Shared(t, major)
	return addedEnvWith(t, srv, srv, copy)
}

// addedEnvOn is addedEnv without copy, with the source on src and the target on dst.
func addedEnvOn(t *testing.T, src, dst *pgtest.Server) *env { return addedEnvWith(t, src, dst, false) }

func addedEnvWith(t *testing.T, srv, dstSrv *pgtest.Server, copy bool) *env {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, dstSrv)
	e := &env{srv: srv, src: srv.ConnString(srcDB), dst: dstSrv.ConnString(dstDB), repl: srv.ReplicationConnString(srcDB), slot: "apply"}
	schema := []string{`CREATE TABLE marker (id int PRIMARY KEY)`, `CREATE TABLE t_main (id int PRIMARY KEY, v int NOT NULL)`,
		`CREATE TABLE t_late (id int PRIMARY KEY, v text NOT NULL)`, `CREATE TABLE t_later (id int PRIMARY KEY, v text NOT NULL)`}
	stmts := append(append([]string{}, schema...),
		`INSERT INTO t_late SELECT g, 'r' || g FROM generate_series(1, 3000) g`,
		`INSERT INTO t_later SELECT g, 's' || g FROM generate_series(1, 500) g`,
		`INSERT INTO t_main SELECT g, g FROM generate_series(1, 100) g`,
		`CREATE PUBLICATION pub FOR TABLE marker, t_main`)
	if !copy {
		stmts = append(stmts, `SELECT pg_create_logical_replication_slot('apply', 'pgoutput')`)
		schema = append(schema, `INSERT INTO t_main SELECT g, g FROM generate_series(1, 100) g`)
	}
	must(t, pgtest.Exec(ctx, e.src, stmts...))
	must(t, pgtest.Exec(ctx, e.dst, schema...))
	return e
}

// addedWriter changes t_main, t_late and t_later on the source until stopped: small transactions
// that insert, update and delete, and now and then a large one (streamed at the server's 64kB
// logical_decoding_work_mem) that inserts and then updates a thousand rows of t_late.
type addedWriter struct {
	stop context.CancelFunc
	wg   sync.WaitGroup
	err  error
	mu   sync.Mutex
	n    int // transactions committed
}

func writeAdded(t *testing.T, dsn string, rng *rand.Rand) *addedWriter {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	w := &addedWriter{stop: stop}
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	next := 100000
	must(t, conn.QueryRow(ctx, `SELECT greatest(100000, coalesce(max(id), 0)) FROM t_late`).Scan(&next))
	w.wg.Go(func() {
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if rng.IntN(25) == 0 {
					next += 1000
					if _, err := tx.Exec(ctx, `INSERT INTO t_late SELECT g, repeat('b', 50) FROM generate_series($1::int, $1::int + 999) g`, next); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `UPDATE t_late SET v = v || 'u' WHERE id BETWEEN $1::int AND $1::int + 999`, next)
					return err
				}
				for range 1 + rng.IntN(4) {
					table := []string{"t_late", "t_later"}[rng.IntN(2)]
					id := 1 + rng.IntN(3500)
					var err error
					switch rng.IntN(4) {
					case 0:
						_, err = tx.Exec(ctx, `INSERT INTO t_main VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET v = t_main.v + 1`, id)
					case 1:
						_, err = tx.Exec(ctx, `UPDATE `+table+` SET v = v || 'x' WHERE id = $1`, id)
					case 2:
						_, err = tx.Exec(ctx, `DELETE FROM `+table+` WHERE id = $1`, id)
					default:
						_, err = tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 'i') ON CONFLICT (id) DO UPDATE SET v = 'again'`, id)
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				if ctx.Err() == nil {
					w.err = err
				}
				return
			}
			w.mu.Lock()
			w.n++
			w.mu.Unlock()
		}
	})
	return w
}

// count returns the transactions the writer committed.
func (w *addedWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// waitMore waits until the writer committed n more transactions.
func (w *addedWriter) waitMore(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	want := w.count() + n
	if !pgtest.Until(ctx, func() bool { return w.count() >= want || w.err != nil }) {
		t.Fatalf("the writer did not commit %d more transactions: %v", n, ctx.Err())
	}
}

// halt stops the writer and fails t on its error.
func (w *addedWriter) halt(t *testing.T) {
	t.Helper()
	w.stop()
	w.wg.Wait()
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
}

// waitRecorded waits until the target's tables table records the slot's tables: the tables
// published then are taken to be whole on the target, and a table added later is copied.
func waitRecorded(t *testing.T, ctx context.Context, dst string) {
	waitRecordedSlot(t, ctx, dst, "apply")
}

// waitRecordedSlot is waitRecorded for slot.
func waitRecordedSlot(t *testing.T, ctx context.Context, dst, slot string) {
	t.Helper()
	if !pgtest.Until(ctx, func() bool {
		return pgtest.Count(t, dst, `SELECT count(*) FROM pg_class WHERE relname = 'pgreorder_apply_progress_tables'`) > 0 &&
			pgtest.Count(t, dst, `SELECT count(*) FROM pgreorder_apply_progress_tables WHERE slot = $1 AND relid = 0`, slot) > 0
	}) {
		t.Fatalf("the tables table never recorded the slot's tables: %v", ctx.Err())
	}
}

// eachAddedMode runs body for each server version and mode on its own addedEnv (no copy), with a
// context of three minutes and a seeded generator.
func eachAddedMode(t *testing.T, body func(t *testing.T, ctx context.Context, e *env, mode Mode, rng *rand.Rand)) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Eager, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := addedEnv(t, major, false)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				body(t, ctx, e, mode, seeded(t))
			})
		}
	}
}

// TestTablesAdded: a table added to the publication while apply streams, with a writer changing
// it all along (large streamed transactions included), is copied and then followed: the target
// ends equal to the source, every row once, in each mode; so is a table added while apply is
// stopped. The tables table records both, with the consistent points of their copies.
func TestTablesAdded(t *testing.T) {
	eachAddedMode(t, func(t *testing.T, ctx context.Context, e *env, mode Mode, rng *rand.Rand) {
		cfg := e.config(t, mode)
		r := start(t, cfg)
		waitRecorded(t, ctx, e.dst)
		w := writeAdded(t, e.src, rng)
		w.waitMore(t, ctx, 50)
		must(t, pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_late`))
		w.waitMore(t, ctx, 100)
		// The copy is made by the session that starts after the stream described t_late.
		if !pgtest.Until(ctx, func() bool { return pgtest.Count(t, e.dst, `SELECT count(*) FROM t_late`) > 0 }) {
			t.Fatalf("t_late was never copied (stats %+v)", r.a.Stats())
		}
		w.waitMore(t, ctx, 100)
		w.halt(t)
		must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
		e.waitMarker(t, r, 1)
		e.waitSame(t, "marker", "t_main", "t_late")
		st := r.a.Stats()
		if st.InitialCopyRows == 0 || st.Sessions < 2 {
			t.Errorf("stats %+v: want rows copied, by a second session", st)
		}
		r.halt(t)

		// Added while stopped: the next session copies it before it streams.
		w = writeAdded(t, e.src, rng)
		w.waitMore(t, ctx, 30)
		must(t, pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_later`))
		w.waitMore(t, ctx, 30)
		r = start(t, cfg)
		w.waitMore(t, ctx, 100)
		w.halt(t)
		must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
		e.waitMarker(t, r, 2)
		e.waitSame(t, "marker", "t_main", "t_late", "t_later")
		r.halt(t)
		got := pgtest.QueryText(t, e.dst, `SELECT string_agg(relation || ':' || (synced_lsn IS NOT NULL)::text, ' ' ORDER BY relation)
			FROM pgreorder_apply_progress_tables WHERE slot = 'apply' AND relid <> 0`)
		if want := "public.marker:false public.t_late:true public.t_later:true public.t_main:false"; got != want {
			t.Errorf("tables table: %s, want %s", got, want)
		}
		if n := pgtest.Count(t, e.src, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'apply_sync_%'`); n != 0 {
			t.Errorf("%d temporary slots left", n)
		}
	})
}

// TestTablesAddedIdle: a table added to the publication that no transaction changes is copied
// too: the publication check that lists the published tables ends the session, and the next one
// copies it.
func TestTablesAddedIdle(t *testing.T) {
	for _, copy := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copy), func(t *testing.T) {
			e := addedEnv(t, 18, copy)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cfg := e.config(t, Parallel)
			cfg.Copy = copy
			cfg.hooks = &hooks{publicationCheck: 50 * time.Millisecond}
			r := start(t, cfg)
			waitRecorded(t, ctx, e.dst)
			must(t, pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_later`))
			e.waitSame(t, "t_later")
			must(t, pgtest.Exec(ctx, e.src, `UPDATE t_later SET v = 'changed' WHERE id <= 10`, `INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			e.waitSame(t, "marker", "t_main", "t_later")
			copied := int64(500)
			if copy {
				copied += 100 // t_main's, by the initial copy
			}
			if st := r.a.Stats(); st.InitialCopyRows != copied || st.Sessions < 2 {
				t.Errorf("stats %+v: want %d rows copied, t_later's by a later session", st, copied)
			}
			r.halt(t)
		})
	}
}

// TestTablesAddedStreamOnly: with NewTablesStream a table added to the publication is not
// copied: its changes from then on are applied, and the log says its earlier rows are not
// copied.
func TestTablesAddedStreamOnly(t *testing.T) {
	e := addedEnv(t, 18, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := e.config(t, Buffered)
	cfg.NewTables = changefeed.NewTablesStream
	logs := &pgtest.LockedBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r := start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	e.waitMarker(t, r, 1)
	waitRecorded(t, ctx, e.dst)
	must(t, pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_late`, `INSERT INTO t_late VALUES (5000, 'new')`,
		`UPDATE t_late SET v = 'changed' WHERE id = 7`, `INSERT INTO marker VALUES (2)`))
	e.waitMarker(t, r, 2)
	if got := pgtest.QueryText(t, e.dst, `SELECT string_agg(id || '=' || v, ' ' ORDER BY id) FROM t_late`); got != "5000=new" {
		t.Errorf("t_late on the target: %q, want the inserted row only", got)
	}
	if st := r.a.Stats(); st.InitialCopyRows != 0 || st.Sessions != 1 {
		t.Errorf("stats %+v: want nothing copied, one session", st)
	}
	r.halt(t)
	if !strings.Contains(logs.String(), "its rows from before are not copied") || !strings.Contains(logs.String(), "public.t_late") {
		t.Errorf("the log does not name the table that is not copied:\n%s", logs)
	}
}

// TestTablesAddedNotEmpty: a table added to the publication whose target table holds rows stops
// Run with ErrTargetNotEmpty, naming the table and CopyTruncate; with CopyTruncate it is
// emptied and copied.
func TestTablesAddedNotEmpty(t *testing.T) {
	e := addedEnv(t, 15, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := e.config(t, Buffered)
	r := start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	e.waitMarker(t, r, 1)
	r.halt(t)
	must(t, pgtest.Exec(ctx, e.dst, `INSERT INTO t_late VALUES (1, 'stale'), (99999, 'stale')`))
	must(t, pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_late`))
	err := Run(ctx, cfg)
	if !errors.Is(err, ErrTargetNotEmpty) || !strings.Contains(err.Error(), `"public"."t_late"`) ||
		!strings.Contains(err.Error(), "CopyTruncate") {
		t.Fatalf("Run: %v, want ErrTargetNotEmpty naming t_late and CopyTruncate", err)
	}
	cfg.CopyTruncate = true
	r = start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
	e.waitMarker(t, r, 2)
	e.waitSame(t, "marker", "t_late")
	r.halt(t)
}

// TestTablesAddedKill kills apply (SIGKILL) in the middle of the copy of a table added to the
// publication, its rows partly written in the copy's open transaction, while a writer changes
// the table; the next run copies it again: the target ends equal to the source.
func TestTablesAddedKill(t *testing.T) {
	eachAddedMode(t, func(t *testing.T, ctx context.Context, e *env, mode Mode, rng *rand.Rand) {
		cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: mode, WorkMem: 256 << 10, CopyChunkSize: 16 << 10,
			Stall: "added-chunk", StallAfter: 1}
		first := startChild(t, cc)
		waitRecorded(t, ctx, e.dst)
		w := writeAdded(t, e.src, rng)
		w.waitMore(t, ctx, 30)
		must(t, pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_late`))
		waitStalled(t, ctx, first)
		if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name LIKE 'pgreorder apply % c1' AND backend_xid IS NOT NULL`); n != 1 {
			t.Errorf("%d copy connections with an open transaction that wrote, want 1", n)
		}
		first.kill(t)
		w.waitMore(t, ctx, 50)
		cc.Stall = ""
		startChild(t, cc)
		w.waitMore(t, ctx, 100)
		w.halt(t)
		must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
		waitMarkerCtx(t, ctx, e.dst, 1)
		e.waitSame(t, "marker", "t_main", "t_late")
	})
}

// TestTablesAddedTargetCrash crashes the target (immediate stop) while a table added to the
// publication (a new table of a FOR ALL TABLES publication, written all along) is copied: in the
// middle of the copy's transaction, and right after it committed. Either the copy is lost and made
// again, or it survived, recorded, and is not made again: the target ends equal to the source,
// and the table's rows were copied once after the crash that came after the commit.
func TestTablesAddedTargetCrash(t *testing.T) {
	for _, major := range testMajors {
		for _, stage := range []string{"added-chunk", "added-copied"} {
			t.Run(fmt.Sprintf("pg%d/%s", major, stage), func(t *testing.T) {
				e, dstSrv := crashEnv(t, major, "addcrash", []string{`CREATE TABLE marker (id int PRIMARY KEY)`,
					`CREATE TABLE t_new (id int PRIMARY KEY, v text NOT NULL)`})
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				// t_new exists on the target only: the source's comes once apply follows the slot.
				cfg := e.config(t, Parallel)
				cfg.hooks = &hooks{copyChunkSize: 16 << 10}
				reached, release := make(chan struct{}), make(chan struct{})
				var calls atomic.Int32
				cfg.hooks.stage = func(ctx context.Context, s string, _ txnRef) error {
					if s == stage && calls.Add(1) == 2-boolInt(stage == "added-copied") {
						close(reached)
						select {
						case <-release:
						case <-ctx.Done():
						}
					}
					return nil
				}
				pgtest.ExecAll(t, e.src, `DROP TABLE t_new`)
				r := start(t, cfg)
				waitRecordedSlot(t, ctx, e.dst, "addcrash")
				pgtest.ExecAll(t, e.src, `CREATE TABLE t_new (id int PRIMARY KEY, v text NOT NULL)`,
					`INSERT INTO t_new SELECT g, 'r' || g FROM generate_series(1, 2000) g`)
				wctx, stopWriter := context.WithCancel(ctx)
				written := make(chan error, 1)
				var writes atomic.Int64
				go func() {
					rng := seeded(t)
					for i := 0; wctx.Err() == nil; i++ {
						writes.Add(1)
						id := 1 + rng.IntN(2500)
						err := pgtest.Exec(wctx, e.src, fmt.Sprintf(`INSERT INTO t_new VALUES (%d, 'w%d') ON CONFLICT (id) DO UPDATE SET v = t_new.v || 'u'`, id, i),
							fmt.Sprintf(`DELETE FROM t_new WHERE id = %d`, 1+rng.IntN(2500)))
						if err != nil && wctx.Err() == nil {
							written <- err
							return
						}
					}
					written <- nil
				}()
				select {
				case <-reached:
				case err := <-r.done:
					r.stop = nil
					t.Fatalf("apply stopped: %v", err)
				case <-ctx.Done():
					t.Fatalf("the copy never reached %s (stats %+v)", stage, r.a.Stats())
				}
				dstSrv.Crash()
				must(t, dstSrv.Restart(ctx))
				close(release)
				copiedBefore := r.a.Stats().InitialCopyRows
				after := writes.Load() + 20 // the writer goes on after the restart
				pgtest.Until(ctx, func() bool { return writes.Load() >= after || len(written) > 0 })
				stopWriter()
				must(t, <-written)
				pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (1)`)
				e.waitMarker(t, r, 1)
				e.waitSame(t, "marker", "t_new")
				st := r.a.Stats()
				r.halt(t)
				if stage == "added-copied" && st.InitialCopyRows != copiedBefore {
					t.Errorf("%d rows copied after the crash, %d before: the copy that committed was made again", st.InitialCopyRows, copiedBefore)
				}
				if stage == "added-chunk" && st.InitialCopyRows <= copiedBefore {
					t.Errorf("%d rows copied, %d before the crash: the copy was not made again", st.InitialCopyRows, copiedBefore)
				}
			})
		}
	}
}

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// TestTablesAddedSourceKilled terminates, in the middle of the copy of a table added to the
// publication, the source's backends that serve it (the temporary slot's walsender and the
// copy's connection): the copy fails, and the next session makes it again, from a new snapshot.
func TestTablesAddedSourceKilled(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := addedEnv(t, major, false)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cfg := e.config(t, Eager)
			var calls atomic.Int32
			cfg.hooks = &hooks{copyChunkSize: 16 << 10, stage: func(ctx context.Context, s string, _ txnRef) error {
				if s != "added-chunk" || calls.Add(1) != 2 {
					return nil
				}
				n := pgtest.Count(t, e.src, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE application_name IN ('pgreorder-tablesync', 'pgreorder-copy')`)
				if n != 2 {
					t.Errorf("terminated %d backends, want the walsender and the copy's", n)
				}
				return nil
			}}
			r := start(t, cfg)
			waitRecorded(t, ctx, e.dst)
			w := writeAdded(t, e.src, seeded(t))
			must(t, pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_late`))
			w.waitMore(t, ctx, 50)
			if !pgtest.Until(ctx, func() bool { return calls.Load() > 2 }) {
				t.Fatalf("the copy was not made again (stats %+v)", r.a.Stats())
			}
			w.waitMore(t, ctx, 50)
			w.halt(t)
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			e.waitSame(t, "marker", "t_main", "t_late")
			r.halt(t)
		})
	}
}
