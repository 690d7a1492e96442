package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// catchupLoad is a workload of the catch-up benchmark: its tables (loaded once per server pair,
// published with bench_marker as publication pub), how to bring them back to their initial
// contents, the backlog made by concurrent clients, and a query whose one row summarizes them.
type catchupLoad interface {
	name() string // in the case's name: load=NAME
	size() (clients, txns int)
	setup(ctx context.Context, p *pair) error
	reset() []string
	fingerprint() string
	run(ctx context.Context, connString string) (time.Duration, error)
	withSeed(seed uint64) catchupLoad
}

// catchupLoads are the catch-up's workloads, each with clients × txns transactions: pgbench's
// (every transaction updates one of scale branch rows and one of 10×scale teller rows: hot rows,
// so that transactions depend on one another), pgbench's simple-update (one account and one
// history row per transaction: small transactions without hot rows), spread (no hot rows) and
// identity-full (a table without primary key, replicated by its whole old row). -bench selects
// among them by their names (load=pgbench-s10, load=simple-update-s10, ...), and every case of
// a load that -bench leaves out is skipped before its tables are loaded.
func catchupLoads(scale, clients, txns int) []catchupLoad {
	tpcb := tpcbLoad{scale: scale, clients: clients, txns: txns, seed: seed}
	return []catchupLoad{
		tpcb,
		simpleUpdateLoad{tpcb},
		spreadLoad{rows: 1_000_000, clients: clients, txns: txns, seed: seed},
		fullLoad{rows: 100_000, clients: clients, txns: txns, seed: seed},
	}
}

// setupLoad runs schema on both servers, extra on the subscriber only, then publishes tables
// and bench_marker.
func setupLoad(ctx context.Context, p *pair, schema, subExtra []string, tables string) error {
	t0 := time.Now()
	if err := pgtest.Exec(ctx, p.pubAdmin(benchDB), schema...); err != nil {
		return err
	}
	if err := pgtest.Exec(ctx, p.pubAdmin(benchDB), "CREATE PUBLICATION pub FOR TABLE "+tables+", bench_marker"); err != nil {
		return err
	}
	if err := pgtest.Exec(ctx, p.sub.ConnString(benchDB), append(schema, subExtra...)...); err != nil {
		return err
	}
	p.tb.Logf("tables %s loaded on both servers in %v", tables, time.Since(t0).Round(time.Millisecond))
	return nil
}

// ---------------------------------------------------------------------------------------------
// spread: updates over a large table, no row hotter than another

// spreadLoad: each transaction adds a delta to three random rows of spread_accounts (rows of
// them, a primary key on aid) and records it in spread_log (a bigserial primary key). With a
// million rows, two transactions of a backlog seldom touch the same row: nearly every
// transaction is independent of the others.
type spreadLoad struct {
	rows, clients, txns int
	seed                uint64
}

func (l spreadLoad) name() string {
	return fmt.Sprintf("load=spread-%s", rowsName(int64(l.rows)))
}
func (l spreadLoad) size() (int, int)                 { return l.clients, l.txns }
func (l spreadLoad) withSeed(seed uint64) catchupLoad { l.seed = seed; return l }
func (l spreadLoad) run(ctx context.Context, connString string) (time.Duration, error) {
	return runClients(ctx, connString, l.clients, l.txns, l.seed, l.txn)
}

func (l spreadLoad) setup(ctx context.Context, p *pair) error {
	return setupLoad(ctx, p, []string{
		"CREATE TABLE spread_accounts (aid int NOT NULL, abalance int NOT NULL, filler char(84)) WITH (fillfactor = 100)",
		"CREATE TABLE spread_log (id bigserial PRIMARY KEY, aid int NOT NULL, delta int NOT NULL, mtime timestamp NOT NULL)",
		"CREATE TABLE bench_marker (id int PRIMARY KEY)",
		fmt.Sprintf("INSERT INTO spread_accounts SELECT i, 0, '' FROM generate_series(1, %d) i", l.rows),
		"ALTER TABLE spread_accounts ADD PRIMARY KEY (aid)",
		"VACUUM ANALYZE",
	}, nil, "spread_accounts, spread_log")
}

func (l spreadLoad) reset() []string {
	return []string{
		"UPDATE spread_accounts SET abalance = 0 WHERE abalance <> 0",
		"TRUNCATE spread_log, bench_marker",
		"VACUUM ANALYZE spread_accounts, spread_log",
		"CHECKPOINT",
	}
}

func (l spreadLoad) fingerprint() string {
	return `SELECT
	(SELECT md5(coalesce(string_agg(aid || ':' || abalance, ',' ORDER BY aid), '')) FROM spread_accounts WHERE abalance <> 0),
	(SELECT count(*) || ' rows, id ' || coalesce(sum(id), 0) || ', delta ' || coalesce(sum(delta), 0) || ', aid ' || coalesce(sum(aid), 0) FROM spread_log),
	(SELECT count(*) FROM bench_marker)`
}

// txn updates three distinct rows in increasing aid order (no deadlock between two
// transactions that share rows) and inserts one log row.
func (l spreadLoad) txn(w *strings.Builder, rng *rand.Rand) {
	var aids [3]int
	for i := range aids {
		aids[i] = 1 + rng.IntN(l.rows)
	}
	sortInts(aids[:])
	delta := rng.IntN(10001) - 5000
	w.WriteString("BEGIN;")
	for i, aid := range aids {
		if i > 0 && aid == aids[i-1] {
			continue
		}
		fmt.Fprintf(w, "UPDATE spread_accounts SET abalance = abalance + %d WHERE aid = %d;", delta, aid)
	}
	fmt.Fprintf(w, "INSERT INTO spread_log (aid, delta, mtime) VALUES (%d, %d, CURRENT_TIMESTAMP);END;", aids[0], delta)
}

func sortInts(xs []int) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && xs[j] < xs[j-1]; j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}

// ---------------------------------------------------------------------------------------------
// identity-full: a table replicated by its whole row

// fullLoad: stock (rows rows) has no primary key and REPLICA IDENTITY FULL on the source: its
// updates and deletes carry the whole old row, which the subscriber must find. Both servers have
// a unique index on id (the source's own lookups use it); on the subscriber it is also the
// table's replica identity index, which PostgreSQL 15's subscriber needs to use an index at all
// (16 and later use any suitable btree index of the subscriber's table for a FULL identity).
// Each transaction changes the quantity of one random row, and replaces another (a delete and an
// insert of the same id, with a new note; the insert does nothing when a concurrent transaction
// replaced the same row first), in increasing id order.
type fullLoad struct {
	rows, clients, txns int
	seed                uint64
}

func (l fullLoad) name() string {
	return fmt.Sprintf("load=identity-full-%s", rowsName(int64(l.rows)))
}
func (l fullLoad) size() (int, int)                 { return l.clients, l.txns }
func (l fullLoad) withSeed(seed uint64) catchupLoad { l.seed = seed; return l }
func (l fullLoad) run(ctx context.Context, connString string) (time.Duration, error) {
	return runClients(ctx, connString, l.clients, l.txns, l.seed, l.txn)
}

func (l fullLoad) fill() string {
	return fmt.Sprintf("INSERT INTO stock SELECT i, i %% 1000, 100, 'item ' || i FROM generate_series(1, %d) i", l.rows)
}

func (l fullLoad) setup(ctx context.Context, p *pair) error {
	return setupLoad(ctx, p, []string{
		"CREATE TABLE stock (id int NOT NULL, warehouse int NOT NULL, qty int NOT NULL, note text NOT NULL)",
		"CREATE TABLE bench_marker (id int PRIMARY KEY)",
		l.fill(),
		"CREATE UNIQUE INDEX stock_id ON stock (id)",
		"ALTER TABLE stock REPLICA IDENTITY FULL",
		"VACUUM ANALYZE",
	}, []string{"ALTER TABLE stock REPLICA IDENTITY USING INDEX stock_id"}, "stock")
}

func (l fullLoad) reset() []string {
	return []string{"TRUNCATE stock, bench_marker", l.fill(), "VACUUM ANALYZE stock", "CHECKPOINT"}
}

func (l fullLoad) fingerprint() string {
	return `SELECT
	(SELECT count(*) || ' rows, ' || md5(string_agg(id || ':' || warehouse || ':' || qty || ':' || note, ',' ORDER BY id)) FROM stock),
	(SELECT count(*) FROM bench_marker)`
}

func (l fullLoad) txn(w *strings.Builder, rng *rand.Rand) {
	upd := 1 + rng.IntN(l.rows)
	repl := 1 + rng.IntN(l.rows)
	for repl == upd {
		repl = 1 + rng.IntN(l.rows)
	}
	d := rng.IntN(21) - 10
	update := fmt.Sprintf("UPDATE stock SET qty = qty + %d WHERE id = %d;", d, upd)
	replace := fmt.Sprintf("DELETE FROM stock WHERE id = %[1]d;INSERT INTO stock VALUES (%[1]d, %[2]d, 100, 'item %[1]d v%[3]d') ON CONFLICT (id) DO NOTHING;",
		repl, rng.IntN(1000), rng.IntN(1_000_000))
	w.WriteString("BEGIN;")
	if upd < repl {
		w.WriteString(update + replace)
	} else {
		w.WriteString(replace + update)
	}
	w.WriteString("END;")
}
