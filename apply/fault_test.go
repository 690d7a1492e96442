package apply

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// errCrash stands for the process dying at a hook: a failure that another session cures, as
// the error says (internal/retry).
var errCrash = retry.Retry("injected crash")

// faultModes are the modes the fault tests run in.
var faultModes = []Mode{Buffered, Eager, Parallel}

// TestFaults replicates the mixed workload while the walsender is terminated, the target
// connection is terminated inside a transaction, and the applier "crashes" before and after
// target commits, and checks that the target equals the source (nothing lost, nothing applied
// twice: the keyless events table would show a duplicate) and that the slot never confirmed a
// commit the target had not applied.
func TestFaults(t *testing.T) {
	faults := []string{"walsender", "target-conn", "crash-before-commit", "crash-after-commit"}
	for _, major := range testMajors {
		for _, mode := range append(faultModes, -Parallel) {
			syncCommit := mode < 0 // SynchronousCommit
			mode = max(mode, -mode)
			name := mode.String()
			if syncCommit {
				name += "-sync"
			}
			for _, fault := range faults {
				t.Run(fmt.Sprintf("pg%d/%s/%s", major, name, fault), func(t *testing.T) {
					testFault(t, major, mode, syncCommit, fault)
				})
			}
		}
	}
}

func testFault(t *testing.T, major int, mode Mode, syncCommit bool, fault string) {
	e := newEnv(t, major)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srcKill, dstKill := newTerminator(t, e.src), newTerminator(t, e.dst)
	monitor, err := pgx.Connect(ctx, e.src)
	must(t, err)
	defer monitor.Close(context.Background())

	var monMu sync.Mutex
	var (
		injected atomic.Int32 // faults injected, each of which ends a session
		checked  atomic.Int32
		bad      atomic.Value
	)
	cfg := e.config(t, mode)
	cfg.SynchronousCommit = syncCommit
	cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
		if stage == "before-commit" {
			// The slot must not have confirmed this commit: it is not applied yet. Workers call
			// the hook at once, and a session's end cancels its context: the monitor connection
			// is shared under a lock and its queries outlive the session.
			var confirmed decoding.LSN
			monMu.Lock()
			qctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := monitor.QueryRow(qctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots
				WHERE slot_name = $1 AND database = current_database()`, e.slot).Scan(&confirmed)
			cancel()
			monMu.Unlock()
			if err != nil {
				return err
			}
			checked.Add(1)
			if confirmed > x.CommitLSN {
				bad.CompareAndSwap(nil, fmt.Sprintf("confirmed_flush_lsn %s passed the unapplied commit %s of xid %d", confirmed, x.CommitLSN, x.Xid))
			}
		}
		switch {
		case fault == "target-conn" && stage == "before-commit" && x.Streamed && injected.Load() == 0:
			kctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			n, err := dstKill.kill(kctx, `application_name LIKE 'pgreorder apply%'`)
			cancel()
			if err != nil {
				return err
			}
			if n > 0 { // the connection committing x is one of them
				injected.Add(1)
			}
		case fault == "crash-before-commit" && stage == "before-commit" && x.Streamed && injected.Load() == 0:
			injected.Add(1)
			return errCrash
		case fault == "crash-after-commit" && stage == "after-commit" && injected.Load() < 3:
			injected.Add(1)
			return errCrash
		}
		return nil
	}}
	r := start(t, cfg)
	var between func(int) error
	if fault == "walsender" {
		var killed []int32 // the walsenders terminated
		between = func(i int) error {
			if i != 1 && i != 4 {
				return nil
			}
			// Some of the transaction streamed first: a walsender of the slot (the second
			// time, the one the stream reconnected to) read the WAL written so far.
			pid, err := waitSent(ctx, monitor, &monMu, e.slot, killed)
			if err != nil {
				return err
			}
			n, err := srcKill.kill(ctx, "pid = "+strconv.Itoa(int(pid)))
			if err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("terminated %d walsenders of the slot inside the large transaction, want 1", n)
			}
			killed = append(killed, pid)
			injected.Add(1)
			return nil
		}
	}
	must(t, workload(ctx, e.src, seeded(t), 1, between))
	e.waitMarker(t, r, 1)
	if fault != "walsender" {
		// A fault may end the session that applied the marker: let the next one start.
		pgtest.Eventually(t, time.Minute, "a session after each fault", func() bool { return r.a.Stats().Sessions >= 1+int64(injected.Load()) })
	}
	r.halt(t)
	if injected.Load() == 0 {
		t.Fatalf("fault %s was never injected", fault)
	}
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if checked.Load() == 0 {
		t.Fatal("no transaction was checked")
	}
	e.compare(t)
	st := r.a.Stats()
	t.Logf("stats %+v", st)
	// A terminated walsender does not end the session: the stream reconnects, and the marker,
	// written after the last one was terminated, came through the reconnected stream.
	if n := injected.Load(); fault != "walsender" && st.Sessions < 1+int64(n) {
		t.Errorf("%d sessions after %d faults: a fault did not make the applier start again", st.Sessions, n)
	}
}

// waitSent waits until a walsender of slot, other than those in killed, has read the source's
// WAL past a record written now (a non-transactional logical message, which the Applier ignores),
// and returns its pid.
func waitSent(ctx context.Context, conn *pgx.Conn, mu *sync.Mutex, slot string, killed []int32) (int32, error) {
	query := func(sql string, dst any, args ...any) error {
		mu.Lock()
		defer mu.Unlock()
		return conn.QueryRow(ctx, sql, args...).Scan(dst)
	}
	var at decoding.LSN
	if err := query(`SELECT pg_catalog.pg_logical_emit_message(false, 'pgreorder test', '')::text`, &at); err != nil {
		return 0, err
	}
	for {
		var pid int32
		err := query(`SELECT coalesce(min(r.pid), 0)
			FROM pg_catalog.pg_replication_slots s JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = $1 AND s.database = pg_catalog.current_database()
			AND r.sent_lsn > $2::text::pg_catalog.pg_lsn AND r.pid <> ALL($3::int4[])`, &pid, slot, at.String(), append([]int32{}, killed...))
		if err != nil || pid != 0 {
			return pid, err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for a walsender of %s to read past %s: %w", slot, at, context.Cause(ctx))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestFaultInGroup crashes Buffered before the commit of a streamed transaction with few changes,
// which shares its target transaction with the small ones committed after it (a group): the
// crash comes at that commit, whichever transaction ends the group, and the target ends equal
// to the source.
func TestFaultInGroup(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			// Streamed (its values exceed logical_decoding_work_mem), in three changes; then small
			// transactions, all in the stream before the Applier starts.
			must(t, pgtest.Exec(ctx, e.src,
				`INSERT INTO toasty SELECT g, 0, (SELECT string_agg(md5(random()::text || g || i), '') FROM generate_series(1, 1000) i)
					FROM generate_series(1, 3) g`,
				`INSERT INTO items VALUES (1, 1, 'a')`, `INSERT INTO items VALUES (2, 2, 'b')`, `INSERT INTO marker VALUES (1)`))
			var crashed atomic.Bool
			cfg := e.config(t, Buffered)
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "before-commit" && x.Streamed && crashed.CompareAndSwap(false, true) {
					return errCrash
				}
				return nil
			}}
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			r.halt(t)
			if !crashed.Load() {
				t.Fatal("no crash before the commit of the streamed transaction")
			}
			e.compare(t)
			if st := r.a.Stats(); st.Sessions < 2 {
				t.Errorf("%d sessions: the crash did not make the applier start again", st.Sessions)
			}
		})
	}
}
