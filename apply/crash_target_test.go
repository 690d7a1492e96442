package apply

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// TestTargetCrash stops the target server immediately (pg_ctl stop -m immediate) three times at
// random moments while the Applier applies a stream of small transactions on a few hot rows (and
// large, streamed ones with savepoints, a keyless table and TRUNCATE) with asynchronous commits,
// in every mode, and restarts it. The target keeps fsync on and commits asynchronously only as the
// Applier asks, with wal_writer_delay at its longest (10s), so an asynchronous commit the target
// has not flushed really is lost by the crash. Each crash comes at a random moment (after a random
// number of transactions), as soon as the slot's confirmed position moves. After each crash, every
// source transaction the slot confirmed (its acknowledgement reached the source) must be on the
// target; at the end the target must hold exactly the source's rows, none lost, none twice.
func TestTargetCrash(t *testing.T) {
	for _, mode := range faultModes {
		t.Run(mode.String(), func(t *testing.T) { testTargetCrash(t, mode, CommitSource) })
	}
	// Relaxed: the small transactions touch five rows, so most depend on one in flight; the big
	// ones' rows and the events' inserts do not.
	t.Run("parallel-relaxed", func(t *testing.T) { testTargetCrash(t, Parallel, CommitRelaxed) })
}

// crashes is how many times TestTargetCrash crashes the target in each mode.
const crashes = 3

func testTargetCrash(t *testing.T, mode Mode, order CommitOrder) {
	// From the newest version to the oldest installed.
	majors := pgtest.Majors(t)
	major := majors[len(majors)-1]
	var in pgtest.Install
	for _, i := range pgtest.FindInstalls() {
		if i.Major == majors[0] {
			in = i
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	srcDB := pgtest.NewDatabase(t, srv)
	src, repl := srv.ConnString(srcDB), srv.ReplicationConnString(srcDB)
	dstSrv, err := pgtest.Start(ctx, in, pgtest.Options{Durable: true, Settings: map[string]string{
		"wal_writer_delay": "10s", // the longest: an unflushed asynchronous commit stays unwritten
	}})
	must(t, err)
	t.Cleanup(func() { dstSrv.Stop() })
	dst := dstSrv.ConnString("postgres")
	ddl := []string{
		`CREATE TABLE events (src text NOT NULL, seq int NOT NULL)`, // no key: a duplicate shows
		`CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)`,
		`CREATE TABLE big (id int PRIMARY KEY, payload text NOT NULL)`,
		`CREATE TABLE dup (k int, v text)`, `ALTER TABLE dup REPLICA IDENTITY FULL`,
		`CREATE TABLE trunc (id int PRIMARY KEY)`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	must(t, pgtest.Exec(ctx, src, append(append([]string{}, ddl...),
		`INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 5) g`,
		`CREATE PUBLICATION pub FOR ALL TABLES`,
		`SELECT pg_create_logical_replication_slot('crash', 'pgoutput')`)...))
	must(t, pgtest.Exec(ctx, dst, append(append([]string{}, ddl...), `INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 5) g`)...))

	rng := seeded(t)
	cfg := Config{
		Source:      replication.Config{ConnString: repl, Slot: "crash", Publications: []string{"pub"}, StatusInterval: 100 * time.Millisecond, Buffer: reorderbuffer.Config{WorkMem: 256 << 10}},
		Target:      dst,
		Mode:        mode,
		CommitOrder: order,
		Logger:      testLog(t),
	}
	r := start(t, cfg)

	// The workload: small transactions, each recording after its commit the source's WAL
	// insert position, which is at or past its end LSN; a transaction whose recorded position
	// is at or before the slot's confirmed position was acknowledged.
	var (
		mu     sync.Mutex
		after  []decoding.LSN // after[i]: the insert position after transaction i committed
		stop   = make(chan struct{})
		wlDone = make(chan error, 2)
	)
	go func() {
		wlDone <- func() error {
			conn, err := pgconn.Connect(ctx, src)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			// Paced so that the Applier keeps up: it then commits each transaction as it
			// arrives, asynchronously, and makes them durable when the stream goes idle.
			pace := time.NewTicker(4 * time.Millisecond)
			defer pace.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				case <-pace.C:
				}
				sql := fmt.Sprintf(`BEGIN; INSERT INTO events VALUES ('w', %d); UPDATE accounts SET balance = balance + 1 WHERE id = %d;
					COMMIT; SELECT pg_current_wal_insert_lsn()::text`, i, 1+i%5)
				res, err := conn.Exec(ctx, sql).ReadAll()
				if err != nil {
					return err
				}
				var l decoding.LSN
				if err := l.UnmarshalText(res[len(res)-1].Rows[0][0]); err != nil {
					return err
				}
				mu.Lock()
				after = append(after, l)
				mu.Unlock()
			}
		}()
	}()
	go func() { // large transactions, streamed by the source
		wlDone <- func() error {
			conn, err := pgconn.Connect(ctx, src)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				case <-time.After(300 * time.Millisecond):
				}
				// Streamed, with a savepoint rolled back every other time, a keyless table
				// (REPLICA IDENTITY FULL) and, every third time, a TRUNCATE.
				end := "RELEASE SAVEPOINT s"
				if i%2 == 1 {
					end = "ROLLBACK TO SAVEPOINT s"
				}
				trunc := ""
				if i%3 == 2 {
					trunc = "TRUNCATE trunc;"
				}
				sql := fmt.Sprintf(`BEGIN; INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(%[1]d, %[1]d + 299) g;
					SAVEPOINT s; INSERT INTO big SELECT g, repeat('y', 200) FROM generate_series(%[1]d + 300, %[1]d + 599) g;
					INSERT INTO dup VALUES (%[2]d %% 3, 'v'); %[3]s;
					UPDATE dup SET v = v || '+' WHERE ctid = (SELECT ctid FROM dup WHERE k = %[2]d %% 3 LIMIT 1);
					%[4]s INSERT INTO trunc VALUES (%[2]d); COMMIT`, i*1000+1, i, end, trunc)
				if err := conn.Exec(ctx, sql).Close(); err != nil {
					return fmt.Errorf("%s: %w", sql, err)
				}
			}
		}()
	}()

	applied := func() int { // transactions of the small workload on the target, or -1
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := pgconn.Connect(qctx, dst)
		if err != nil {
			return -1
		}
		defer conn.Close(context.Background())
		res, err := conn.Exec(qctx, `SELECT count(*) FROM events WHERE src = 'w'`).ReadAll()
		if err != nil {
			return -1
		}
		n, _ := strconv.Atoi(string(res[0].Rows[0][0]))
		return n
	}
	mon, err := pgx.Connect(ctx, src)
	must(t, err)
	defer mon.Close(context.Background())
	lost := map[int]bool{}
	for crash := range crashes {
		// A random moment: once the Applier has applied a random number of transactions more.
		want := max(applied(), 0) + 50 + rng.IntN(200)
		for applied() < want {
			select {
			case err := <-r.done:
				r.stop = nil
				t.Fatalf("apply stopped: %v", err)
			case err := <-wlDone:
				t.Fatalf("workload: %v", err)
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %d transactions on the target (stats %+v)", want, r.a.Stats())
			case <-time.After(time.Duration(rng.IntN(20)) * time.Millisecond):
			}
		}
		// The moment the slot confirms more: the Applier has just acknowledged transactions,
		// which an Applier that acknowledges unflushed commits would lose now.
		c0 := confirmedOn(t, ctx, mon, "crash")
		for confirmedOn(t, ctx, mon, "crash") == c0 {
			select {
			case err := <-r.done:
				r.stop = nil
				t.Fatalf("apply stopped: %v", err)
			case <-ctx.Done():
				t.Fatalf("timed out waiting for the slot to move past %s", c0)
			default:
			}
		}
		dstSrv.Crash()
		confirmed := slotConfirmed(t, ctx, src, "crash")
		must(t, dstSrv.Restart(ctx))
		// Every transaction acknowledged before the crash must have survived it: the source never
		// sends it again.
		mu.Lock()
		var acked []int
		for i, l := range after {
			if l <= confirmed {
				acked = append(acked, i)
			}
		}
		mu.Unlock()
		have := targetSeqs(t, ctx, dst)
		var missing []int
		for _, i := range acked {
			if !have[i] {
				missing = append(missing, i)
			}
		}
		for _, i := range missing {
			lost[i] = true
		}
		t.Logf("crash %d: slot confirmed %s, %d transactions acknowledged, %d on the target, %d acknowledged and lost %v",
			crash+1, confirmed, len(acked), len(have), len(missing), head(missing, 20))
	}
	close(stop)
	for range 2 {
		must(t, <-wlDone)
	}
	must(t, pgtest.Exec(ctx, src, `INSERT INTO marker VALUES (1)`))
	e := &env{src: src, dst: dst}
	e.waitMarker(t, r, 1)
	compared := []string{"events", "accounts", "big", "dup", "trunc", "marker"}
	e.waitSame(t, compared...)
	r.halt(t)
	if len(lost) > 0 {
		t.Errorf("%d acknowledged transactions were lost by the target's crashes", len(lost))
	}
	mu.Lock()
	n := len(after)
	mu.Unlock()
	compareTables(t, ctx, src, dst, compared)
	t.Logf("%d small transactions; stats %+v", n, r.a.Stats())
}

// slotConfirmed returns the slot's confirmed_flush_lsn.
func slotConfirmed(t testing.TB, ctx context.Context, dsn, slot string) decoding.LSN {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer conn.Close(context.Background())
	return confirmedOn(t, ctx, conn, slot)
}

// confirmedOn returns the slot's confirmed_flush_lsn, read on conn.
func confirmedOn(t testing.TB, ctx context.Context, conn *pgx.Conn, slot string) decoding.LSN {
	t.Helper()
	var l decoding.LSN
	must(t, conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1
		AND database = current_database()`, slot).Scan(&l))
	return l
}

// targetSeqs returns the small workload's transactions on the target.
func targetSeqs(t testing.TB, ctx context.Context, dsn string) map[int]bool {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT seq FROM events WHERE src = 'w'`)
	must(t, err)
	have := map[int]bool{}
	for rows.Next() {
		var i int
		must(t, rows.Scan(&i))
		have[i] = true
	}
	must(t, rows.Err())
	return have
}

// compareTables fails t unless each table holds the same rows (as a multiset) on both sides.
func compareTables(t testing.TB, ctx context.Context, src, dst string, tables []string) {
	t.Helper()
	for _, table := range tables {
		q := fmt.Sprintf(`SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM %s t`, table)
		var n [2]int
		var h [2]string
		for i, dsn := range []string{src, dst} {
			conn, err := pgx.Connect(ctx, dsn)
			must(t, err)
			must(t, conn.QueryRow(ctx, q).Scan(&n[i], &h[i]))
			conn.Close(context.Background())
		}
		if n[0] != n[1] || h[0] != h[1] {
			t.Errorf("%s: source has %d rows, target %d (contents differ)", table, n[0], n[1])
		}
	}
}

func head(xs []int, n int) []int { return xs[:min(n, len(xs))] }
