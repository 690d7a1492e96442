package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var testLogLevel = slog.LevelWarn

var schema = []string{
	`CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)`,
	`CREATE TABLE big (id int PRIMARY KEY, chunk int NOT NULL, payload text NOT NULL)`,
	`CREATE TABLE full_ident (k int, v text)`,
	`ALTER TABLE full_ident REPLICA IDENTITY FULL`,
	`CREATE TABLE marker (id int PRIMARY KEY)`,
}

var tables = []string{"items", "big", "full_ident", "marker"}

// errCrash stands for the consumer process dying.
var errCrash = errors.New("injected crash")

// testMajors are the oldest and the newest supported versions. pgtest.Shared skips the subtests
// of one that is not installed, or fails them with PGREORDER_REQUIRE_PG=1.
var testMajors = []int{15, 18}

// TestApply replicates a workload of large streamed transactions (with rolled-back savepoints and
// a concurrent rolled-back large transaction) and small transactions, under each fault, and checks
// that the target equals the source and that the slot never confirmed a commit the target had
// not applied.
func TestApply(t *testing.T) {
	faults := []string{"none", "walsender-mid-stream", "walsender-mid-transaction", "crash-before-commit", "crash-after-commit"}
	for _, major := range testMajors {
		for _, fault := range faults {
			t.Run(fmt.Sprintf("pg%d/%s", major, fault), func(t *testing.T) {
				testApply(t, pgtest.Shared(t, major), fault)
			})
		}
	}
}

func testApply(t *testing.T, srv *pgtest.Server, fault string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	src, dst := srv.ConnString(srcDB), srv.ConnString(dstDB)
	must(t, pgtest.Exec(ctx, src, append(slices.Clone(schema), `CREATE PUBLICATION pub FOR TABLE items, big, full_ident, marker`,
		`SELECT pg_create_logical_replication_slot('apply', 'pgoutput')`)...))
	must(t, pgtest.Exec(ctx, dst, schema...))

	monitor, err := pgx.Connect(ctx, src)
	must(t, err)
	defer monitor.Close(context.Background())
	var monMu sync.Mutex
	terminate := func() {
		monMu.Lock()
		defer monMu.Unlock()
		var n int
		err := monitor.QueryRow(ctx, `SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots
			WHERE slot_name = 'apply' AND database = current_database() AND active_pid IS NOT NULL`).Scan(&n)
		if err != nil {
			t.Errorf("terminate: %v", err)
		}
		t.Logf("terminated %d walsender(s)", n)
	}
	var (
		faults   atomic.Int32 // faults injected
		badFlush atomic.Value // first violation
		checks   atomic.Int32
	)
	c := config{
		source:         srv.ReplicationConnString(srcDB),
		target:         dst,
		slot:           "apply",
		publications:   []string{"pub"},
		workMem:        128 << 10,
		statusInterval: 50 * time.Millisecond,
		log:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: testLogLevel})),
	}
	c.hook = func(ctx context.Context, stage string, x *reorderbuffer.Txn) error {
		if stage == "before-commit" {
			// The slot must not have confirmed past this transaction's commit: it is not applied.
			monMu.Lock()
			var confirmed decoding.LSN
			err := monitor.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'apply'
				AND database = current_database()`).Scan(&confirmed)
			monMu.Unlock()
			if err != nil {
				return err
			}
			checks.Add(1)
			if confirmed > x.CommitLSN {
				badFlush.CompareAndSwap(nil, fmt.Sprintf("confirmed_flush_lsn %s passed the unapplied commit %s of xid %d", confirmed, x.CommitLSN, x.Xid))
			}
		}
		switch {
		case fault == "walsender-mid-transaction" && stage == "before-commit" && x.Streamed && faults.Load() == 0:
			faults.Add(1)
			terminate()
		case fault == "crash-before-commit" && stage == "before-commit" && x.Streamed && faults.Load() == 0:
			faults.Add(1)
			return errCrash
		case fault == "crash-after-commit" && stage == "after-commit" && faults.Load() < 3:
			faults.Add(1)
			return errCrash
		}
		return nil
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runWithRetry(runCtx, c) }()

	var between func(int)
	if fault == "walsender-mid-stream" {
		between = func(i int) {
			if i == 2 || i == 5 {
				faults.Add(1)
				terminate()
			}
		}
	}
	must(t, workload(ctx, src, rng, between))

	// Wait for the marker, committed last, to reach the target.
	target, err := pgx.Connect(ctx, dst)
	must(t, err)
	defer target.Close(context.Background())
	for {
		var n int
		must(t, target.QueryRow(ctx, `SELECT count(*) FROM marker`).Scan(&n))
		if n > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("apply stopped: %v", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for the target to catch up")
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("apply: %v", err)
	}
	if fault != "none" && faults.Load() == 0 {
		t.Fatalf("fault %s was never injected", fault)
	}
	if v := badFlush.Load(); v != nil {
		t.Fatal(v)
	}
	if checks.Load() == 0 {
		t.Fatal("no transaction was applied")
	}
	source, err := pgx.Connect(ctx, src)
	must(t, err)
	defer source.Close(context.Background())
	for _, table := range tables {
		q := fmt.Sprintf(`SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM %s t`, table)
		var n1, n2 int
		var h1, h2 string
		must(t, source.QueryRow(ctx, q).Scan(&n1, &h1))
		must(t, target.QueryRow(ctx, q).Scan(&n2, &h2))
		if n1 != n2 || h1 != h2 {
			t.Errorf("%s: source has %d rows (%s), target %d (%s)", table, n1, h1, n2, h2)
		}
	}
	// A consumer that resumes from the target's progress confirms at least that far: once it has
	// said so, the slot is at or past the last applied transaction. (The run above may have ended
	// with a dead connection that could not send its last acknowledgements.)
	var confirmed, applied decoding.LSN
	must(t, target.QueryRow(ctx, `SELECT end_lsn::text FROM pgreorder_apply_progress WHERE slot = 'apply'`).Scan(&applied))
	s, err := replication.Start(ctx, replication.Config{ConnString: c.source, Slot: c.slot, Publications: c.publications,
		Buffer: reorderbuffer.Config{SkipThrough: applied}})
	must(t, err)
	must(t, s.Close(ctx))
	confirmed = slotAfterRelease(ctx, t, source, "apply")
	if confirmed < applied {
		t.Errorf("confirmed_flush_lsn %s is behind the last applied end %s after a resumed stream closed", confirmed, applied)
	}
	t.Logf("%d transactions checked, %d faults, applied through %s, confirmed %s", checks.Load(), faults.Load(), applied, confirmed)
}

// workload runs a large transaction with savepoints (some rolled back) and updates, while a
// second connection commits small transactions and rolls back a large one; between(i) runs after
// the i-th savepoint. It ends by inserting into marker.
func workload(ctx context.Context, dsn string, rng *rand.Rand, between func(int)) error {
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
		_, err := c.Exec(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		return nil
	}
	for i := range 50 {
		if err := ex(small, `INSERT INTO items VALUES ($1, $2, $3)`, i, rng.IntN(100), fmt.Sprintf("item %d", i)); err != nil {
			return err
		}
	}
	if err := ex(small, `INSERT INTO full_ident SELECT g, 'v' || g FROM generate_series(1, 20) g`); err != nil {
		return err
	}
	const chunks, rows = 8, 600
	if err := ex(big, `BEGIN`); err != nil {
		return err
	}
	for i := range chunks {
		if err := ex(big, fmt.Sprintf(`SAVEPOINT s%d`, i)); err != nil {
			return err
		}
		if err := ex(big, `INSERT INTO big SELECT g, $1::int, md5(g::text) || repeat('x', 150) FROM generate_series($2::int, $3::int) g`,
			i, i*rows+1, (i+1)*rows); err != nil {
			return err
		}
		if err := ex(big, `UPDATE items SET qty = qty + 1000 WHERE id % 8 = $1`, i); err != nil {
			return err
		}
		end := fmt.Sprintf(`RELEASE SAVEPOINT s%d`, i)
		if rng.IntN(3) == 0 {
			end = fmt.Sprintf(`ROLLBACK TO SAVEPOINT s%d`, i)
		}
		if err := ex(big, end); err != nil {
			return err
		}
		// Small transactions commit while the large one is open (on rows it does not lock).
		id := 1000 + i
		if err := ex(small, `INSERT INTO items VALUES ($1, 0, 'small')`, id); err != nil {
			return err
		}
		if err := ex(small, `UPDATE full_ident SET v = v || '+' WHERE k = $1`, i+1); err != nil {
			return err
		}
		if i%2 == 0 {
			if err := ex(small, `DELETE FROM full_ident WHERE k = $1`, 20-i); err != nil {
				return err
			}
		}
		if between != nil {
			between(i)
		}
	}
	// A large transaction that is rolled back: streamed, then dropped.
	if err := ex(small, `BEGIN`); err != nil {
		return err
	}
	if err := ex(small, `INSERT INTO big SELECT g, -1, repeat('y', 200) FROM generate_series(100001, 102000) g`); err != nil {
		return err
	}
	if err := ex(small, `ROLLBACK`); err != nil {
		return err
	}
	if err := ex(big, `UPDATE big SET payload = 'updated' WHERE id % 97 = 0`); err != nil {
		return err
	}
	if err := ex(big, `DELETE FROM big WHERE id % 89 = 0`); err != nil {
		return err
	}
	if err := ex(big, `COMMIT`); err != nil {
		return err
	}
	if err := ex(small, `UPDATE items SET note = NULL WHERE id < 10`); err != nil {
		return err
	}
	if err := ex(small, `DELETE FROM items WHERE id BETWEEN 10 AND 14`); err != nil {
		return err
	}
	return ex(small, `INSERT INTO marker VALUES (1)`)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// slotAfterRelease waits until no walsender holds the slot (so that the last status update sent
// before disconnecting has been processed) and returns its confirmed_flush_lsn.
func slotAfterRelease(ctx context.Context, t *testing.T, conn *pgx.Conn, slot string) decoding.LSN {
	t.Helper()
	for {
		var active bool
		var confirmed decoding.LSN
		must(t, conn.QueryRow(ctx, `SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots
			WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&active, &confirmed))
		if !active {
			return confirmed
		}
		select {
		case <-ctx.Done():
			t.Fatalf("slot %s stayed active", slot)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
