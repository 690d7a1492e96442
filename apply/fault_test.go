package apply

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
)

// errCrash stands for the process dying at a hook.
var errCrash = errors.New("injected crash")

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
		injected atomic.Int32
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
			injected.Add(1)
			kctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			n, err := dstKill.kill(kctx, `application_name LIKE 'pgreorder apply%'`)
			cancel()
			t.Logf("terminated %d target connection(s) before the commit of %d: %v", n, x.Xid, err)
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
		between = func(i int) error {
			if i == 1 || i == 4 {
				injected.Add(1)
				time.Sleep(100 * time.Millisecond) // let some of the transaction stream first
				n, err := srcKill.kill(ctx, walsender(e.slot))
				t.Logf("terminated %d walsender(s) inside the large transaction", n)
				return err
			}
			return nil
		}
	}
	must(t, workload(ctx, e.src, seeded(t), 1, between))
	e.waitMarker(t, r, 1)
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
	if st.Sessions < 2 && fault != "walsender" {
		t.Errorf("%d sessions: the fault did not make the applier start again", st.Sessions)
	}
}
