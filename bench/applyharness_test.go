package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestApplyHarness checks the live apply harness on small sizes with PostgreSQL's subscriber:
// a run measures what it says (the publisher spilled or streamed as the subscription asks), a
// subscriber that loses rows fails the run, and an applier that exits fails it with its
// output. It needs PGREORDER_BENCH_APPLY=1, as the benchmarks.
func TestApplyHarness(t *testing.T) {
	requireApply(t)
	for _, in := range applyInstalls(t) {
		t.Run(fmt.Sprintf("pg=%d/sync", in.Major), func(t *testing.T) {
			p := newPair(t, in, syncSettings(), setupSync)
			defer p.close()
			p.get(t)
			const rows, kept = 5000, 4000 // 20% rolled back
			sql := syncSQL(rows, kept)
			for _, c := range []native{{streaming: "off"}, {streaming: "on"}} {
				run, err := syncOnce(p, c, "64kB", sql, kept)
				if err != nil {
					t.Fatalf("%s: %v", c.name(), err)
				}
				d, st := run.d, run.st
				t.Logf("%s: %v, %+v, %v", c.name(), d, st, run.cpu)
				if d <= 0 {
					t.Errorf("%s: timed %v", c.name(), d)
				}
				// The backend and the walsender are read to the nanosecond; the subscriber in clock
				// ticks, which 5000 rows may not reach.
				if u := run.cpu; u.backend <= 0 || u.walsender <= 0 || u.target < 0 {
					t.Errorf("%s: %v; want the processes' CPU time while the transaction ran", c.name(), u)
				}
				// 5000 rows are well over 64kB in the publisher's reorder buffer.
				if c.streaming == "off" && (st.spillBytes == 0 || st.streamBytes != 0) {
					t.Errorf("%s: publisher spilled %d B and streamed %d B; want a spill and no stream", c.name(), st.spillBytes, st.streamBytes)
				}
				if c.streaming == "on" && (st.streamBytes == 0 || st.spillBytes != 0) {
					t.Errorf("%s: publisher spilled %d B and streamed %d B; want a stream and no spill", c.name(), st.spillBytes, st.streamBytes)
				}
			}

			// A subscriber that drops the odd rows it applies.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			sub := p.sub.ConnString(benchDB)
			if err := pgtest.Exec(ctx, sub,
				`CREATE FUNCTION drop_odd() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.c % 2 = 1 THEN RETURN NULL; END IF; RETURN NEW; END $$`,
				"CREATE TRIGGER drop_odd BEFORE INSERT ON test FOR EACH ROW EXECUTE FUNCTION drop_odd()",
				"ALTER TABLE test ENABLE REPLICA TRIGGER drop_odd"); err != nil {
				t.Fatal(err)
			}
			_, err := syncOnce(p, native{streaming: "on"}, "64kB", sql, kept)
			if err == nil || !strings.Contains(err.Error(), "the subscriber had count, sum") {
				t.Errorf("a subscriber losing rows: got %v, want a count mismatch", err)
			}
			if err := pgtest.Exec(ctx, sub, "DROP TRIGGER drop_odd ON test"); err != nil {
				t.Fatal(err)
			}

			// An applier that exits at once (an unknown mode) fails the run with its output.
			_, err = syncOnce(p, pgreorderApply{mode: "no-such-mode"}, "64kB", sql, kept)
			if err == nil || !strings.Contains(err.Error(), "pgreorder apply exited") {
				t.Errorf("an applier that exits: got %v, want it reported", err)
			}
		})

		t.Run(fmt.Sprintf("pg=%d/catchup", in.Major), func(t *testing.T) {
			p := newPair(t, in, map[string]string{"logical_decoding_work_mem": "64MB"}, setupTPCB(1))
			defer p.close()
			p.get(t)
			load := tpcbLoad{scale: 1, clients: tpcbClients, txns: 20, seed: seed}
			res, err := catchupOnce(p, native{streaming: "off"}, load, "")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", res)
			if res.catchup <= 0 || res.visible <= 0 || res.backlog <= 0 || res.walBytes <= 0 {
				t.Errorf("got %+v, want every duration and the WAL size positive", res)
			}
			if res.stats.totalTxns < int64(load.clients*load.txns) {
				t.Errorf("the slot decoded %d transactions, want at least the backlog's %d", res.stats.totalTxns, load.clients*load.txns)
			}

			// A subscriber that drops the history rows of odd accounts.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			sub := p.sub.ConnString(benchDB)
			if err := pgtest.Exec(ctx, sub,
				`CREATE FUNCTION drop_odd() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.aid % 2 = 1 THEN RETURN NULL; END IF; RETURN NEW; END $$`,
				"CREATE TRIGGER drop_odd BEFORE INSERT ON pgbench_history FOR EACH ROW EXECUTE FUNCTION drop_odd()",
				"ALTER TABLE pgbench_history ENABLE REPLICA TRIGGER drop_odd"); err != nil {
				t.Fatal(err)
			}
			_, err = catchupOnce(p, native{streaming: "off"}, load, "")
			if err == nil || !strings.Contains(err.Error(), "differ from the publisher's") {
				t.Errorf("a subscriber losing rows: got %v, want the tables to differ", err)
			}
		})
	}
}

func TestMiddleMean(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{1, 2, 6}, 3}, // fewer than 10: all
		{[]float64{100, 1, 2, 3, 4, 5, 6, 7, 8, -50}, 4.5},                         // the middle 8 of 10
		{[]float64{9, 1, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5}, 5}, // 2 left out at each end
	} {
		if got := middleMean(c.in); got != c.want {
			t.Errorf("middleMean(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestMedianOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := medianOf(c.in); got != c.want {
			t.Errorf("medianOf(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestProcTimes reads this process's /proc entry (its parent is the one the OS reports) and sums
// a process's CPU time with its children's, and fails on a process that does not exist.
func TestProcTimes(t *testing.T) {
	ppid, self, _, err := procTimes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ppid != os.Getppid() || self < 0 {
		t.Errorf("procTimes(self) = ppid %d, cpu %v; want ppid %d", ppid, self, os.Getppid())
	}
	if _, err := serverCPU(os.Getpid()); err != nil {
		t.Errorf("serverCPU(self): %v", err)
	}
	if _, _, _, err := procTimes(-1); err == nil {
		t.Error("procTimes(-1): no error")
	}
}
