package apply

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/pgtest"
)

// TestEagerSpool runs three large transactions at once with one worker: one is applied by the
// worker, slowly enough that its queue overflows the memory budget into spill files, and the
// others are spooled and applied at their commit. Savepoints roll back in all of them.
func TestEagerSpool(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cfg := e.config(t, Eager)
			cfg.Workers = 1
			cfg.WorkMem = 64 << 10 // queues: 256 KiB
			var slowed atomic.Int64
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "record" && x.Streamed && slowed.Add(1) < 400 {
					time.Sleep(2 * time.Millisecond)
				}
				return nil
			}}
			r := start(t, cfg)
			conns := make([]*pgx.Conn, 3)
			for i := range conns {
				c, err := pgx.Connect(ctx, e.src)
				must(t, err)
				defer c.Close(context.Background())
				conns[i] = c
				_, err = c.Exec(ctx, `BEGIN`)
				must(t, err)
			}
			for round := range 4 {
				for i, c := range conns {
					lo := (i*10+round)*1000 + 1
					for _, q := range []string{
						fmt.Sprintf(`SAVEPOINT r%d`, round),
						fmt.Sprintf(`INSERT INTO big SELECT g, %d, repeat('p', 200) FROM generate_series(%d, %d) g`, i, lo, lo+399),
						fmt.Sprintf(`INSERT INTO events VALUES ('spool %d', %d)`, i, round),
					} {
						_, err := c.Exec(ctx, q)
						must(t, err)
					}
					if round%2 == i%2 {
						_, err := c.Exec(ctx, fmt.Sprintf(`ROLLBACK TO SAVEPOINT r%d`, round))
						must(t, err)
					}
				}
			}
			for i, c := range conns {
				_, err := c.Exec(ctx, `UPDATE big SET payload = 'done' WHERE chunk = $1 AND id % 3 = 0`, i)
				must(t, err)
				_, err = c.Exec(ctx, `COMMIT`)
				must(t, err)
			}
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			r.halt(t)
			e.compare(t)
			st := r.a.Stats()
			t.Logf("stats %+v", st)
			if st.Spooled == 0 || st.QueueSpilled == 0 || st.SubAborts == 0 {
				t.Errorf("spooled %d, queue bytes spilled %d, subtransactions rolled back %d: want all > 0", st.Spooled, st.QueueSpilled, st.SubAborts)
			}
		})
	}
}

// TestEagerDeadlock makes a transaction that commits first wait for a lock of a streamed
// transaction that commits later, through a unique index only the target has: the streamed one
// inserted u = 5 and is waiting for more changes; the small one inserts u = 5 too (and then
// moves it, so that applied in commit order both fit). The target cannot see the cycle; the
// watchdog must break it, and the streamed transaction is applied again, alone, at its commit.
func TestEagerDeadlock(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Eager, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := newEnv(t, major, `CREATE UNIQUE INDEX uniq_u ON items (qty)`)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				r := start(t, e.config(t, mode))
				big, err := pgx.Connect(ctx, e.src)
				must(t, err)
				defer big.Close(context.Background())
				for _, q := range []string{`BEGIN`, `INSERT INTO items VALUES (1, 5, 'big')`,
					`INSERT INTO big SELECT g, 0, repeat('b', 200) FROM generate_series(1, 2000) g`} {
					_, err := big.Exec(ctx, q)
					must(t, err)
				}
				waitWorkerWrote(t, ctx, e.dst) // the streamed part is on the target, uncommitted
				must(t, pgtest.Exec(ctx, e.src, `BEGIN; INSERT INTO items VALUES (2, 5, 'small'); UPDATE items SET qty = 6 WHERE id = 2; COMMIT`))
				_, err = big.Exec(ctx, `COMMIT`)
				must(t, err)
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
				e.waitMarker(t, r, 1)
				r.halt(t)
				e.compare(t)
				st := r.a.Stats()
				t.Logf("stats %+v", st)
				if st.Deadlocks == 0 || st.SerialRetries == 0 {
					t.Errorf("deadlocks broken %d, serial retries %d: want both > 0", st.Deadlocks, st.SerialRetries)
				}
			})
		}
	}
}

// waitWorkerWrote waits until a worker connection of the target has written in its open
// transaction.
func waitWorkerWrote(t testing.TB, ctx context.Context, dsn string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer conn.Close(context.Background())
	for {
		var n int
		must(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name LIKE 'pgreorder apply % w%' AND backend_xid IS NOT NULL`).Scan(&n))
		if n > 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("no worker wrote")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestParallelDeadlock makes two committed transactions applied at once by two workers deadlock
// through a unique index only the target has: the later one inserts u = 9 and waits for its turn
// to commit; the earlier one, held back before its first change, then inserts u = 9 too (and
// moves it to 10, so that in commit order both fit) and waits for the later one's lock. The
// watchdog must break the cycle; the later transaction is retried alone.
func TestParallelDeadlock(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major, `CREATE UNIQUE INDEX uniq_u ON items (qty)`)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			conn, err := pgx.Connect(ctx, e.src)
			must(t, err)
			defer conn.Close(context.Background())
			var earlier atomic.Uint32
			var held atomic.Bool
			cfg := e.config(t, Parallel)
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "record" && x.Xid == earlier.Load() && held.CompareAndSwap(false, true) {
					time.Sleep(500 * time.Millisecond)
				}
				return nil
			}}
			var xid uint32
			_, err = conn.Exec(ctx, `BEGIN`)
			must(t, err)
			must(t, conn.QueryRow(ctx, `SELECT txid_current()::bigint`).Scan(&xid))
			earlier.Store(xid)
			for _, q := range []string{`INSERT INTO items VALUES (22, 9, 'earlier')`, `UPDATE items SET qty = 10 WHERE id = 22`, `COMMIT`} {
				_, err := conn.Exec(ctx, q)
				must(t, err)
			}
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items VALUES (21, 9, 'later')`, `INSERT INTO marker VALUES (1)`))
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			r.halt(t)
			e.compare(t)
			st := r.a.Stats()
			t.Logf("stats %+v", st)
			if !held.Load() || st.Deadlocks == 0 || st.SerialRetries == 0 {
				t.Errorf("held %v, deadlocks broken %d, serial retries %d: want all", held.Load(), st.Deadlocks, st.SerialRetries)
			}
		})
	}
}
