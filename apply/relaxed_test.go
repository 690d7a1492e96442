package apply

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// independent commits n transactions on the source, one insert into the keyless events table
// each (src, 0..n-1): none depends on another, and one applied twice shows as a duplicate.
func independent(ctx context.Context, dsn, src string, n int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for i := range n {
		if _, err := conn.Exec(ctx, `INSERT INTO events VALUES ($1, $2)`, src, i); err != nil {
			return err
		}
	}
	return nil
}

// aheadSpans returns the number of spans the target's ahead table records for the slot.
func aheadSpans(t *testing.T, ctx context.Context, conn *pgx.Conn, slot string) int {
	t.Helper()
	var n int
	err := conn.QueryRow(ctx, `SELECT coalesce(sum(cardinality(spans)), 0) / 2 FROM pgreorder_apply_progress_ahead WHERE slot = $1`,
		slot).Scan(&n)
	if err != nil {
		t.Fatalf("reading the ahead table: %v", err)
	}
	return n
}

// TestKillRelaxed kills the applier (SIGKILL) with relaxed commit order while transactions are
// committed on the target ahead of an earlier one that stalls before its commit, and starts it
// again, relaxed, or in Buffered (any mode must skip what was committed ahead): every transaction
// must be on the target once (the keyless events table shows a duplicate, items' key a
// conflict). Then the same with kills at random moments (the seed is logged) while many
// independent and dependent transactions are in flight.
func TestKillRelaxed(t *testing.T) {
	for _, major := range testMajors {
		for _, restart := range []Mode{Parallel, Buffered} {
			t.Run(fmt.Sprintf("pg%d/stalled/restart-%v", major, restart), func(t *testing.T) {
				e := newEnv(t, major)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Parallel, Workers: 4, WorkMem: 256 << 10,
					CommitOrder: CommitRelaxed, RunTxns: 1, Stall: "before-commit", StallAfter: 5, StallOnce: true}
				first := startChild(t, cc)
				done := make(chan error, 1)
				go func() { done <- independent(ctx, e.src, "r", 300) }()
				waitStalled(t, ctx, first)
				conn, err := pgx.Connect(ctx, e.dst)
				must(t, err)
				defer conn.Close(context.Background())
				// The workers commit past the stalled transaction and record it.
				for aheadSpans(t, ctx, conn, e.slot) < 20 {
					select {
					case err := <-first.done:
						t.Fatalf("the child stopped: %v", err)
					case <-ctx.Done():
						t.Fatal("no transactions committed ahead of the stalled one")
					case <-time.After(10 * time.Millisecond):
					}
				}
				first.kill(t)
				t.Logf("killed with %d spans committed ahead", aheadSpans(t, ctx, conn, e.slot))
				must(t, <-done)
				cc.Stall, cc.Mode = "", restart
				if restart != Parallel {
					cc.CommitOrder = CommitSource
				}
				startChild(t, cc)
				must(t, independent(ctx, e.src, "after", 20))
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
				waitMarkerCtx(t, ctx, e.dst, 1)
				e.compare(t)
			})
		}
		t.Run(fmt.Sprintf("pg%d/random", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			rng := seeded(t)
			runTxns := []int{0, 1, 4}[rng.IntN(3)]
			cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Parallel, Workers: 4, WorkMem: 256 << 10,
				CommitOrder: CommitRelaxed, RunTxns: runTxns}
			t.Logf("runs of at most %d transactions (0: the default)", runTxns)
			ch := startChild(t, cc)
			done := make(chan error, 2)
			go func() { done <- independent(ctx, e.src, "r", 600) }()
			go func() { done <- concurrent(ctx, e.src, rand.New(rand.NewPCG(rng.Uint64(), 2)), 3, 150) }()
			conn, err := pgx.Connect(ctx, e.dst)
			must(t, err)
			defer conn.Close(context.Background())
			applied := func() int {
				var n int
				must(t, conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE src = 'r'`).Scan(&n))
				return n
			}
			for k := range 3 {
				// A random moment: once the target holds a random number more of them (at most
				// all of them: the load may be over already).
				want := min(applied()+20+rng.IntN(120), 600)
				for applied() < want {
					select {
					case err := <-ch.done:
						t.Fatalf("the child stopped: %v", err)
					case <-ctx.Done():
						t.Fatalf("timed out waiting for %d transactions", want)
					case <-time.After(time.Duration(rng.IntN(10)) * time.Millisecond):
					}
				}
				ch.kill(t)
				t.Logf("kill %d: %d transactions applied, %d spans committed ahead", k+1, applied(), aheadSpans(t, ctx, conn, e.slot))
				ch = startChild(t, cc)
			}
			for range 2 {
				must(t, <-done)
			}
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			waitMarkerCtx(t, ctx, e.dst, 1)
			// The marker, independent of the rest, may commit ahead of earlier transactions.
			e.waitSame(t)
			e.compare(t)
		})
	}
}

// TestRelaxedDependent applies, with relaxed commit order, transactions that append to three
// rows (each value computed from the one before, so that two applied out of order leave the
// wrong value) among many independent ones, from several clients at once, into a target whose
// progress table was made by an old version (slot, end_lsn): the target must end equal to the
// source. The rows' transactions depend on each other and must keep their order.
func TestRelaxedDependent(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major, `CREATE TABLE pgreorder_apply_progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL)`)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items SELECT g, 0, '' FROM generate_series(1, 3) g`))
			cfg := e.config(t, Parallel)
			cfg.CommitOrder, cfg.Workers, cfg.runTxns = CommitRelaxed, 4, 1
			r := start(t, cfg)
			rng := seeded(t)
			const clients, txns = 3, 150
			errs := make(chan error, clients+1)
			go func() { errs <- independent(ctx, e.src, "r", 400) }()
			for c := range clients {
				seed := rng.Uint64()
				go func() {
					errs <- func() error {
						r := rand.New(rand.NewPCG(seed, 3))
						conn, err := pgx.Connect(ctx, e.src)
						if err != nil {
							return err
						}
						defer conn.Close(context.Background())
						for i := range txns {
							id := 1 + r.IntN(3)
							_, err := conn.Exec(ctx, `UPDATE items SET qty = qty + 1, note = note || $1 WHERE id = $2`,
								fmt.Sprintf(",%d.%d", c, i), id)
							if err != nil {
								return err
							}
						}
						return nil
					}()
				}()
			}
			for range clients + 1 {
				must(t, <-errs)
			}
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			e.waitSame(t)
			r.halt(t)
			e.compare(t)
			st := r.a.Stats()
			t.Logf("%d commits ahead of an earlier transaction; stats %+v", st.CommittedAhead, st)
			if st.CommittedAhead == 0 {
				t.Log("no transaction committed ahead of an earlier one: the order was never relaxed")
			}
		})
	}
}

// TestRelaxedConfig: relaxed commit order is Parallel's only; other modes refuse it, naming it.
func TestRelaxedConfig(t *testing.T) {
	base := Config{Source: replication.Config{ConnString: "host=/nonexistent", Slot: "s", Publications: []string{"p"}}, Target: "host=/nonexistent"}
	for _, mode := range []Mode{Buffered, Eager} {
		cfg := base
		cfg.Mode, cfg.CommitOrder = mode, CommitRelaxed
		_, err := New(cfg)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("%v with CommitRelaxed: %v, want ErrInvalidConfig", mode, err)
		}
		t.Log(err)
	}
	cfg := base
	cfg.Mode, cfg.CommitOrder = Parallel, CommitRelaxed
	if _, err := New(cfg); err != nil {
		t.Fatalf("Parallel with CommitRelaxed: %v", err)
	}
	cfg.CommitOrder = 7
	if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("CommitOrder 7: %v", err)
	}
	if o, err := ParseCommitOrder("Relaxed"); err != nil || o != CommitRelaxed {
		t.Fatalf("ParseCommitOrder: %v %v", o, err)
	}
	if _, err := ParseCommitOrder("loose"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("ParseCommitOrder(loose): %v", err)
	}
}

// TestRelaxedHeld holds, with relaxed commit order, one transaction X (an update of a row) before
// its first change until 50 later, independent transactions committed ahead of it, while a
// transaction D that updates the same row after X waits: D must commit after X, or the row ends
// with X's value instead of D's. The independent ones must not wait for X.
func TestRelaxedHeld(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items VALUES (1, 0, '')`))
			var held atomic.Uint32 // X's xid, once known
			var commits atomic.Int32
			release := make(chan struct{})
			cfg := e.config(t, Parallel)
			cfg.CommitOrder, cfg.Workers, cfg.runTxns = CommitRelaxed, 4, 1
			var once sync.Once
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				switch {
				case stage == "record" && x.Xid != 0 && x.Xid == held.Load():
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				case stage == "after-commit" && held.Load() != 0 && x.Xid != held.Load():
					if commits.Add(1) == 50 {
						once.Do(func() { close(release) })
					}
				}
				return nil
			}}
			conn, err := pgx.Connect(ctx, e.src)
			must(t, err)
			defer conn.Close(context.Background())
			var xid uint32
			tx, err := conn.Begin(ctx)
			must(t, err)
			must(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint % 4294967296`).Scan(&xid))
			_, err = tx.Exec(ctx, `UPDATE items SET note = note || 'X' WHERE id = 1`)
			must(t, err)
			held.Store(xid)
			r := start(t, cfg)
			must(t, tx.Commit(ctx))
			_, err = conn.Exec(ctx, `UPDATE items SET note = note || 'D' WHERE id = 1`)
			must(t, err)
			must(t, independent(ctx, e.src, "r", 100))
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			e.waitSame(t)
			r.halt(t)
			e.compare(t)
			if n := commits.Load(); n < 50 {
				t.Errorf("%d transactions committed while X was held, want 50 at least", n)
			}
			t.Logf("stats %+v", r.a.Stats())
		})
	}
}
