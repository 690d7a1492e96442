package apply

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// TestTombstonesBounded deletes rows locally on the target without pause: the tombstones stay
// within the retention, the purge removes the rest; an apply lag over the retention stops the
// recording, and it resumes once the lag is back under it.
func TestTombstonesBounded(t *testing.T) {
	srv := conflictServer(t, testMajors[len(testMajors)-1])
	e := conflictEnv(t, srv)
	var log pgtest.LockedBuffer
	cfg := e.conflictConfig(t, &log, nil)
	cfg.Conflicts.Retention = 300 * time.Millisecond
	// The Applier's clock, ahead of the servers' by skew: an apply lag without waiting for one.
	// Until then it is a minute behind, so that no real lag (a loaded machine) crosses the
	// retention and stops the recording.
	var skew atomic.Int64
	skew.Store(int64(-time.Minute))
	cfg.hooks = &hooks{now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }}
	dropOrigins(t, e.dst, cfg.Origin)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(log.String())
		}
	})
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (1, 1, 'x')`, `INSERT INTO marker VALUES (1)`)
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	waitTrigger(t, e.dst)

	ctx := pgtest.Context(t, time.Minute)
	c, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	defer c.Close(context.Background())
	var deleted, most int64
	for i := range 150 {
		base := 1000 + i*100
		_, err := c.Exec(ctx, `INSERT INTO kv SELECT g, g, 'l' FROM generate_series($1::int, $1::int + 99) g`, base)
		must(t, err)
		tag, err := c.Exec(ctx, `DELETE FROM kv WHERE id >= $1`, base)
		must(t, err)
		deleted += tag.RowsAffected()
		if i%10 == 0 {
			var n int64
			must(t, c.QueryRow(ctx, `SELECT count(*) FROM pgreorder_tombstones`).Scan(&n))
			most = max(most, n)
		}
		// Not a wait for anything: the deletions are spread over ~2s, several retention periods,
		// so that purges run while tombstones are being written.
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("deleted %d rows, at most %d tombstones", deleted, most)
	if most == 0 || most > deleted/2 {
		t.Errorf("at most %d tombstones for %d deletions over ~2s with a retention of 300ms", most, deleted)
	}
	pgtest.Eventually(t, time.Minute, "the tombstones purged", func() bool {
		return pgtest.Count(t, e.dst, `SELECT count(*) FROM pgreorder_tombstones`) == 0
	})
	if st := r.a.Stats(); st.TombstonesPurged < deleted/2 || !st.RetentionActive {
		t.Errorf("stats %+v: want most of %d tombstones purged, retention active", st, deleted)
	}

	// A lag over the retention: the source's transactions reach the Applier a second after
	// their commit, by its clock.
	skew.Store(int64(time.Second))
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (2, 2, 'late')`, `INSERT INTO marker VALUES (2)`)
	e.waitMarker(t, r, 2)
	pgtest.Eventually(t, time.Minute, "retention stopped", func() bool { return r.a.Stats().RetentionStops == 1 && !r.a.Stats().RetentionActive })
	// The trigger no longer records: the deletion's transaction would have written the tombstone.
	pgtest.ExecAll(t, e.dst, `INSERT INTO kv VALUES (100, 100, 'l')`, `DELETE FROM kv WHERE id = 100`)
	skew.Store(int64(-time.Minute))
	if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pgreorder_tombstones`); n != 0 {
		t.Errorf("%d tombstones recorded while retention is stopped", n)
	}
	pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (3)`)
	e.waitMarker(t, r, 3)
	pgtest.Eventually(t, time.Minute, "retention resumed", func() bool { return r.a.Stats().RetentionActive })
	pgtest.ExecAll(t, e.dst, `INSERT INTO kv VALUES (100, 100, 'l')`, `DELETE FROM kv WHERE id = 100`)
	if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pgreorder_tombstones`); n != 1 {
		t.Errorf("%d tombstones after a deletion with retention resumed, want 1", n)
	}
	for _, w := range []string{"apply lag exceeds the conflict retention", "deletions are recorded again"} {
		if !strings.Contains(log.String(), w) {
			t.Errorf("log lacks %q", w)
		}
	}
}

// biEnv is two databases replicating to each other: a and b, each with a publication of every
// table and a slot for the other, and the Appliers' configurations (origin = none: no loops).
type biEnv struct {
	a, b       string // connection strings
	atob, btoa Config
}

func newBiEnv(t *testing.T, srv *pgtest.Server, log *pgtest.LockedBuffer, schema []string, res map[conflict.Type]conflict.Resolution) *biEnv {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	dbA, dbB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	be := &biEnv{a: srv.ConnString(dbA), b: srv.ConnString(dbB)}
	for _, db := range []string{dbA, dbB} {
		must(t, pgtest.Exec(ctx, srv.ConnString(db), append(append([]string{}, schema...),
			`CREATE PUBLICATION pub FOR ALL TABLES`,
			`SELECT pg_create_logical_replication_slot('bi_`+db+`', 'pgoutput')`)...))
	}
	mk := func(src, dst, srcDB, dstDB, name string) Config {
		return Config{
			Source:    replication.Config{ConnString: srv.ReplicationConnString(srcDB), Slot: "bi_" + srcDB, Publications: []string{"pub"}, StatusInterval: 100 * time.Millisecond, OriginFilter: replication.OriginFilterNone},
			Target:    srv.ConnString(dstDB),
			Origin:    "pgr_" + name + "_" + dstDB,
			Conflicts: conflict.Config{Resolutions: res},
			Logger:    slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})).With("dir", name),
		}
	}
	be.atob = mk(be.a, be.b, dbA, dbB, "atob")
	be.btoa = mk(be.b, be.a, dbB, dbA, "btoa")
	dropOrigins(t, be.b, be.atob.Origin)
	dropOrigins(t, be.a, be.btoa.Origin)
	return be
}

// waitMarkers inserts marker id on both sides and waits until both sides have both.
func (be *biEnv) waitMarkers(t *testing.T, id int) {
	t.Helper()
	pgtest.ExecAll(t, be.a, fmt.Sprintf(`INSERT INTO marker VALUES (%d)`, id))
	pgtest.ExecAll(t, be.b, fmt.Sprintf(`INSERT INTO marker VALUES (%d)`, id+1))
	q := fmt.Sprintf(`SELECT count(*) FROM marker WHERE id IN (%d, %d)`, id, id+1)
	pgtest.Eventually(t, time.Minute, "markers on both sides", func() bool { return pgtest.Count(t, be.a, q) == 2 && pgtest.Count(t, be.b, q) == 2 })
}

// TestBidirectional replicates two databases into each other with origin = none: every change
// reaches the other side once, none comes back.
func TestBidirectional(t *testing.T) {
	srv := conflictServer(t, testMajors[len(testMajors)-1]) // origin = none: 16+
	var log pgtest.LockedBuffer
	be := newBiEnv(t, srv, &log, conflictSchema, nil)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(log.String())
		}
	})
	ra, rb := start(t, be.atob), start(t, be.btoa)
	for i := range 20 {
		pgtest.ExecAll(t, be.a, fmt.Sprintf(`INSERT INTO kv VALUES (%d, %d, 'a')`, i, i))
		pgtest.ExecAll(t, be.b, fmt.Sprintf(`INSERT INTO kv VALUES (%d, %d, 'b')`, 1000+i, 1000+i))
	}
	pgtest.ExecAll(t, be.a, `UPDATE kv SET v = 'a2' WHERE id < 10`)
	pgtest.ExecAll(t, be.b, `DELETE FROM kv WHERE id >= 1010`)
	be.waitMarkers(t, 1)
	// A loop would send the changes back: a second round of markers, committed after whatever
	// either side sent back of the first, reaches the other side only after that did.
	be.waitMarkers(t, 3)
	if ga, gb := rowsOf(t, be.a), rowsOf(t, be.b); ga != gb {
		t.Fatalf("a has %q, b %q", ga, gb)
	}
	if n := pgtest.Count(t, be.a, `SELECT count(*) FROM kv`); n != 30 {
		t.Errorf("%d rows, want 30", n)
	}
	// Each Applier applied the other side's own transactions only: 20 inserts, one update or
	// delete, two markers (counted in commit order: a transaction sent back would be counted
	// before the second marker).
	for name, r := range map[string]*running{"a to b": ra, "b to a": rb} {
		pgtest.Eventually(t, time.Minute, name+" counted the second marker", func() bool { return r.a.Stats().Txns >= 23 })
		st := r.a.Stats()
		if st.Txns != 23 {
			t.Errorf("%s applied %d transactions, want 23 (stats %+v)", name, st.Txns, st)
		}
		for _, ct := range conflict.Types() {
			if st.Conflicts(ct) != 0 {
				t.Errorf("%s: %d %s conflicts", name, st.Conflicts(ct), ct)
			}
		}
	}
}

// TestLastUpdateWinsConverges runs random writers on both sides of a bidirectional pair, on
// the same keys, with last_update_wins: both sides end with the same rows, in every mode.
func TestLastUpdateWinsConverges(t *testing.T) {
	srv := conflictServer(t, testMajors[len(testMajors)-1])
	for _, mode := range []Mode{Buffered, Eager, Parallel} {
		t.Run(mode.String(), func(t *testing.T) { testLastUpdateWinsConverges(t, srv, mode) })
	}
}

func testLastUpdateWinsConverges(t *testing.T, srv *pgtest.Server, mode Mode) {
	var log pgtest.LockedBuffer
	lww := map[conflict.Type]conflict.Resolution{}
	for _, ct := range conflict.Types() {
		lww[ct] = conflict.LastUpdateWins
	}
	be := newBiEnv(t, srv, &log, conflictSchema, lww)
	be.atob.Mode, be.btoa.Mode = mode, mode
	ra, rb := start(t, be.atob), start(t, be.btoa)
	rng := seeded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conns := map[string]*pgx.Conn{}
	for name, dsn := range map[string]string{"a": be.a, "b": be.b} {
		c, err := pgx.Connect(ctx, dsn)
		must(t, err)
		defer c.Close(context.Background())
		conns[name] = c
	}
	for i := range 400 {
		side := []string{"a", "b"}[rng.IntN(2)]
		id := rng.IntN(20)
		_, err := conns[side].Exec(ctx, `INSERT INTO kv VALUES ($1, NULL, $2) ON CONFLICT (id) DO UPDATE SET v = excluded.v`,
			id, fmt.Sprintf("%s%d", side, i))
		must(t, err)
		if rng.IntN(8) == 0 {
			// Not a wait for anything: random gaps vary how the two sides' writes interleave.
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	}
	be.waitMarkers(t, 1)
	be.waitMarkers(t, 3)
	ga, gb := rowsOf(t, be.a), rowsOf(t, be.b)
	if ga != gb {
		t.Errorf("not converged:\na %s\nb %s", ga, gb)
	}
	sa, sb := ra.a.Stats(), rb.a.Stats()
	t.Logf("conflicts a to b: %d insert_exists, %d update_origin_differs; b to a: %d, %d",
		sa.InsertExists, sa.UpdateOriginDiffers, sb.InsertExists, sb.UpdateOriginDiffers)
	if t.Failed() {
		t.Log(log.String())
	}
}

// TestDetectionRoundTrips checks that detection costs no round trip when nothing conflicts:
// each small transaction is still sent with its commit in one (an update that sets a column of
// a secondary unique index ends its batch, after a savepoint: not here).
func TestDetectionRoundTrips(t *testing.T) {
	srv := conflictServer(t, testMajors[len(testMajors)-1])
	e := conflictEnv(t, srv)
	var log pgtest.LockedBuffer
	cfg := e.conflictConfig(t, &log, nil)
	dropOrigins(t, e.dst, cfg.Origin)
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (1, 1, 'x'), (2, 2, 'y')`, `INSERT INTO marker VALUES (1)`)
	pgtest.ExecAll(t, e.src, `ALTER TABLE kv DROP CONSTRAINT kv_u_key`)
	pgtest.ExecAll(t, e.dst, `ALTER TABLE kv DROP CONSTRAINT kv_u_key`)
	first := start(t, cfg)
	e.waitMarker(t, first, 1)
	first.halt(t)
	var stmts []string
	for i := range 50 {
		stmts = append(stmts, fmt.Sprintf(`BEGIN; UPDATE kv SET v = 'v%d' WHERE id = 1; DELETE FROM kv WHERE id = 2; INSERT INTO kv VALUES (2, 2, 'y'); COMMIT`, i))
	}
	pgtest.ExecAll(t, e.src, append(stmts, `INSERT INTO marker VALUES (2)`)...)
	// A second Applier finds them waiting: they are applied in groups (up to 1024 transactions a
	// round trip), and a check that took a round trip of its own would show as one per
	// transaction. It counts from zero (its counters are updated just after a commit returns,
	// when the marker may already be visible).
	r := start(t, cfg)
	e.waitMarker(t, r, 2)
	pgtest.Eventually(t, time.Minute, "51 transactions counted", func() bool { return r.a.Stats().Txns >= 51 })
	after := r.a.Stats()
	txns, trips := after.Txns, after.RoundTrips
	// Group commit adds a synchronous empty transaction now and then (see Config.SynchronousCommit).
	if txns != 51 || trips > 10 {
		t.Errorf("%d transactions took %d round trips, want a few for the whole backlog", txns, trips)
	}
	for _, ct := range conflict.Types() {
		if n := after.Conflicts(ct); n != 0 {
			t.Errorf("%d %s conflicts", n, ct)
		}
	}
}

// TestLastUpdateWinsLocalRace has a local transaction on the target change the row of a
// conflict after the Applier found the conflict and before it looked the row up: the Applier
// waits for it, and last_update_wins compares the source's change with the row that transaction
// leaves, not with the one before it. (Looked up unlocked, the older row would lose to the
// source's change, whose UPDATE or DELETE would then wait for the local transaction and undo its
// newer change.) When the local transaction rolls back instead, the source's change wins.
func TestLastUpdateWinsLocalRace(t *testing.T) {
	seed := `INSERT INTO kv VALUES (1, 10, 'a'), (2, 20, 'b')`
	cases := []struct {
		name           string
		ct             conflict.Type
		local1, local2 string // on the target: before the source's change, and in the race
		remote         string
		rollback       bool
		want           string
	}{
		{"update_origin_differs", conflict.UpdateOriginDiffers, `UPDATE kv SET v = 'local1' WHERE id = 2`, `UPDATE kv SET v = 'local2' WHERE id = 2`,
			`UPDATE kv SET v = 'remote' WHERE id = 2`, false, "1,10,a 2,20,local2"},
		{"update_origin_differs/rollback", conflict.UpdateOriginDiffers, `UPDATE kv SET v = 'local1' WHERE id = 2`, `UPDATE kv SET v = 'local2' WHERE id = 2`,
			`UPDATE kv SET v = 'remote' WHERE id = 2`, true, "1,10,a 2,20,remote"},
		{"delete_origin_differs", conflict.DeleteOriginDiffers, `UPDATE kv SET v = 'local1' WHERE id = 2`, `UPDATE kv SET v = 'local2' WHERE id = 2`,
			`DELETE FROM kv WHERE id = 2`, false, "1,10,a 2,20,local2"},
		{"delete_origin_differs/rollback", conflict.DeleteOriginDiffers, `UPDATE kv SET v = 'local1' WHERE id = 2`, `UPDATE kv SET v = 'local2' WHERE id = 2`,
			`DELETE FROM kv WHERE id = 2`, true, "1,10,a"},
		{"insert_exists", conflict.InsertExists, `INSERT INTO kv VALUES (3, 30, 'local1')`, `UPDATE kv SET v = 'local2' WHERE id = 3`,
			`INSERT INTO kv VALUES (3, 31, 'remote')`, false, "1,10,a 2,20,b 3,30,local2"},
		{"insert_exists/rollback", conflict.InsertExists, `INSERT INTO kv VALUES (3, 30, 'local1')`, `UPDATE kv SET v = 'local2' WHERE id = 3`,
			`INSERT INTO kv VALUES (3, 31, 'remote')`, true, "1,10,a 2,20,b 3,31,remote"},
	}
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := conflictServer(t, major)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					e := conflictEnv(t, srv)
					cfg, _ := e.loggedConfig(t, map[conflict.Type]conflict.Resolution{c.ct: conflict.LastUpdateWins})
					cfg.Mode, cfg.Workers, cfg.runTxns = Parallel, 2, 1 // the workers' connections call the "conflict" hook
					ctx := pgtest.Context(t, time.Minute)
					lock, err := pgx.Connect(ctx, e.dst)
					must(t, err)
					defer lock.Close(context.Background())
					watch, err := pgx.Connect(ctx, e.dst) // the goroutine's, while lock's transaction is open
					must(t, err)
					defer watch.Close(context.Background())
					var armed atomic.Bool
					raced := make(chan error, 1)
					cfg.hooks = &hooks{stage: func(hctx context.Context, stage string, x txnRef) error {
						if stage != "conflict" || !armed.CompareAndSwap(true, false) {
							return nil
						}
						// The local transaction takes the row, and ends once the Applier waits for it.
						tx, err := lock.Begin(hctx)
						if err == nil {
							_, err = tx.Exec(hctx, c.local2)
						}
						if err != nil {
							return err
						}
						go func() {
							raced <- func() error {
								for {
									var n int
									err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
										WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
									if err != nil {
										return err
									}
									if n > 0 {
										break
									}
									select {
									case <-ctx.Done():
										return fmt.Errorf("the Applier never waited for the local transaction: %w", ctx.Err())
									case <-time.After(10 * time.Millisecond):
									}
								}
								if c.rollback {
									return tx.Rollback(ctx)
								}
								return tx.Commit(ctx)
							}()
						}()
						return nil
					}}
					pgtest.ExecAll(t, e.src, seed, `INSERT INTO marker VALUES (1)`)
					r := start(t, cfg)
					e.waitMarker(t, r, 1)
					pgtest.ExecAll(t, e.dst, c.local1)
					pgtest.ClockPast(t, e.dst) // the remote commit's timestamp is the later one
					armed.Store(true)
					pgtest.ExecAll(t, e.src, c.remote, `INSERT INTO marker VALUES (2)`)
					select {
					case err := <-raced:
						must(t, err)
					case err := <-r.done:
						r.stop = nil
						t.Fatalf("apply stopped: %v", err)
					case <-ctx.Done():
						t.Fatal("the Applier met no conflict")
					}
					e.waitMarker(t, r, 2)
					if got := rowsOf(t, e.dst); got != c.want {
						t.Errorf("target has %q, want %q", got, c.want)
					}
					e.settled(t, r)
					if n := r.a.Stats().Conflicts(c.ct); n != 1 {
						t.Errorf("%d %s conflicts, want 1", n, c.ct)
					}
				})
			}
		})
	}
}
