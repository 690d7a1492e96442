package apply

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/apply/internal/plan"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestParallelChained replays in Parallel, in both commit orders, a backlog of small runs
// (Config.runTxns) of two kinds. Chained: every transaction appends to one of three rows (each
// value computed from the one before, so that two applied out of order leave the wrong value),
// so each run waits for the run before it: after a few runs on the workers the leader applies
// most of them itself, as groups. Independent: every transaction inserts a row of its own, so
// no run waits for another: they all go to the workers. The target must end equal to the
// source either way. Serial: every transaction updates one of three rows of a REPLICA IDENTITY
// FULL table, so each run waits for the one before to be applied alone: those are not counted
// as chained, and go to the workers too. Hot: a longer backlog where every transaction appends to
// the same row, so every run is chained: the probes back off (plan.ChainProbe, doubled by each probe up
// to plan.ChainProbeMax), and the workers get no more runs than those before the leader took over and
// two per probe (times one plus the probes that found a run not chained, which start it over).
func TestParallelChained(t *testing.T) {
	for _, major := range testMajors {
		for _, order := range []CommitOrder{CommitSource, CommitRelaxed} {
			for _, load := range []string{"chained", "independent", "serial", "hot"} {
				name := fmt.Sprintf("pg%d/%v/%s", major, order, load)
				t.Run(name, func(t *testing.T) { testParallelChained(t, major, order, load) })
			}
		}
	}
}

func testParallelChained(t *testing.T, major int, order CommitOrder, load string) {
	e := newEnv(t, major)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items SELECT g, 0, '' FROM generate_series(1, 3) g`,
		`INSERT INTO dup SELECT g, '' FROM generate_series(1, 3) g`))
	// The backlog is made before the applier starts: the leader is behind, its runs full.
	must(t, chainLoad(ctx, e.src, seeded(t), load))
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	cfg := e.config(t, Parallel)
	cfg.CommitOrder, cfg.Workers, cfg.runTxns = order, 4, 8
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	e.waitSame(t)
	r.halt(t)
	e.compare(t)
	st := r.a.Stats()
	t.Logf("%d runs on the leader, %d on the workers; stats %+v", st.RunsOnLeader, st.RunsOnWorkers, st)
	if st.SerialRetries != 0 {
		t.Errorf("%d serial retries", st.SerialRetries)
	}
	if load != "chained" && load != "hot" {
		if st.RunsOnLeader != 0 || st.RunsOnWorkers == 0 {
			t.Fatalf("%s runs: %d on the leader, %d on the workers; want all on the workers", load, st.RunsOnLeader, st.RunsOnWorkers)
		}
		return
	}
	if st.RunsOnLeader <= st.RunsOnWorkers {
		t.Fatalf("chained runs: %d on the leader, %d on the workers; want most on the leader", st.RunsOnLeader, st.RunsOnWorkers)
	}
	if load == "hot" {
		// One more probe than the groups allow may be under way when the backlog ends. A probe
		// whose second run found the first already committed (its worker was done before the
		// leader queued the next change: it depends on the machine's timing) saw no wait and
		// handed the runs back: each such hand-back starts the sequence over.
		handbacks := r.a.stats.eng.Handbacks.Load()
		once := plan.ChainRuns + 1 + 2*(probesAfter(int(st.RunsOnLeader))+1)
		if most := (handbacks + 1) * int64(once); st.RunsOnWorkers > most {
			t.Fatalf("hot runs: %d on the workers after %d groups on the leader, %d hand-backs; want at most %d (probes backing off)",
				st.RunsOnWorkers, st.RunsOnLeader, handbacks, most)
		}
		t.Logf("hot runs: %d hand-backs to the workers", handbacks)
	}
}

// probesAfter returns how many probes the leader makes in its first groups groups while its
// runs stay chained.
func probesAfter(groups int) int {
	n, every := 0, plan.ChainProbe
	for groups >= every {
		groups -= every
		n++
		every = min(2*every, plan.ChainProbeMax)
	}
	return n
}

// chainLoad runs, from three clients at once, 200 transactions each: chained, each appends to
// one of three rows of items (ids 1 to 3, which must exist) and inserts a row into the keyless
// events table, which shows a transaction applied twice; hot, 500 each, the same with row 1 only; independent, each inserts an item of
// its own; serial, each appends to one of three rows of dup (k 1 to 3, which must exist).
func chainLoad(ctx context.Context, dsn string, rng *rand.Rand, load string) error {
	const clients = 3
	txns := 200
	if load == "hot" {
		txns = 500
	}
	errs := make(chan error, clients)
	for c := range clients {
		seed := rng.Uint64()
		go func() {
			errs <- func() error {
				r := rand.New(rand.NewPCG(seed, 5))
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				for i := range txns {
					switch load {
					case "independent":
						if _, err := conn.Exec(ctx, `INSERT INTO items VALUES ($1, $2, '')`, 10+c*txns+i, r.IntN(100)); err != nil {
							return err
						}
						continue
					case "serial":
						if _, err := conn.Exec(ctx, `UPDATE dup SET v = v || $1 WHERE k = $2`, fmt.Sprintf(",%d.%d", c, i), 1+r.IntN(3)); err != nil {
							return err
						}
						continue
					}
					id := 1 + r.IntN(3)
					if load == "hot" {
						id = 1
					}
					err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `UPDATE items SET qty = qty + 1, note = note || $1 WHERE id = $2`,
							fmt.Sprintf(",%d.%d", c, i), id); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, strconv.Itoa(c), i)
						return err
					})
					if err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	return firstError(errs, clients)
}

// TestKillChained kills the applier process (SIGKILL), in Parallel with either commit order,
// while the leader commits a group of chained transactions (see TestParallelChained), and
// starts it again: the target must end equal to the source, nothing applied twice or lost.
func TestKillChained(t *testing.T) {
	for _, major := range testMajors {
		for _, order := range []CommitOrder{CommitSource, CommitRelaxed} {
			t.Run(fmt.Sprintf("pg%d/%v", major, order), func(t *testing.T) {
				e := newEnv(t, major)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items SELECT g, 0, '' FROM generate_series(1, 3) g`))
				must(t, chainLoad(ctx, e.src, seeded(t), "chained"))
				// Three runs of 8 on the workers, then groups of 8 on the leader: the 201st
				// commit (hooks count each transaction of a run or group) is a group's.
				cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Parallel, Workers: 4,
					WorkMem: 256 << 10, Stall: "before-commit", StallAfter: 200, RunTxns: 8, CommitOrder: order}
				first := startChild(t, cc)
				waitStalled(t, ctx, first)
				first.kill(t)
				cc.Stall = ""
				startChild(t, cc)
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
				waitMarkerCtx(t, ctx, e.dst, 1)
				e.compare(t)
			})
		}
	}
}
