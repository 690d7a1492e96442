package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestSkipLSN stops on a transaction that violates a constraint only the target has, refuses a
// SkipLSN that is not that transaction's commit LSN, skips exactly that transaction with the
// right one (the next applies), and does not skip again when restarted with the same SkipLSN.
func TestSkipLSN(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := fullEnv(t, major, "skip", []string{`CREATE TABLE s (id int PRIMARY KEY, v int)`, `CREATE TABLE marker (id int PRIMARY KEY)`})
			pgtest.ExecAll(t, e.dst, `ALTER TABLE s ADD CONSTRAINT small CHECK (v < 100)`)
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 1)`, `INSERT INTO s VALUES (2, 500), (3, 3)`, `INSERT INTO s VALUES (4, 4)`)

			cfg := e.config(t, Eager) // the session that skips applies as Buffered: any mode will do
			err := start(t, cfg).stopped(t)
			var ae *ApplyError
			if !errors.As(err, &ae) || !errors.Is(err, ErrConstraint) {
				t.Fatalf("Run: %v, want an *ApplyError wrapping ErrConstraint", err)
			}
			t.Logf("%v", err)
			if want := "Config.SkipLSN = " + ae.CommitLSN.String(); !strings.Contains(err.Error(), want) {
				t.Errorf("the error lacks %q", want)
			}
			bad := ae.CommitLSN

			// A wrong LSN (the next transaction's, and one before the progress row) is refused.
			cfg.SkipLSN = bad + 1
			err = start(t, cfg).stopped(t)
			if !errors.Is(err, ErrSkipLSN) || !strings.Contains(err.Error(), "commit LSN "+bad.String()) {
				t.Fatalf("Run with SkipLSN %s: %v, want ErrSkipLSN naming %s", cfg.SkipLSN, err, bad)
			}
			cfg.SkipLSN = decoding.LSN(1)
			if err = start(t, cfg).stopped(t); !errors.Is(err, ErrSkipLSN) {
				t.Fatalf("Run with SkipLSN %s: %v, want ErrSkipLSN", cfg.SkipLSN, err)
			}
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM s`); n != 1 {
				t.Fatalf("%d rows on the target after the refusals, want 1", n)
			}

			// The session fails once the skip is recorded and before it is acknowledged: the next
			// one neither skips again nor applies the transaction.
			cfg.SkipLSN = bad
			var failed atomic.Bool
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "after-commit" && x.CommitLSN == bad && failed.CompareAndSwap(false, true) {
					return retry.Retry("injected failure after the skip")
				}
				return nil
			}}
			r := start(t, cfg)
			pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			if st := r.a.Stats(); st.Skipped != 1 || st.Sessions != 2 || !failed.Load() {
				t.Errorf("Stats.Skipped %d in %d sessions (failure injected: %v), want 1 in 2", st.Skipped, st.Sessions, failed.Load())
			}
			r.halt(t)
			if got := pgtest.Count(t, e.dst, `SELECT count(*) FROM s WHERE id IN (1, 4)`); got != 2 || pgtest.Count(t, e.dst, `SELECT count(*) FROM s`) != 2 {
				t.Fatalf("the target holds the wrong rows of s (want 1 and 4 only)")
			}
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pgreorder_apply_progress WHERE skipped_lsn = $1::pg_lsn AND skipped_xid = $2`,
				bad.String(), int64(ae.Xid)); n != 1 {
				t.Errorf("the progress row does not record the skip")
			}

			// Restarted with the same SkipLSN: nothing is skipped again.
			cfg.hooks = nil
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (5, 5)`, `INSERT INTO marker VALUES (2)`)
			r = start(t, cfg)
			e.waitMarker(t, r, 2)
			if st := r.a.Stats(); st.Skipped != 0 {
				t.Errorf("Stats.Skipped %d after the restart, want 0", st.Skipped)
			}
			r.halt(t)
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM s`); n != 3 {
				t.Errorf("%d rows of s on the target, want 3", n)
			}

			// An LSN past the progress row where nothing commits: refused once the source's WAL
			// moved past it with nothing to apply.
			cfg.SkipLSN = e.progress(t) + 1
			pgtest.ExecAll(t, e.src, `CREATE TABLE unrelated (x int)`, `DROP TABLE unrelated`)
			if err := start(t, cfg).stopped(t); !errors.Is(err, ErrSkipLSN) || !strings.Contains(err.Error(), "no source transaction to apply commits there") {
				t.Errorf("Run with SkipLSN %s where nothing commits: %v, want ErrSkipLSN", cfg.SkipLSN, err)
			}
		})
	}
}
