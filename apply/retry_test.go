package apply

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// delayLog records the delays Run logs before resuming.
type delayLog struct {
	mu     sync.Mutex
	delays []time.Duration
}

func (l *delayLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *delayLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *delayLog) WithGroup(string) slog.Handler            { return l }
func (l *delayLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "replication interrupted; resuming" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "after" {
			l.mu.Lock()
			l.delays = append(l.delays, a.Value.Duration())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// waitTxns waits until r has committed n source transactions.
func waitTxns(t *testing.T, r *running, n int64) {
	t.Helper()
	pgtest.Eventually(t, time.Minute, fmt.Sprintf("%d transactions applied", n), func() bool { return r.a.Stats().Txns >= n })
}

// TestRetryDelayReset: a session that applied transactions before it failed is followed by the
// shortest delay again, however many failures came before; only failures in a row, with nothing
// applied in between, make the delay grow.
func TestRetryDelayReset(t *testing.T) {
	e := newEnv(t, testMajors[len(testMajors)-1])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := e.config(t, Buffered)
	log := &delayLog{}
	cfg.Logger = slog.New(log)
	const crashes = 5
	var n atomic.Int32
	cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
		if stage == "after-commit" && n.Add(1) <= crashes {
			return errCrash // committed, then the session fails
		}
		return nil
	}}
	r := start(t, cfg)
	for i := range crashes + 1 {
		must(t, pgtest.Exec(ctx, e.src, fmt.Sprintf(`INSERT INTO items VALUES (%d, 1, 'x')`, i)))
		waitTxns(t, r, int64(i+1))
	}
	r.halt(t)
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.delays) != crashes {
		t.Fatalf("%d retries logged, want %d: %v", len(log.delays), crashes, log.delays)
	}
	for i, d := range log.delays {
		if d != retryBackoff.Min {
			t.Errorf("retry %d after %v, want %v (each session applied a transaction): %v", i+1, d, retryBackoff.Min, log.delays)
		}
	}
}

// TestStatsRolledBack: in every mode, the rows of a target transaction that was rolled back (the
// session failed before its commit) are not counted; they are counted once, when applied again
// and committed.
func TestStatsRolledBack(t *testing.T) {
	for _, mode := range []Mode{Buffered, Eager, Parallel} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, testMajors[len(testMajors)-1])
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const txns, rows = 5, 10
			for i := range txns {
				// The UPDATE makes the applier send the inserts (a COPY) before the commit.
				must(t, pgtest.Exec(ctx, e.src, fmt.Sprintf(
					`BEGIN; INSERT INTO items SELECT g, 1, 'x' FROM generate_series(%d, %d) g; UPDATE items SET qty = 2 WHERE id = %d; COMMIT`,
					i*rows+1, (i+1)*rows, i*rows+1)))
			}
			cfg := e.config(t, mode)
			var crashed atomic.Bool
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "before-commit" && crashed.CompareAndSwap(false, true) {
					return errCrash // the transaction's rows were sent; it is rolled back
				}
				return nil
			}}
			r := start(t, cfg)
			waitTxns(t, r, txns)
			r.halt(t)
			st := r.a.Stats()
			if !crashed.Load() || st.Sessions < 2 {
				t.Fatalf("no crash: %+v", st)
			}
			if st.Inserts != txns*rows || st.Updates != txns {
				t.Errorf("Inserts %d, Updates %d, want %d and %d: rows of the rolled-back transaction were counted", st.Inserts, st.Updates, txns*rows, txns)
			}
			e.compare(t)
		})
	}
}
