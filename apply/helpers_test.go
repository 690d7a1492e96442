package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
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

// testMajors are the oldest and the newest supported versions.
var testMajors = []int{15, 18}

// testLog is the logger of the appliers under test: warnings and errors on stderr.
func testLog(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("PGREORDER_APPLY_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("test", t.Name())
}

// schema is created on both sides; the source publishes every table.
var schema = []string{
	`CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)`,
	`CREATE TABLE big (id int PRIMARY KEY, chunk int NOT NULL, payload text NOT NULL)`,
	`CREATE TABLE toasty (id int PRIMARY KEY, n int NOT NULL, doc text)`,
	`CREATE TABLE dup (k int, v text)`,
	`ALTER TABLE dup REPLICA IDENTITY FULL`,
	`CREATE TABLE trunc (id int PRIMARY KEY, v text)`,
	`CREATE TABLE events (src text NOT NULL, seq int NOT NULL)`, // no key: duplicates would show
	`CREATE TABLE typed (id int PRIMARY KEY, ts timestamptz, n numeric, j jsonb, arr int[], b bytea, tx text, f float8, iv interval)`,
	`CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)`,
	`CREATE TABLE marker (id int PRIMARY KEY)`,
}

var tables = []string{"items", "big", "toasty", "dup", "trunc", "events", "typed", "accounts", "marker"}

// env is a source and a target database on one server, with a slot and a publication.
type env struct {
	srv      *pgtest.Server
	src, dst string // connection strings
	repl     string // replication connection string of the source
	slot     string
}

func newEnv(t *testing.T, major int, extraTarget ...string) *env {
	t.Helper()
	srv := pgtest.Shared(t, major)
	ctx := pgtest.Context(t, time.Minute)
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	e := &env{srv: srv, src: srv.ConnString(srcDB), dst: srv.ConnString(dstDB), repl: srv.ReplicationConnString(srcDB), slot: "apply"}
	must(t, pgtest.Exec(ctx, e.src, append(append([]string{}, schema...),
		`CREATE PUBLICATION pub FOR ALL TABLES`,
		`SELECT pg_create_logical_replication_slot('apply', 'pgoutput')`)...))
	must(t, pgtest.Exec(ctx, e.dst, append(append([]string{}, schema...), extraTarget...)...))
	return e
}

func (e *env) config(t testing.TB, mode Mode) Config {
	return Config{
		Source: replication.Config{ConnString: e.repl, Slot: e.slot, Publications: []string{"pub"}, StatusInterval: 100 * time.Millisecond, Buffer: reorderbuffer.Config{WorkMem: 256 << 10}},
		Target: e.dst,
		Mode:   mode,
		Logger: testLog(t),
	}
}

// running is an Applier running in the background.
type running struct {
	a      *Applier
	stop   context.CancelFunc
	done   chan error
	exited chan struct{} // closed when Run returns, after err is set
	err    error
}

func start(t testing.TB, cfg Config) *running {
	t.Helper()
	a, err := New(cfg)
	must(t, err)
	ctx, stop := context.WithCancel(context.Background())
	r := &running{a: a, stop: stop, done: make(chan error, 1), exited: make(chan struct{})}
	go func() {
		r.err = a.Run(ctx)
		close(r.exited)
		r.done <- r.err
	}()
	t.Cleanup(func() { r.halt(t) })
	return r
}

// alive returns ctx, ended early if the applier stops by itself, with its error as the cause:
// for waiting on the target for something only a running applier does.
func (r *running) alive(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-r.exited:
			cancel(fmt.Errorf("the applier stopped: %v", r.err))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// halt stops the applier and fails t if it had stopped with an error of its own.
func (r *running) halt(t testing.TB) {
	t.Helper()
	if r.stop == nil {
		return
	}
	r.stop()
	r.stop = nil
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("apply: %v", err)
	}
}

// connect opens a connection to the source and one to the target.
func (e *env) connect(t testing.TB, ctx context.Context) (src, dst *pgx.Conn) {
	t.Helper()
	src, err := pgx.Connect(ctx, e.src)
	must(t, err)
	dst, err = pgx.Connect(ctx, e.dst)
	if err != nil {
		src.Close(context.Background())
		t.Fatal(err)
	}
	return src, dst
}

// digest returns a table's row count and a hash of its rows.
func digest(t testing.TB, ctx context.Context, c *pgx.Conn, table string) (int, string) {
	t.Helper()
	var n int
	var h string
	must(t, c.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM %s t`, table)).Scan(&n, &h))
	return n, h
}

// waitSame waits, after the marker, until the target's tables hold the source's rows, for a
// minute at most: the comparison that follows reports a difference. With relaxed commit order
// the marker may commit ahead of earlier transactions, which a halt right then would roll back.
// only, if given, replaces the tables compare checks.
func (e *env) waitSame(t testing.TB, only ...string) {
	t.Helper()
	names := tables
	if len(only) > 0 {
		names = only
	}
	ctx := pgtest.Context(t, time.Minute)
	src, dst := e.connect(t, ctx)
	defer src.Close(context.Background())
	defer dst.Close(context.Background())
	same := func() bool {
		for _, table := range names {
			n1, h1 := digest(t, ctx, src, table)
			n2, h2 := digest(t, ctx, dst, table)
			if n1 != n2 || h1 != h2 {
				return false
			}
		}
		return true
	}
	pgtest.Until(ctx, same)
}

// waitMarker waits until the target has marker row id, or the applier stops.
func (e *env) waitMarker(t testing.TB, r *running, id int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	defer conn.Close(context.Background())
	// The marker's commit is visible on the target before the Applier has read the reply to
	// its COMMIT and counted it: once the marker is there, wait until Stats counts the
	// progress row read beside it too (written in the same target transaction where the mode
	// writes it with each commit), so that a test reading Stats after halt sees the marker's.
	var progress *decoding.LSN
	for {
		if progress == nil {
			var n int
			var p *string
			must(t, conn.QueryRow(ctx, `SELECT count(*), to_regclass('pgreorder_apply_progress')::text FROM marker WHERE id = $1`, id).Scan(&n, &p))
			if n > 0 {
				progress = new(decoding.LSN)
				if p != nil { // a test may name another progress table: then Stats is not waited for
					must(t, conn.QueryRow(ctx, `SELECT coalesce(max(end_lsn), '0/0')::text FROM pgreorder_apply_progress WHERE slot = $1`, e.slot).Scan(&p))
					must(t, progress.UnmarshalText([]byte(*p)))
				}
			}
		}
		if progress != nil && r.a.Stats().AppliedLSN >= *progress {
			return
		}
		select {
		case err := <-r.done:
			r.stop = nil
			t.Fatalf("apply stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("timed out waiting for marker %d (stats %+v)", id, r.a.Stats())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// compare fails t unless every table has the same rows on both sides.
func (e *env) compare(t testing.TB) {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	src, dst := e.connect(t, ctx)
	defer src.Close(context.Background())
	defer dst.Close(context.Background())
	for _, table := range tables {
		n1, h1 := digest(t, ctx, src, table)
		n2, h2 := digest(t, ctx, dst, table)
		if n1 != n2 || h1 != h2 {
			t.Errorf("%s: source has %d rows (%s), target %d (%s)", table, n1, h1, n2, h2)
			if n1 < 100 && n2 < 100 {
				rows := func(c *pgx.Conn) map[string]int {
					m := map[string]int{}
					rs, err := c.Query(ctx, fmt.Sprintf(`SELECT t::text FROM %s t`, table))
					must(t, err)
					for rs.Next() {
						var v string
						must(t, rs.Scan(&v))
						m[v]++
					}
					return m
				}
				a, b := rows(src), rows(dst)
				for k := range a {
					if a[k] != b[k] {
						t.Logf("%s: %s: %d on the source, %d on the target", table, k, a[k], b[k])
					}
				}
				for k := range b {
					if a[k] == 0 {
						t.Logf("%s: %s: only on the target (%d)", table, k, b[k])
					}
				}
			}
		}
	}
}

// progress returns the target's progress row for the slot.
func (e *env) progress(t testing.TB) decoding.LSN {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	conn, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	defer conn.Close(context.Background())
	var l decoding.LSN
	must(t, conn.QueryRow(ctx, `SELECT end_lsn::text FROM pgreorder_apply_progress WHERE slot = $1`, e.slot).Scan(&l))
	return l
}

// confirmed returns the slot's confirmed_flush_lsn.
func (e *env) confirmed(t testing.TB) decoding.LSN {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	conn, err := pgx.Connect(ctx, e.src)
	must(t, err)
	defer conn.Close(context.Background())
	var l decoding.LSN
	must(t, conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1
		AND database = current_database()`, e.slot).Scan(&l))
	return l
}

// workload runs the mixed workload on the source: small transactions of every kind while a
// large transaction, streamed, takes savepoints and rolls some back; a large transaction that
// aborts; TOAST values left unchanged by updates; identical rows of a keyless table updated and
// deleted one at a time; TRUNCATE; values that need escaping. between(i) runs after the large
// transaction's i-th savepoint, while it is open. It ends with marker row markerID.
func workload(ctx context.Context, dsn string, rng *rand.Rand, markerID int, between func(i int) error) error {
	big, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer big.Close(context.Background())
	small, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer small.Close(context.Background())
	ex := func(c *pgx.Conn, sql string, args ...any) error {
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		return nil
	}
	base := markerID * 1_000_000 // keys of this run
	steps := []func() error{
		func() error {
			return ex(small, `INSERT INTO items SELECT $1::int + g, g % 7, 'item ' || g FROM generate_series(1, 50) g`, base)
		},
		func() error {
			return ex(small, `INSERT INTO dup SELECT g % 3, 'v' || (g % 3) FROM generate_series(1, 9) g`)
		},
		func() error {
			return ex(small, `INSERT INTO toasty SELECT $1::int + g, 0, (SELECT string_agg(md5(random()::text || g || i), '')
				FROM generate_series(1, 300) i) FROM generate_series(1, 5) g`, base)
		},
		func() error {
			return ex(small, `INSERT INTO typed VALUES
				($1::int + 1, '2024-02-29 12:34:56.789+01', 12345.678901234567890, '{"a": [1, 2, {"b": null}], "t": "x\ty"}',
				 '{1,NULL,3}', '\x00ff5c0a', E'tab\there\nnewline\\backslash \\N not null\rcr', 'NaN', '1 day 02:03:04'),
				($1::int + 2, NULL, NULL, NULL, NULL, NULL, '', '-Infinity', NULL),
				($1::int + 3, 'infinity', '-0.5', '[]', '{}', '', '\N', 1.5e300, '-3 mons')`, base)
		},
		func() error {
			return ex(small, `INSERT INTO trunc SELECT $1::int + g, 'before' FROM generate_series(1, 20) g`, base)
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	// The large transaction, streamed while small ones commit around it.
	const chunks, rows = 6, 400
	if err := ex(big, `BEGIN`); err != nil {
		return err
	}
	for i := range chunks {
		if err := ex(big, fmt.Sprintf(`SAVEPOINT s%d`, i)); err != nil {
			return err
		}
		lo := base + i*rows + 1
		if err := ex(big, `INSERT INTO big SELECT g, $1::int, md5(g::text) || repeat('x', 150) FROM generate_series($2::int, $3::int) g`,
			i, lo, lo+rows-1); err != nil {
			return err
		}
		if err := ex(big, `UPDATE items SET qty = qty + 1000 WHERE id > $1 AND id % 8 = $2`, base, i); err != nil {
			return err
		}
		if err := ex(big, `INSERT INTO events VALUES ('big', $1)`, i); err != nil {
			return err
		}
		if i%2 == 1 { // a nested savepoint, rolled back
			if err := ex(big, `SAVEPOINT inner_sp`); err != nil {
				return err
			}
			if err := ex(big, `INSERT INTO big SELECT g, -2, 'inner' FROM generate_series($1::int, $2::int) g`, lo+rows, lo+rows+50); err != nil {
				return err
			}
			if err := ex(big, `ROLLBACK TO SAVEPOINT inner_sp`); err != nil {
				return err
			}
		}
		end := fmt.Sprintf(`RELEASE SAVEPOINT s%d`, i)
		if rng.IntN(3) == 0 && i < chunks-1 { // the last chunk stays: the transaction is large whatever the seed
			end = fmt.Sprintf(`ROLLBACK TO SAVEPOINT s%d`, i)
		}
		if err := ex(big, end); err != nil {
			return err
		}
		// Small transactions commit while the large one is open, on rows it does not lock.
		if err := ex(small, `INSERT INTO items VALUES ($1, 0, 'small')`, base+100+i); err != nil {
			return err
		}
		if err := ex(small, `INSERT INTO events VALUES ('small', $1)`, i); err != nil {
			return err
		}
		if err := ex(small, `UPDATE dup SET v = v || '+' WHERE ctid = (SELECT ctid FROM dup WHERE k = $1 LIMIT 1)`, i%3); err != nil {
			return err
		}
		if between != nil {
			if err := between(i); err != nil {
				return err
			}
		}
	}
	// A large transaction that aborts: streamed, then dropped.
	if err := ex(small, `BEGIN`); err != nil {
		return err
	}
	if err := ex(small, `INSERT INTO big SELECT g, -1, repeat('y', 200) FROM generate_series($1::int, $2::int) g`,
		base+900_001, base+902_000); err != nil {
		return err
	}
	if err := ex(small, `ROLLBACK`); err != nil {
		return err
	}
	if err := ex(big, `UPDATE big SET payload = 'updated' WHERE id > $1 AND id % 97 = 0`, base); err != nil {
		return err
	}
	if err := ex(big, `DELETE FROM big WHERE id > $1 AND id % 89 = 0`, base); err != nil {
		return err
	}
	if err := ex(big, `COMMIT`); err != nil {
		return err
	}
	tail := []func() error{
		// TOASTed docs left unchanged.
		func() error { return ex(small, `UPDATE toasty SET n = n + 1 WHERE id > $1`, base) },
		func() error {
			return ex(small, `UPDATE items SET note = NULL WHERE id BETWEEN $1 + 1 AND $1 + 10`, base)
		},
		func() error { return ex(small, `DELETE FROM items WHERE id BETWEEN $1 + 11 AND $1 + 15`, base) },
		// A key change.
		func() error { return ex(small, `UPDATE items SET id = id + 500 WHERE id = $1 + 20`, base) },
		// Identical rows: one of them updated, one deleted.
		func() error {
			return ex(small, `UPDATE dup SET v = 'changed' WHERE ctid = (SELECT ctid FROM dup WHERE k = 1 AND v = 'v1' LIMIT 1)`)
		},
		func() error {
			return ex(small, `DELETE FROM dup WHERE ctid = (SELECT ctid FROM dup WHERE k = 2 AND v = 'v2' LIMIT 1)`)
		},
		func() error { return ex(small, `UPDATE typed SET tx = tx || E'\t!', n = n * 2 WHERE id > $1`, base) },
		func() error {
			return ex(small, fmt.Sprintf(`BEGIN; TRUNCATE trunc; INSERT INTO trunc SELECT %d + g, 'after' FROM generate_series(1, 5) g; COMMIT`, base))
		},
		func() error { return ex(small, `INSERT INTO marker VALUES ($1)`, markerID) },
	}
	for _, s := range tail {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// seeded returns a random source whose seed is logged; PGREORDER_SEED replays one.
func seeded(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	if s := os.Getenv("PGREORDER_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("PGREORDER_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (set PGREORDER_SEED to replay)", seed)
	return rand.New(rand.NewPCG(seed, 0))
}

// terminator kills backends of the source or the target by a condition on pg_stat_activity.
type terminator struct {
	mu   sync.Mutex
	conn *pgx.Conn
}

func newTerminator(t testing.TB, dsn string) *terminator {
	ctx := pgtest.Context(t, time.Minute)
	c, err := pgx.Connect(ctx, dsn)
	must(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return &terminator{conn: c}
}

// kill terminates the backends of the current database matching cond and returns how many.
func (k *terminator) kill(ctx context.Context, cond string) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var n int
	err := k.conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND `+cond).Scan(&n)
	return n, err
}

// concurrent runs small transactions from several clients at once on few hot rows: transfers
// between accounts (both rows in one transaction), inserts, updates, key changes and deletes of
// items, appends to the keyless events table. Applied in parallel, every transaction must see the
// rows the earlier ones left: a missed dependency shows as a different balance or a conflict.
func concurrent(ctx context.Context, dsn string, rng *rand.Rand, clients, txns int) error {
	if err := pgtest.Exec(ctx, dsn, `INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, 20) g ON CONFLICT DO NOTHING`); err != nil {
		return err
	}
	seeds := make([]uint64, clients)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	errs := make(chan error, clients)
	for c := range clients {
		go func() {
			errs <- func() error {
				r := rand.New(rand.NewPCG(seeds[c], 1))
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				base := 10_000_000 + c*100_000
				next := 0
				for i := 0; i < txns; i++ {
					var sql string
					switch op := r.IntN(6); {
					case op <= 1:
						a, b := 1+r.IntN(20), 1+r.IntN(20)
						if a == b {
							b = a%20 + 1
						}
						x := r.IntN(50)
						sql = fmt.Sprintf(`BEGIN; UPDATE accounts SET balance = balance - %d WHERE id = %d;
							UPDATE accounts SET balance = balance + %d WHERE id = %d; COMMIT`, x, a, x, b)
					case op == 2 || next == 0:
						next++
						sql = fmt.Sprintf(`INSERT INTO items VALUES (%d, %d, 'c%d')`, base+next, i, c)
					case op == 3:
						sql = fmt.Sprintf(`UPDATE items SET qty = qty + 1, note = note || '.' WHERE id = %d`, base+1+r.IntN(next))
					case op == 4:
						k := base + 1 + r.IntN(next)
						sql = fmt.Sprintf(`BEGIN; UPDATE items SET id = id + 50000 WHERE id = %d; INSERT INTO events VALUES ('c%d', %d); COMMIT`, k, c, i)
					default:
						sql = fmt.Sprintf(`DELETE FROM items WHERE id = %d`, base+1+r.IntN(next))
					}
					if _, err := conn.Exec(ctx, sql); err != nil {
						var pgErr *pgconn.PgError
						if errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001") {
							conn.Exec(ctx, "ROLLBACK")
							i-- // a deadlock between clients on the source: again
							continue
						}
						return fmt.Errorf("%s: %w", sql, err)
					}
				}
				return nil
			}()
		}()
	}
	return firstError(errs, clients)
}

// waitReplies waits until the source has received n more status updates from the walsender
// client of slot (pg_stat_replication.reply_time moved n times).
func waitReplies(t testing.TB, ctx context.Context, dsn, slot string, n int) {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer c.Close(context.Background())
	var last *time.Time
	for moved := -1; moved < n; {
		var at *time.Time
		err := c.QueryRow(ctx, `SELECT r.reply_time FROM pg_catalog.pg_stat_replication r
			JOIN pg_catalog.pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, slot).Scan(&at)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("reading reply_time: %v", err)
		}
		if at != nil && (last == nil || !at.Equal(*last)) {
			moved++
			last = at
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d status updates of slot %s seen, want %d: %v", max(moved, 0), slot, n, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// tableText returns the rows of table on dsn as text, sorted (duplicates kept).
func tableText(t testing.TB, dsn, table string) string {
	t.Helper()
	return pgtest.QueryOne[string](t, dsn, `SELECT coalesce(string_agg(r::text, ' | ' ORDER BY r::text), '') FROM `+table+` r`)
}

// firstError waits for n results from errs and returns the first error among them.
func firstError(errs <-chan error, n int) error {
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
