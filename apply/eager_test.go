package apply

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spillcompress"
)

// TestEagerSpool runs three large transactions at once with one worker: one is applied by the
// worker, which starts on it only once its queue has overflowed the memory budget into spill
// files, and the others are spooled and applied at their commit. Savepoints roll back in all of them.
func TestEagerSpool(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cfg := e.config(t, Eager)
			cfg.Workers = 1
			cfg.Source.Buffer.WorkMem = 64 << 10 // shared by the queues and the reorder buffer
			if major == testMajors[len(testMajors)-1] {
				// The buffer's and the queues' spill files compressed, on one of the versions.
				cfg.Source.Buffer.SpillCompressor = spillcompress.S2()
			}
			// The worker's first record waits for the queue to spill (the Applier, once started).
			var applier atomic.Pointer[Applier]
			var waited atomic.Bool
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage != "record" || !x.Streamed || !waited.CompareAndSwap(false, true) {
					return nil
				}
				for a := applier.Load(); a == nil || a.Stats().QueueSpilled == 0; a = applier.Load() {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(5 * time.Millisecond): // polling the counter
					}
				}
				return nil
			}}
			r := start(t, cfg)
			applier.Store(r.a)
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
			// The queues and the reorder buffer share WorkMem: together at most WorkMem and what the
			// buffer cannot spill at a time (the part it hands out, at most partSize, and the chunk it
			// fills).
			if peak := r.a.BufferStats().PeakMemoryBytes; st.QueuePeakBytes == 0 || peak == 0 ||
				st.SharedPeakBytes < max(peak, st.QueuePeakBytes) || st.SharedPeakBytes > 2*cfg.Source.Buffer.WorkMem+64<<10 {
				t.Errorf("peak memory: queues %d bytes, reorder buffer %d, together %d: want queues and buffer > 0, "+
					"together at least either and within WorkMem %d and a part", st.QueuePeakBytes, peak, st.SharedPeakBytes, cfg.Source.Buffer.WorkMem)
			}
			// The rows of the subtransactions rolled back are not counted.
			if rows := pgtest.Count(t, e.dst, `SELECT (SELECT count(*) FROM big) + (SELECT count(*) FROM events) + (SELECT count(*) FROM marker)`); st.Inserts != int64(rows) {
				t.Errorf("Inserts %d, want the %d rows on the target", st.Inserts, rows)
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
				waitWorkerWrote(t, ctx, r, e.dst) // the streamed part is on the target, uncommitted
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
// transaction, while r's applier runs.
func waitWorkerWrote(t testing.TB, ctx context.Context, r *running, dsn string) {
	t.Helper()
	ctx, cancel := r.alive(ctx)
	defer cancel()
	if err := workerWrote(ctx, dsn); err != nil {
		t.Fatalf("no worker wrote: %v (%v)", err, context.Cause(ctx))
	}
}

// workerWrote waits until a worker connection of the target has written in its open
// transaction, or ctx ends.
func workerWrote(ctx context.Context, dsn string) error {
	return waitQuery(ctx, dsn, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND application_name LIKE 'pgreorder apply % w%' AND backend_xid IS NOT NULL`)
}

// waitQuery waits until sql, a count, counts something on dsn, or ctx ends.
func waitQuery(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for {
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond): // polling pg_stat_activity
		}
	}
}

// waitUniqueHeld waits until another transaction's uncommitted row holds qty in the target's
// unique index on items: a probe inserting that value then waits for it, and its lock_timeout
// ends the wait. A probe that inserts instead is rolled back, as every probe is.
func waitUniqueHeld(ctx context.Context, dsn string, qty int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '50ms'`)
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO items VALUES (-1, $1, 'probe')`, qty)
		}
		if rerr := tx.Rollback(ctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			return rerr
		}
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return nil // lock_not_available: the row is there, uncommitted
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond): // the row is not written yet
		}
	}
}

// TestParallelDeadlock makes two committed transactions applied at once by two workers deadlock
// through a unique index only the target has: the later one inserts u = 9 and waits for its turn
// to commit; the earlier one, held back before its first change, then inserts u = 9 too (and
// moves it to 10, so that in commit order both fit) and waits for the later one's lock. The
// watchdog must break the cycle; the later transaction is retried alone. Runs take one
// transaction each, so that the two go to two workers.
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
			cfg.runTxns = 1
			// The earlier transaction's first change waits until the later one's worker has
			// inserted u = 9 (not only prepared its statement): the earlier one, held back, has
			// not written yet, and the marker's transaction writes another table.
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "record" && x.Xid == earlier.Load() && held.CompareAndSwap(false, true) {
					return waitUniqueHeld(ctx, e.dst, 9)
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

// TestEagerSavepointFirst applies, with one worker, a streamed transaction whose first change is
// inside a savepoint and meets an insert_exists conflict while the transaction is open on the
// source, after the worker applied another streamed transaction: the conflict names its own
// source transaction, and last_update_wins compares the local row's commit time with that
// transaction's (not arrived yet: it commits after the local row), not with the previous one's.
func TestEagerSavepointFirst(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := conflictServer(t, major)
			e := conflictEnv(t, srv)
			var log pgtest.LockedBuffer
			cfg := e.conflictConfig(t, &log, map[conflict.Type]conflict.Resolution{conflict.InsertExists: conflict.LastUpdateWins})
			cfg.Mode, cfg.Workers = Eager, 1
			cfg.Conflicts.LogTable = "conflict_log"
			dropOrigins(t, e.dst, cfg.Origin)
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(log.String())
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r := start(t, cfg)
			// Applied before it: a small transaction (by the leader) and a streamed one (by the
			// worker), both committed before the local row.
			pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (1, 1, 'small')`,
				`INSERT INTO kv SELECT g, g, repeat('a', 200) FROM generate_series(1000, 2999) g`, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			pgtest.ExecAll(t, e.dst, `INSERT INTO kv VALUES (4, 40, 'local')`)

			src, err := pgx.Connect(ctx, e.src)
			must(t, err)
			defer src.Close(context.Background())
			var xid uint32
			for _, q := range []string{`BEGIN`, `SAVEPOINT first`, `INSERT INTO kv VALUES (4, 41, 'remote')`,
				// 6000 rows of 200 bytes: more than a worker keeps unsent while it waits for the next
				// part (target.Conn.SendAhead), so the run with the conflict goes before the commit.
				`RELEASE SAVEPOINT first`, `INSERT INTO kv SELECT g, g, repeat('b', 200) FROM generate_series(3000, 8999) g`} {
				_, err := src.Exec(ctx, q)
				must(t, err)
			}
			must(t, src.QueryRow(ctx, `SELECT txid_current()::bigint`).Scan(&xid))
			waitWorkerWrote(t, ctx, r, e.dst) // the conflict is met while the transaction is open
			var committed time.Time
			_, err = src.Exec(ctx, `COMMIT`)
			must(t, err)
			must(t, src.QueryRow(ctx, `SELECT pg_xact_commit_timestamp($1::text::xid)`, fmt.Sprint(xid)).Scan(&committed))
			pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (2)`)
			e.waitMarker(t, r, 2)
			e.settled(t, r)
			r.halt(t)

			if st := r.a.Stats(); st.InsertExists != 1 || st.Spooled != 0 {
				t.Fatalf("stats %+v: want 1 insert_exists, nothing spooled", st)
			}
			dst, err := pgx.Connect(ctx, e.dst)
			must(t, err)
			defer dst.Close(context.Background())
			var gotXid int64
			var gotTime time.Time
			must(t, dst.QueryRow(ctx, `SELECT remote_xid, remote_commit_ts FROM conflict_log WHERE conflict = 'insert_exists'`).
				Scan(&gotXid, &gotTime))
			if gotXid != int64(xid) || !gotTime.Equal(committed) {
				t.Errorf("conflict of source transaction %d committed at %s, want %d at %s", gotXid, gotTime, xid, committed)
			}
			var v string
			must(t, dst.QueryRow(ctx, `SELECT v FROM kv WHERE id = 4`).Scan(&v))
			if v != "remote" {
				t.Errorf("row 4 is %q: the source transaction committed after the local row, want its row", v)
			}
		})
	}
}

// TestSpillFilesSplit checks that the reorder buffer's and the queues' spill stores share one
// store's descriptor budget.
func TestSpillFilesSplit(t *testing.T) {
	n := spill.DefaultOpenFiles()
	if b, q := spillFiles(false); b != n || q != 0 {
		t.Errorf("Buffered: buffer %d files, queues %d, want %d and 0", b, q, n)
	}
	if b, q := spillFiles(true); b+q != n || b < 1 || q < 1 {
		t.Errorf("Eager: buffer %d files + queues %d, want %d, each at least 1", b, q, n)
	}
}
