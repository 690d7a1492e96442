package apply

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestGroup replays a backlog of small transactions in Buffered mode: transactions already
// received are applied together, several to a target transaction and a round trip, and the
// target ends equal to the source.
func TestGroup(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Eager, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%v", major, mode), func(t *testing.T) { testGroup(t, major, mode) })
		}
	}
}

// testGroup is TestGroup in one mode: Eager groups the whole transactions on the leader's
// connection, Parallel in runs on its workers.
func testGroup(t *testing.T, major int, mode Mode) {
	e := newEnv(t, major)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The backlog is made before the applier starts.
	const clients, txns = 4, 100
	must(t, concurrent(ctx, e.src, seeded(t), clients, txns))
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	r := start(t, e.config(t, mode))
	e.waitMarker(t, r, 1)
	r.halt(t)
	e.compare(t)
	st := r.a.Stats()
	t.Logf("stats %+v", st)
	// An update or delete that finds no row on the source makes an empty transaction,
	// which pgoutput does not send: most of them are sent.
	if st.Txns < clients*txns/2 {
		t.Fatalf("%d transactions applied, want at least %d", st.Txns, clients*txns/2)
	}
	// One round trip each would be st.Txns; grouped, far fewer.
	if st.RoundTrips > st.Txns/4 {
		t.Errorf("%d round trips for %d transactions: not grouped", st.RoundTrips, st.Txns)
	}
	if st.SerialRetries != 0 {
		t.Errorf("%d serial retries", st.SerialRetries)
	}
}

// TestGroupKill kills the applier process (SIGKILL) in Buffered mode while it holds a group of
// transactions open on the target, just before its commit, starts it again, and checks that the
// target ends equal to the source with nothing applied twice or lost.
func TestGroupKill(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			must(t, concurrent(ctx, e.src, seeded(t), 4, 100))
			// A group after the first 192 transactions committed stalls before its commit until
			// the child is killed (the hook runs for each transaction of a group).
			cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Buffered, WorkMem: 256 << 10,
				Stall: "before-commit", StallAfter: 192}
			first := startChild(t, cc)
			for !strings.Contains(first.stderr.String(), "stalled at before-commit") {
				select {
				case err := <-first.done:
					first.done <- err
					t.Fatalf("the child stopped: %v\n%s", err, first.stderr)
				case <-ctx.Done():
					t.Fatalf("the child did not stall:\n%s", first.stderr)
				case <-time.After(10 * time.Millisecond):
				}
			}
			// Status updates go on while it stalls: nothing of the open group may be confirmed.
			waitReplies(t, ctx, e.src, e.slot, 3)
			first.kill(t)
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			cc.Stall = ""
			startChild(t, cc)
			waitMarkerCtx(t, ctx, e.dst, 1)
			e.compare(t)
		})
	}
}
