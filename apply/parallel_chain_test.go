package apply

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestParallelChained replays in Parallel, in both commit orders, a backlog of small runs
// (Config.runTxns) of two kinds. Chained: every transaction appends to one of three rows (each
// value computed from the one before, so that two applied out of order leave the wrong value),
// so each run waits for the run before it: after a few runs on the workers the leader applies
// most of them itself, as groups. Independent: every transaction inserts a row of its own, so
// no run waits for another: they all go to the workers. The target must end equal to the
// source either way.
func TestParallelChained(t *testing.T) {
	for _, major := range testMajors {
		for _, order := range []CommitOrder{CommitSource, CommitRelaxed} {
			for _, chained := range []bool{true, false} {
				name := fmt.Sprintf("pg%d/%v/chained=%v", major, order, chained)
				t.Run(name, func(t *testing.T) { testParallelChained(t, major, order, chained) })
			}
		}
	}
}

func testParallelChained(t *testing.T, major int, order CommitOrder, chained bool) {
	e := newEnv(t, major)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items SELECT g, 0, '' FROM generate_series(1, 3) g`))
	// The backlog is made before the applier starts: the leader is behind, its runs full.
	rng := seeded(t)
	const clients, txns = 3, 200
	errs := make(chan error, clients)
	for c := range clients {
		seed := rng.Uint64()
		go func() {
			errs <- func() error {
				r := rand.New(rand.NewPCG(seed, 5))
				conn, err := pgx.Connect(ctx, e.src)
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				for i := range txns {
					if chained {
						_, err = conn.Exec(ctx, `UPDATE items SET qty = qty + 1, note = note || $1 WHERE id = $2`,
							fmt.Sprintf(",%d.%d", c, i), 1+r.IntN(3))
					} else {
						_, err = conn.Exec(ctx, `INSERT INTO items VALUES ($1, $2, '')`, 10+c*txns+i, r.IntN(100))
					}
					if err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range clients {
		must(t, <-errs)
	}
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	cfg := e.config(t, Parallel)
	cfg.CommitOrder, cfg.Workers, cfg.runTxns = order, 4, 8
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	r.halt(t)
	e.compare(t)
	st := r.a.Stats()
	t.Logf("%d runs on the leader, %d on the workers; stats %+v", st.RunsOnLeader, st.RunsOnWorkers, st)
	if st.SerialRetries != 0 {
		t.Errorf("%d serial retries", st.SerialRetries)
	}
	if !chained {
		if st.RunsOnLeader != 0 || st.RunsOnWorkers == 0 {
			t.Fatalf("independent runs: %d on the leader, %d on the workers; want all on the workers", st.RunsOnLeader, st.RunsOnWorkers)
		}
		return
	}
	if st.RunsOnLeader <= st.RunsOnWorkers {
		t.Fatalf("chained runs: %d on the leader, %d on the workers; want most on the leader", st.RunsOnLeader, st.RunsOnWorkers)
	}
}
