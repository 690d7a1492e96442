package apply

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// streamSchema is the streamed conflict tests': t for the conflicts, big for the rows that make a
// transaction streamed, marker.
var streamSchema = []string{
	`CREATE TABLE t (id int PRIMARY KEY, v text)`,
	`CREATE TABLE big (id int PRIMARY KEY, v text)`,
	`CREATE TABLE marker (id int PRIMARY KEY)`,
}

// TestConflictStreamedSubtransactions: in Eager and Parallel, a streamed transaction is applied
// as it arrives, subtransactions as savepoints. A conflict resolved in a subtransaction the
// source then rolls back is undone with it (the local row it replaced is back) and neither
// counted nor logged; a conflict in a subtransaction that stays is counted and logged once,
// when the transaction commits.
func TestConflictStreamedSubtransactions(t *testing.T) {
	srv := conflictServer(t, testMajors[len(testMajors)-1])
	for _, mode := range []Mode{Eager, Parallel} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e := serverEnv(t, srv, "streamed_sub", streamSchema)
			cfg, _ := e.loggedConfig(t, map[conflict.Type]conflict.Resolution{conflict.InsertExists: conflict.ApplyRemote})
			cfg.Mode = mode
			cfg.Conflicts.LogTable = "conflict_log"
			pgtest.ExecAll(t, e.src, `INSERT INTO t VALUES (20, 'orig')`, `INSERT INTO marker VALUES (1)`)
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			// Local changes: a row the source will insert too, and the deletion of one it updates.
			pgtest.ExecAll(t, e.dst, `INSERT INTO t VALUES (10, 'local')`, `DELETE FROM t WHERE id = 20`)

			src, err := pgx.Connect(ctx, e.src)
			must(t, err)
			defer src.Close(context.Background())
			bigRows := func(lo int) string {
				return fmt.Sprintf(`INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(%d, %d) g`, lo, lo+999)
			}
			for _, q := range []string{
				`BEGIN`, bigRows(1), // more than logical_decoding_work_mem: streamed
				`SAVEPOINT a`, `INSERT INTO t VALUES (10, 'remote')`, bigRows(1001), // insert_exists, resolved on the target
				`ROLLBACK TO SAVEPOINT a`,
				`SAVEPOINT b`, `UPDATE t SET v = 'remote' WHERE id = 20`, `RELEASE SAVEPOINT b`, // update_missing
				bigRows(2001), `COMMIT`, `INSERT INTO marker VALUES (2)`,
			} {
				_, err := src.Exec(ctx, q)
				must(t, err)
			}
			e.waitMarker(t, r, 2)
			e.settled(t, r)
			r.halt(t)

			if got := tableRows(t, e.dst, "t"); got != "10,local" {
				t.Errorf("t on the target: %q, want the local row back", got)
			}
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM big`); n != 2000 {
				t.Errorf("%d rows in big, want 2000", n)
			}
			st := r.a.Stats()
			if st.SubAborts == 0 {
				t.Errorf("no subtransaction rolled back on the target: the transaction was not applied as it streamed (%+v)", st)
			}
			if st.InsertExists != 0 || st.UpdateMissing != 1 {
				t.Errorf("insert_exists %d, update_missing %d: want 0 and 1", st.InsertExists, st.UpdateMissing)
			}
			var logged string
			c, err := pgx.Connect(ctx, e.dst)
			must(t, err)
			defer c.Close(context.Background())
			must(t, c.QueryRow(ctx, `SELECT coalesce(string_agg(conflict || ':' || resolution, ' ' ORDER BY conflict), '') FROM conflict_log`).Scan(&logged))
			if logged != "update_missing:skip" {
				t.Errorf("conflict log table: %q, want only update_missing:skip", logged)
			}
		})
	}
}

// TestLastUpdateWinsSpooled: a streamed transaction spooled for lack of a free worker is applied
// by the leader at its commit, and last_update_wins judges it by that commit's time: a local
// change committed after it on the source, but before it was applied, wins.
func TestLastUpdateWinsSpooled(t *testing.T) {
	srv := conflictServer(t, testMajors[len(testMajors)-1])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := serverEnv(t, srv, "spooled_lww", streamSchema)
	cfg, _ := e.loggedConfig(t, map[conflict.Type]conflict.Resolution{conflict.UpdateOriginDiffers: conflict.LastUpdateWins})
	cfg.Mode, cfg.Workers = Eager, 1
	pgtest.ExecAll(t, e.src, `INSERT INTO t VALUES (1, 'orig')`, `INSERT INTO marker VALUES (1)`)
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	r.halt(t)

	// While the Applier is stopped: a streamed transaction left open (it takes the one worker
	// when the Applier reads it), a streamed one that updates the row and commits, then a local
	// update of the row on the target, committed after that one.
	open, err := pgx.Connect(ctx, e.src)
	must(t, err)
	defer open.Close(context.Background())
	bigRows := func(lo int) string {
		return fmt.Sprintf(`INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(%d, %d) g`, lo, lo+999)
	}
	for _, q := range []string{`BEGIN`, bigRows(1)} { // more than logical_decoding_work_mem: streamed
		_, err := open.Exec(ctx, q)
		must(t, err)
	}
	// (The savepoint makes the Applier resolve the update's conflict before the commit, as it
	// does before each subtransaction.)
	pgtest.ExecAll(t, e.src, `BEGIN; UPDATE t SET v = 'remote' WHERE id = 1; SAVEPOINT s; `+bigRows(1001)+`; RELEASE SAVEPOINT s; COMMIT`)
	pgtest.ClockPast(t, e.src) // the local update's commit timestamp is the later one
	pgtest.ExecAll(t, e.dst, `UPDATE t SET v = 'local' WHERE id = 1`)
	_, err = open.Exec(ctx, `COMMIT`)
	must(t, err)
	pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (2)`)

	r = start(t, cfg)
	e.waitMarker(t, r, 2)
	e.settled(t, r)
	st := r.a.Stats()
	if st.Spooled == 0 {
		t.Fatalf("no transaction spooled (%+v): the test did not take the path it is about", st)
	}
	if got := tableRows(t, e.dst, "t"); got != "1,local" {
		t.Errorf("t on the target: %q, want the local row, committed after the source's", got)
	}
	if st.UpdateOriginDiffers != 1 {
		t.Errorf("%d update_origin_differs conflicts, want 1", st.UpdateOriginDiffers)
	}
}
