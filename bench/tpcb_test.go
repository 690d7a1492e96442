package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// A TPC-B-like load generator, as pgbench's default script: each transaction adds a random
// delta to a random account, reads it back, adds it to a random teller and branch, and
// records it in the history table. The tables and their initial contents are pgbench's
// (pgbench -i -s SCALE): SCALE branches, 10 tellers and 100,000 accounts per branch, all
// balances 0, history empty.

// tpcbSchema creates pgbench's tables, loads them at the given scale and adds their primary
// keys after the load, as pgbench -i does. bench_marker, also published, receives one row at
// the end of a backlog.
func tpcbSchema(scale int) []string {
	return []string{
		"CREATE TABLE pgbench_branches (bid int NOT NULL, bbalance int, filler char(88)) WITH (fillfactor = 100)",
		"CREATE TABLE pgbench_tellers (tid int NOT NULL, bid int, tbalance int, filler char(84)) WITH (fillfactor = 100)",
		"CREATE TABLE pgbench_accounts (aid int NOT NULL, bid int, abalance int, filler char(84)) WITH (fillfactor = 100)",
		"CREATE TABLE pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22))",
		"CREATE TABLE bench_marker (id int PRIMARY KEY)",
		fmt.Sprintf("INSERT INTO pgbench_branches SELECT i, 0, '' FROM generate_series(1, %d) i", scale),
		fmt.Sprintf("INSERT INTO pgbench_tellers SELECT i, (i - 1) / 10 + 1, 0, '' FROM generate_series(1, %d) i", 10*scale),
		fmt.Sprintf("INSERT INTO pgbench_accounts SELECT i, (i - 1) / 100000 + 1, 0, '' FROM generate_series(1, %d) i", 100000*scale),
		"ALTER TABLE pgbench_branches ADD PRIMARY KEY (bid)",
		"ALTER TABLE pgbench_tellers ADD PRIMARY KEY (tid)",
		"ALTER TABLE pgbench_accounts ADD PRIMARY KEY (aid)",
		"VACUUM ANALYZE",
	}
}

// tpcbReset brings the tables back to their initial contents (every balance was 0) without
// reloading them, and vacuums them so that every run starts from the same state.
var tpcbReset = []string{
	"UPDATE pgbench_accounts SET abalance = 0 WHERE abalance <> 0",
	"UPDATE pgbench_tellers SET tbalance = 0 WHERE tbalance <> 0",
	"UPDATE pgbench_branches SET bbalance = 0 WHERE bbalance <> 0",
	"TRUNCATE pgbench_history, bench_marker",
	"VACUUM ANALYZE pgbench_accounts, pgbench_tellers, pgbench_branches, pgbench_history",
	"CHECKPOINT",
}

// tpcbFingerprint is a query whose one row summarizes the tables: equal rows on the publisher
// and the subscriber mean the same balances and the same history.
const tpcbFingerprint = `SELECT
	(SELECT md5(coalesce(string_agg(aid || ':' || abalance, ',' ORDER BY aid), '')) FROM pgbench_accounts WHERE abalance <> 0),
	(SELECT md5(coalesce(string_agg(tid || ':' || tbalance, ',' ORDER BY tid), '')) FROM pgbench_tellers),
	(SELECT md5(coalesce(string_agg(bid || ':' || bbalance, ',' ORDER BY bid), '')) FROM pgbench_branches),
	(SELECT count(*) || ' rows, delta ' || coalesce(sum(delta), 0) || ', aid ' || coalesce(sum(aid), 0) FROM pgbench_history),
	(SELECT count(*) FROM bench_marker)`

// setupTPCB loads the tables on both servers and publishes them.
func setupTPCB(scale int) func(ctx context.Context, p *pair) error {
	return func(ctx context.Context, p *pair) error {
		t0 := time.Now()
		if err := pgtest.Exec(ctx, p.pubAdmin(benchDB), tpcbSchema(scale)...); err != nil {
			return err
		}
		if err := pgtest.Exec(ctx, p.pubAdmin(benchDB),
			"CREATE PUBLICATION pub FOR TABLE pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history, bench_marker"); err != nil {
			return err
		}
		if err := pgtest.Exec(ctx, p.sub.ConnString(benchDB), tpcbSchema(scale)...); err != nil {
			return err
		}
		p.tb.Logf("pgbench tables at scale %d loaded on both servers in %v", scale, time.Since(t0).Round(time.Millisecond))
		return nil
	}
}

// tpcbLoad runs clients concurrent sessions of txns transactions each against connString.
// Client i draws its values from a generator seeded with (seed, i).
type tpcbLoad struct {
	scale, clients, txns int
	seed                 uint64
}

func (l tpcbLoad) name() string        { return fmt.Sprintf("load=pgbench-s%d", l.scale) }
func (l tpcbLoad) size() (int, int)    { return l.clients, l.txns }
func (l tpcbLoad) reset() []string     { return tpcbReset }
func (l tpcbLoad) fingerprint() string { return tpcbFingerprint }
func (l tpcbLoad) setup(ctx context.Context, p *pair) error {
	return setupTPCB(l.scale)(ctx, p)
}
func (l tpcbLoad) withSeed(seed uint64) catchupLoad { l.seed = seed; return l }

// run makes the backlog and returns how long it took.
func (l tpcbLoad) run(ctx context.Context, connString string) (time.Duration, error) {
	return runClients(ctx, connString, l.clients, l.txns, l.seed, l.txn)
}

// runClients runs clients concurrent sessions of txns transactions each against connString,
// each transaction written by txn as one query string; client i draws its values from a
// generator seeded with (seed, i). It returns how long they took.
func runClients(ctx context.Context, connString string, clients, txns int, seed uint64, txn func(*strings.Builder, *rand.Rand)) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conns := make([]*pgconn.PgConn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		c, err := pgconn.Connect(ctx, connString)
		if err != nil {
			return 0, err
		}
		conns[i] = c
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	t0 := time.Now()
	for i, c := range conns {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			var sql strings.Builder
			for range txns {
				sql.Reset()
				txn(&sql, rng)
				if _, err := c.Exec(ctx, sql.String()).ReadAll(); err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// txn writes pgbench's TPC-B-like transaction with random values, sent as one query string.
func (l tpcbLoad) txn(w *strings.Builder, rng *rand.Rand) {
	aid := 1 + rng.IntN(100000*l.scale)
	bid := 1 + rng.IntN(l.scale)
	tid := 1 + rng.IntN(10*l.scale)
	delta := rng.IntN(10001) - 5000
	fmt.Fprintf(w, "BEGIN;"+
		"UPDATE pgbench_accounts SET abalance = abalance + %[4]d WHERE aid = %[1]d;"+
		"SELECT abalance FROM pgbench_accounts WHERE aid = %[1]d;"+
		"UPDATE pgbench_tellers SET tbalance = tbalance + %[4]d WHERE tid = %[3]d;"+
		"UPDATE pgbench_branches SET bbalance = bbalance + %[4]d WHERE bid = %[2]d;"+
		"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (%[3]d, %[2]d, %[1]d, %[4]d, CURRENT_TIMESTAMP);"+
		"END;", aid, bid, tid, delta)
}

// simpleUpdateLoad is pgbench's builtin simple-update script (pgbench -b simple-update) on the
// same tables as tpcbLoad: each transaction adds a random delta to a random account, reads it
// back and records it in the history table, leaving tellers and branches alone. Two row changes
// per transaction and no hot rows: with 100,000×scale accounts, two transactions of a backlog
// seldom touch the same row, so grouping has little to merge and each transaction's fixed costs
// (its statements, its commit) are most of its apply.
type simpleUpdateLoad struct{ tpcbLoad }

func (l simpleUpdateLoad) name() string                     { return fmt.Sprintf("load=simple-update-s%d", l.scale) }
func (l simpleUpdateLoad) withSeed(seed uint64) catchupLoad { l.seed = seed; return l }

func (l simpleUpdateLoad) run(ctx context.Context, connString string) (time.Duration, error) {
	return runClients(ctx, connString, l.clients, l.txns, l.seed, l.txn)
}

// txn writes pgbench's simple-update transaction, drawing its values as pgbench does (teller
// and branch too: the history row records them).
func (l simpleUpdateLoad) txn(w *strings.Builder, rng *rand.Rand) {
	aid := 1 + rng.IntN(100000*l.scale)
	bid := 1 + rng.IntN(l.scale)
	tid := 1 + rng.IntN(10*l.scale)
	delta := rng.IntN(10001) - 5000
	fmt.Fprintf(w, "BEGIN;"+
		"UPDATE pgbench_accounts SET abalance = abalance + %[4]d WHERE aid = %[1]d;"+
		"SELECT abalance FROM pgbench_accounts WHERE aid = %[1]d;"+
		"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (%[3]d, %[2]d, %[1]d, %[4]d, CURRENT_TIMESTAMP);"+
		"END;", aid, bid, tid, delta)
}

// markEnd commits the backlog's last transaction, one row into bench_marker, and returns a WAL
// position inside it, after its change and before its commit: a subscriber whose confirmed
// flush position reached it has applied the marker, and so, in commit order, the whole backlog.
func markEnd(ctx context.Context, connString string) (decoding.LSN, error) {
	v, err := queryRow(ctx, connString, "BEGIN; INSERT INTO bench_marker VALUES (1); SELECT pg_current_wal_insert_lsn(); COMMIT")
	if err != nil {
		return 0, err
	}
	if len(v) != 1 {
		return 0, fmt.Errorf("marker: no WAL position")
	}
	return decoding.ParseLSN(v[0])
}
