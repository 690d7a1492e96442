package apply

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestReadingsAcrossSessions: the Applier's readings (Progress, Activity, BufferStats,
// Reconnects) go on across its sessions: a walsender terminated between two markers starts a
// second session, the counters of the first are kept and the second's added, the positions do
// not go back, and the last commit is the one the target committed last.
func TestReadingsAcrossSessions(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx := pgtest.Context(t, 2*time.Minute)
			if r := (&Applier{}); r.Reconnects() != 0 || !r.Activity().Started.IsZero() || r.Progress().Received != 0 {
				t.Fatal("an Applier that never ran has readings")
			}
			r := start(t, e.config(t, Buffered))
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			act1, pos1, buf1 := r.a.Activity(), r.a.Progress(), r.a.BufferStats()
			if act1.HandedOut < 1 || act1.LastCommitTime.IsZero() || pos1.Acked == 0 || buf1.TotalTxns < 1 {
				t.Fatalf("after the first marker: activity %+v, progress %+v, buffer %+v", act1, pos1, buf1)
			}
			k := newTerminator(t, e.src)
			pgtest.Eventually(t, time.Minute, "the walsender terminated", func() bool {
				n, err := k.kill(ctx, `backend_type = 'walsender'`)
				must(t, err)
				return n > 0
			})
			pgtest.Eventually(t, time.Minute, "a second session", func() bool { return r.a.Reconnects() >= 1 })
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
			e.waitMarker(t, r, 2)
			pgtest.Eventually(t, time.Minute, "the second session acknowledges", func() bool { return r.a.Progress().Acked > pos1.Acked })
			act2, pos2, buf2 := r.a.Activity(), r.a.Progress(), r.a.BufferStats()
			r.halt(t)
			if act2.HandedOut < act1.HandedOut+1 || act2.Acked < act1.Acked+1 {
				t.Errorf("handed out %d then %d, acknowledged %d then %d: not summed over the sessions", act1.HandedOut, act2.HandedOut, act1.Acked, act2.Acked)
			}
			if !act2.Started.Equal(act1.Started) {
				t.Errorf("Started %v, then %v: not the first session's", act1.Started, act2.Started)
			}
			if !act2.LastCommitTime.After(act1.LastCommitTime) || !act2.LastHandedOut.After(act1.LastHandedOut) {
				t.Errorf("last commit %v at %v, then %v at %v", act1.LastCommitTime, act1.LastHandedOut, act2.LastCommitTime, act2.LastHandedOut)
			}
			if pos2.Received < pos1.Received || pos2.Flushed < pos1.Flushed {
				t.Errorf("progress %+v, then %+v: went back", pos1, pos2)
			}
			if buf2.TotalTxns < buf1.TotalTxns+1 {
				t.Errorf("%d transactions in the buffers, then %d: not summed", buf1.TotalTxns, buf2.TotalTxns)
			}
			if after := r.a.Progress(); after.Acked < pos2.Acked {
				t.Errorf("after Run: acknowledged %v, then %v", pos2.Acked, after.Acked)
			}
		})
	}
}
