package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// crashEnv is a source database on the shared server of major and a target on a server of its
// own, durable, which the test crashes (pg_ctl stop -m immediate) and restarts. The target's WAL
// writer waits its longest (10s): what a commit did not flush is really lost by a crash.
func crashEnv(t *testing.T, major int, slot string, schema []string) (*env, *pgtest.Server) {
	t.Helper()
	var in pgtest.Install
	for _, i := range pgtest.FindInstalls() {
		if i.Major == major {
			in = i
		}
	}
	if in.Major == 0 {
		pgtest.Unavailable(t, fmt.Sprintf("PostgreSQL %d is not installed", major))
	}
	ctx := pgtest.Context(t, time.Minute)
	srv := pgtest.Shared(t, major)
	srcDB := pgtest.NewDatabase(t, srv)
	dstSrv, err := pgtest.Start(ctx, in, pgtest.Options{Durable: true, Settings: map[string]string{"wal_writer_delay": "10s"}})
	must(t, err)
	t.Cleanup(func() { dstSrv.Stop() })
	e := &env{srv: srv, src: srv.ConnString(srcDB), dst: dstSrv.ConnString("postgres"), repl: srv.ReplicationConnString(srcDB), slot: slot}
	must(t, pgtest.Exec(ctx, e.src, append(append([]string{}, schema...), `CREATE PUBLICATION pub FOR ALL TABLES`,
		`SELECT pg_create_logical_replication_slot('`+slot+`', 'pgoutput')`)...))
	must(t, pgtest.Exec(ctx, e.dst, schema...))
	return e, dstSrv
}

// TestSyncSequencesTargetCrash crashes the target right after SyncSequences returned: the values
// it set must have survived (a cut-over's last step is a synchronization, then the switch).
func TestSyncSequencesTargetCrash(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e, dstSrv := crashEnv(t, major, "seqcrash", sequenceSchema)
			pgtest.ExecAll(t, e.src, `SELECT nextval('q_id_seq') FROM generate_series(1, 500)`, `SELECT nextval('g_id_seq') FROM generate_series(1, 300)`)
			a, err := New(e.config(t, Buffered))
			must(t, err)
			if n, err := a.SyncSequences(pgtest.Context(t, time.Minute)); err != nil || n != 2 {
				t.Fatalf("SyncSequences: %d moved, %v; want 2", n, err)
			}
			dstSrv.Crash()
			must(t, dstSrv.Restart(pgtest.Context(t, time.Minute)))
			if q, g := seqValue(t, e.dst, "q_id_seq"), seqValue(t, e.dst, "g_id_seq"); q < 500 || g < 300 {
				t.Errorf("after the target's crash its sequences are at %d and %d, want at least 500 and 300", q, g)
			}
		})
	}
}

// TestSyncSequencesKill kills the applier process (SIGKILL) in the middle of a sequence
// synchronization, while it streams with a short SyncSequencesInterval and the source draws from
// the sequences all along, and starts it again. The target's sequences never move back (checked
// all along); once restarted they reach the source's values again, and after the clean stop they
// are at least where the source's were when it stopped drawing.
func TestSyncSequencesKill(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := fullEnv(t, major, "seqkill", sequenceSchema)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			seqs := []string{"q_id_seq", "g_id_seq"}

			// nextval on the source, until draw ends.
			draw, stopDraw := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				c, err := pgx.Connect(draw, e.src)
				if err != nil {
					return
				}
				defer c.Close(context.Background())
				for draw.Err() == nil {
					c.Exec(draw, `SELECT nextval('q_id_seq'), nextval('g_id_seq')`)
				}
			}()
			// The target's sequences, read all along: never lower than read before.
			watch, stopWatch := context.WithCancel(ctx)
			var backwards []string
			go func() {
				defer wg.Done()
				c, err := pgx.Connect(watch, e.dst)
				if err != nil {
					return
				}
				defer c.Close(context.Background())
				last := make([]int64, len(seqs))
				for watch.Err() == nil {
					for i, s := range seqs {
						var v int64
						if err := c.QueryRow(watch, `SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM `+s).Scan(&v); err != nil {
							continue
						}
						if v < last[i] {
							backwards = append(backwards, fmt.Sprintf("%s from %d to %d", s, last[i], v))
						}
						last[i] = v
					}
				}
			}()

			// After a few sequences set, the next setval stalls until the kill: the
			// synchronization is half done.
			cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Buffered, WorkMem: 256 << 10,
				SyncSequences: true, SyncSequencesInterval: 5 * time.Millisecond, Stall: "sequence-set", StallAfter: 5}
			first := startChild(t, cc)
			waitStderr(t, ctx, first, "stalled at sequence-set")
			before := []int64{seqValue(t, e.dst, seqs[0]), seqValue(t, e.dst, seqs[1])}
			first.kill(t)
			for i, s := range seqs {
				if v := seqValue(t, e.dst, s); v < before[i] || v == 0 {
					t.Errorf("after the kill %s is at %d on the target, was %d", s, v, before[i])
				}
			}

			cc.Stall = ""
			second := startChild(t, cc)
			want := []int64{seqValue(t, e.src, seqs[0]), seqValue(t, e.src, seqs[1])}
			for i, s := range seqs {
				pgtest.Eventually(t, time.Minute, s+" on the target to reach the source's", func() bool { return seqValue(t, e.dst, s) >= want[i] })
			}
			stopDraw()
			final := []int64{seqValue(t, e.src, seqs[0]), seqValue(t, e.src, seqs[1])}
			second.term(t)
			stopWatch()
			wg.Wait()
			for i, s := range seqs {
				if v := seqValue(t, e.dst, s); v < final[i] {
					t.Errorf("after the clean stop %s is at %d on the target, want at least the source's %d", s, v, final[i])
				}
			}
			if len(backwards) > 0 {
				t.Errorf("target sequences moved back: %s", strings.Join(backwards, "; "))
			}
		})
	}
}

// waitStderr waits until the child wrote s to its stderr, or fails t.
func waitStderr(t *testing.T, ctx context.Context, ch *child, s string) {
	t.Helper()
	for !strings.Contains(ch.stderr.String(), s) {
		select {
		case err := <-ch.done:
			ch.done <- err // for the cleanup
			t.Fatalf("the child stopped before writing %q: %v\n%s", s, err, ch.stderr)
		case <-ctx.Done():
			t.Fatalf("the child did not write %q\n%s", s, ch.stderr)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// term stops the child with SIGTERM (a clean stop) and fails t unless it exits with status 0.
func (ch *child) term(t *testing.T) {
	t.Helper()
	must(t, ch.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-ch.done:
		ch.done <- nil // for the cleanup
		if err != nil {
			t.Errorf("the child's clean stop: %v\n%s", err, ch.stderr)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the child did not stop on SIGTERM")
	}
}

// TestSkipLSNKill kills the applier process (SIGKILL) once the skip of SkipLSN's transaction is
// recorded on the target and before it is acknowledged to the source, and starts it again with
// the same SkipLSN: the skipped transaction is not applied, no other transaction is skipped (the
// next one applies).
func TestSkipLSNKill(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := fullEnv(t, major, "skipkill", []string{`CREATE TABLE s (id int PRIMARY KEY, v int)`, `CREATE TABLE marker (id int PRIMARY KEY)`})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pgtest.ExecAll(t, e.dst, `ALTER TABLE s ADD CONSTRAINT small CHECK (v < 100)`)
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 1)`, `INSERT INTO s VALUES (2, 500), (3, 3)`, `INSERT INTO s VALUES (4, 4)`)
			err := start(t, e.config(t, Buffered)).stopped(t)
			var ae *ApplyError
			if !errors.As(err, &ae) || !errors.Is(err, ErrConstraint) {
				t.Fatalf("Run: %v, want an *ApplyError wrapping ErrConstraint", err)
			}
			bad := ae.CommitLSN

			// The first commit hook of the session is the skip's: it stalls there, the skip
			// recorded and not acknowledged, until the kill.
			cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Buffered, WorkMem: 256 << 10,
				SkipLSN: bad, Stall: "after-commit"}
			first := startChild(t, cc)
			waitStderr(t, ctx, first, "stalled at after-commit")
			recorded := `SELECT count(*) FROM pgreorder_apply_progress WHERE skipped_lsn = $1::pg_lsn`
			if n := pgtest.Count(t, e.dst, recorded, bad.String()); n != 1 {
				t.Fatalf("the skip is not recorded in the progress row at the stall")
			}
			if c := e.confirmed(t); c > bad {
				t.Fatalf("the slot confirmed %s, past the skipped transaction's commit %s, before the kill", c, bad)
			}
			first.kill(t)

			cc.Stall = ""
			second := startChild(t, cc)
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (5, 5)`, `INSERT INTO marker VALUES (1)`)
			waitMarkerCtx(t, ctx, e.dst, 1)
			if !strings.Contains(second.stderr.String(), "was skipped already") {
				t.Errorf("the restarted applier did not find the skip recorded")
			}
			second.term(t)
			if got := queryAll(t, e.dst, `SELECT id::text FROM s ORDER BY id`); strings.Join(got, ",") != "1,4,5" {
				t.Errorf("rows of s on the target %q, want 1,4,5 (the skipped transaction's 2 and 3 absent)", got)
			}
			if n := pgtest.Count(t, e.dst, recorded, bad.String()); n != 1 {
				t.Errorf("the skip's record is gone from the progress row")
			}
			if c := e.confirmed(t); c <= bad {
				t.Errorf("the slot confirmed %s, not past the skipped transaction's commit %s", c, bad)
			}
		})
	}
}

// TestSkipLSNTargetCrash crashes the target (immediate stop) once the skip of SkipLSN's
// transaction is recorded there and before it is acknowledged: the record survived, the Applier's
// next session finds it, and the skipped transaction is neither applied nor skipped again (the
// next one applies).
func TestSkipLSNTargetCrash(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e, dstSrv := crashEnv(t, major, "skipcrash", []string{`CREATE TABLE s (id int PRIMARY KEY, v int)`, `CREATE TABLE marker (id int PRIMARY KEY)`})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pgtest.ExecAll(t, e.dst, `ALTER TABLE s ADD CONSTRAINT small CHECK (v < 100)`)
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 1)`, `INSERT INTO s VALUES (2, 500), (3, 3)`, `INSERT INTO s VALUES (4, 4)`)
			cfg := e.config(t, Buffered)
			err := start(t, cfg).stopped(t)
			var ae *ApplyError
			if !errors.As(err, &ae) || !errors.Is(err, ErrConstraint) {
				t.Fatalf("Run: %v, want an *ApplyError wrapping ErrConstraint", err)
			}
			bad := ae.CommitLSN

			recorded, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			cfg.SkipLSN = bad
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "after-commit" && x.CommitLSN == bad {
					once.Do(func() {
						close(recorded)
						select {
						case <-release:
						case <-ctx.Done():
						}
					})
				}
				return nil
			}}
			r := start(t, cfg)
			select {
			case <-recorded:
			case err := <-r.done:
				r.stop = nil
				t.Fatalf("apply stopped: %v", err)
			case <-ctx.Done():
				t.Fatal("the skip was not recorded")
			}
			if c := e.confirmed(t); c > bad {
				t.Fatalf("the slot confirmed %s, past the skipped transaction's commit %s, before the crash", c, bad)
			}
			dstSrv.Crash()
			must(t, dstSrv.Restart(ctx))
			close(release)
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (5, 5)`, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			st := r.a.Stats()
			r.halt(t)
			if st.Skipped != 1 || st.Sessions < 2 {
				t.Errorf("Stats.Skipped %d in %d sessions, want 1 in 2 or more (the crash ends the first)", st.Skipped, st.Sessions)
			}
			if got := queryAll(t, e.dst, `SELECT id::text FROM s ORDER BY id`); strings.Join(got, ",") != "1,4,5" {
				t.Errorf("rows of s on the target %q, want 1,4,5 (the skipped transaction's 2 and 3 absent)", got)
			}
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pgreorder_apply_progress WHERE skipped_lsn = $1::pg_lsn`, bad.String()); n != 1 {
				t.Errorf("the skip's record did not survive the crash")
			}
		})
	}
}

// TestSchemaAddColumnTargetCrash crashes the target (immediate stop) as soon as the transaction
// that added a column the source added (and the rows that need it) is committed there, and
// restarts it: the Applier goes on, the column is there once, with the source's type, and every
// row is there once.
//
// With asynchronous commits (the default) the crash loses the transaction, which the source sends
// again; with SynchronousCommit it is durable when the crash comes, acknowledged or not.
func TestSchemaAddColumnTargetCrash(t *testing.T) {
	for _, major := range testMajors {
		for _, syncCommit := range []bool{false, true} {
			t.Run(fmt.Sprintf("pg%d/sync=%v", major, syncCommit), func(t *testing.T) { testSchemaAddColumnTargetCrash(t, major, syncCommit) })
		}
	}
}

func testSchemaAddColumnTargetCrash(t *testing.T, major int, syncCommit bool) {
	e, dstSrv := crashEnv(t, major, "schemacrash", []string{`CREATE TABLE s (id int PRIMARY KEY, v text)`,
		`CREATE TABLE marker (id int PRIMARY KEY)`})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := e.config(t, Buffered)
	cfg.SchemaChanges, cfg.SynchronousCommit = SchemaAddColumns, syncCommit
	r := start(t, cfg)
	pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 'a')`, `INSERT INTO marker VALUES (1)`)
	e.waitMarker(t, r, 1)

	mon, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	pgtest.ExecAll(t, e.src, `BEGIN; ALTER TABLE s ADD COLUMN n numeric(10,2); INSERT INTO s SELECT g, 'b', g / 4.0 FROM generate_series(2, 200) g; COMMIT`)
	for {
		var n int
		must(t, mon.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 's'::regclass AND attname = 'n'`).Scan(&n))
		if n > 0 {
			break
		}
		select {
		case err := <-r.done:
			r.stop = nil
			t.Fatalf("apply stopped: %v", err)
		default:
		}
	}
	dstSrv.Crash()
	mon.Close(context.Background())
	must(t, dstSrv.Restart(ctx))
	survived := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_attribute WHERE attrelid = 's'::regclass AND attname = 'n'`)

	pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (300, 'c', 3.5)`, `UPDATE s SET n = n + 1 WHERE id = 2`, `INSERT INTO marker VALUES (2)`)
	e.waitMarker(t, r, 2)
	st := r.a.Stats()
	r.halt(t)
	t.Logf("the column survived the crash: %v; columns added %d, sessions %d", survived == 1, st.ColumnsAdded, st.Sessions)
	if got, want := columnTypes(t, e.dst, "s"), columnTypes(t, e.src, "s"); got != want {
		t.Errorf("target columns\n%s\nwant the source's\n%s", got, want)
	}
	e.sameRows(t, "s")
	if syncCommit && survived != 1 {
		t.Errorf("the column committed synchronously did not survive the crash")
	}
}
