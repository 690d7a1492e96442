package apply

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestUntilCaughtUp lets Run with UntilCaughtUp return nil once the backlog the source had when
// it started is applied and acknowledged: every row is on the target, the progress row and the
// slot are at or past the position it reports. A second Run, with nothing new, returns too.
func TestUntilCaughtUp(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := fullEnv(t, major, "caught", []string{`CREATE TABLE c (id int PRIMARY KEY, v int)`})
				for i := range 30 {
					pgtest.ExecAll(t, e.src, fmt.Sprintf(`INSERT INTO c VALUES (%d, %d)`, i, i))
				}
				pgtest.ExecAll(t, e.src, `UPDATE c SET v = v + 1`)
				end := decoding.LSN(0)
				must(t, end.UnmarshalText([]byte(queryAll(t, e.src, `SELECT pg_current_wal_lsn()::text`)[0])))
				cfg := e.config(t, mode)
				cfg.UntilCaughtUp = true
				for run := range 2 {
					began := time.Now()
					r := start(t, cfg)
					if err := r.stopped(t); err != nil {
						t.Fatalf("run %d: Run: %v, want nil once caught up", run, err)
					}
					t.Logf("run %d: caught up in %v", run, time.Since(began).Round(time.Millisecond))
					lsn, ok := r.a.CaughtUp()
					if !ok || lsn < end {
						t.Fatalf("run %d: CaughtUp %s %v, want at least %s", run, lsn, ok, end)
					}
					if p := e.progress(t); p < lsn {
						t.Errorf("run %d: progress row at %s, short of %s", run, p, lsn)
					}
					pgtest.Eventually(t, time.Minute, "the slot to confirm the position caught up to", func() bool { return e.confirmed(t) >= lsn })
				}
				e.sameRows(t, "c")
			})
		}
	}
}

// TestUntilCaughtUpAsks: with the status interval at its default (10s), a Run with UntilCaughtUp
// whose source wrote WAL past the slot with nothing to apply (a checkpoint) returns within a
// round trip of the source, not at the next status interval: it asks the source for its position.
func TestUntilCaughtUpAsks(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Eager} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := fullEnv(t, major, "asks", []string{`CREATE TABLE c (id int PRIMARY KEY, v int)`})
				pgtest.ExecAll(t, e.src, `INSERT INTO c VALUES (1, 1)`)
				cfg := e.config(t, mode)
				cfg.UntilCaughtUp = true
				cfg.Source.StatusInterval = 0 // the default, 10s
				for run := range 2 {
					pgtest.ExecAll(t, e.src, `CHECKPOINT`) // WAL past the slot, nothing in it to apply
					began := time.Now()
					r := start(t, cfg)
					if err := r.stopped(t); err != nil {
						t.Fatalf("run %d: Run: %v, want nil once caught up", run, err)
					}
					took := time.Since(began)
					t.Logf("run %d: caught up in %v", run, took.Round(time.Millisecond))
					if took >= 5*time.Second {
						t.Errorf("run %d: caught up in %v: it waited for a status interval", run, took)
					}
				}
				e.sameRows(t, "c")
			})
		}
	}
}

// TestUntilCaughtUpSlotBehind: a Run with UntilCaughtUp that starts caught up, its progress row
// at the source's WAL position but past what the slot confirmed (an idle position persisted on
// the target and never confirmed, here written by the test), returns only once the slot has
// been told: the slot confirms the position caught up to.
func TestUntilCaughtUpSlotBehind(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			// The source on a server of its own, the target elsewhere: writing the target's
			// progress row writes no WAL on the source.
			src := conflictServer(t, major)
			db, dst := pgtest.NewDatabase(t, src), pgtest.Shared(t, major)
			dstDB := pgtest.NewDatabase(t, dst)
			e := &env{srv: src, src: src.ConnString(db), dst: dst.ConnString(dstDB), repl: src.ReplicationConnString(db), slot: "behind"}
			pgtest.ExecAll(t, e.src, `CREATE TABLE c (id int PRIMARY KEY)`, `INSERT INTO c VALUES (1)`, `CREATE PUBLICATION pub FOR ALL TABLES`,
				`SELECT pg_create_logical_replication_slot('behind', 'pgoutput')`, `INSERT INTO c VALUES (2)`)
			pgtest.ExecAll(t, e.dst, `CREATE TABLE c (id int PRIMARY KEY)`, `INSERT INTO c VALUES (1)`)
			cfg := e.config(t, Buffered)
			cfg.UntilCaughtUp = true
			must(t, start(t, cfg).stopped(t))
			// WAL past the slot with nothing for it (a transactional message, which the stream
			// leaves out), and the progress row moved there.
			pgtest.ExecAll(t, e.src, `SELECT pg_logical_emit_message(true, 'test', 'x')`)
			w := queryAll(t, e.src, `SELECT pg_current_wal_flush_lsn()::text`)[0]
			pgtest.ExecAll(t, e.dst, `UPDATE pgreorder_apply_progress SET end_lsn = '`+w+`' WHERE slot = 'behind'`)
			var at decoding.LSN
			must(t, at.UnmarshalText([]byte(w)))
			if c := e.confirmed(t); c >= at {
				t.Fatalf("the slot confirmed %s, not behind the progress row at %s", c, at)
			}
			r := start(t, cfg)
			must(t, r.stopped(t))
			lsn, ok := r.a.CaughtUp()
			if !ok {
				t.Fatal("not caught up")
			}
			pgtest.Eventually(t, 10*time.Second, "the slot to confirm the position caught up to", func() bool { return e.confirmed(t) >= lsn })
			e.sameRows(t, "c")
		})
	}
}
