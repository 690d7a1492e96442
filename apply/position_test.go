package apply

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// runErr runs an Applier for cfg and returns Run's error, failing t if Run is still running
// after d: an error that is not retried must come at once.
func runErr(t *testing.T, cfg Config, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	err := Run(ctx, cfg)
	if ctx.Err() != nil {
		t.Fatalf("Run still running after %v (last error retried?): %v", d, err)
	}
	return err
}

// TestIdleAdvance: while the source writes WAL with nothing published, the slot's confirmed
// position moves on, never past the target's progress row, and a restart finds the slot where the
// progress row is (no ErrSlotAhead).
func TestIdleAdvance(t *testing.T) {
	for _, mode := range []Mode{Buffered, Eager} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, testMajors[len(testMajors)-1])
			ctx := pgtest.Context(t, time.Minute)
			cfg := e.config(t, mode)
			r := start(t, cfg)
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			p0 := e.progress(t)
			// WAL of another database: the slot's walsender decodes it and finds nothing to send.
			must(t, pgtest.Exec(ctx, e.dst, `CREATE TABLE filler (n int)`))
			for i := 0; ; i++ {
				must(t, pgtest.Exec(ctx, e.dst, `INSERT INTO filler SELECT generate_series(1, 100)`))
				c := e.confirmed(t)
				if p := e.progress(t); p < c {
					t.Fatalf("slot confirmed %s, the progress row is at %s", c, p)
				}
				if c > p0 {
					t.Logf("slot at %s after %d rounds (progress row was at %s)", c, i+1, p0)
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("the slot never moved past %s", p0)
				}
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
			r.halt(t)
			if p, c := e.progress(t), e.confirmed(t); p < c {
				t.Fatalf("after the stop: slot confirmed %s, the progress row is at %s", c, p)
			}
			r = start(t, cfg)
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
			e.waitMarker(t, r, 2)
			r.halt(t)
			e.compare(t)
		})
	}
}

// TestSlotAhead: a slot confirmed past the target's progress row (here advanced by hand over a
// published transaction, which the target never got) stops Run with ErrSlotAhead, not retried;
// with AcceptSlotAhead Run continues from the slot's position.
func TestSlotAhead(t *testing.T) {
	e := newEnv(t, testMajors[len(testMajors)-1])
	ctx := pgtest.Context(t, time.Minute)
	cfg := e.config(t, Buffered)
	r := start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	e.waitMarker(t, r, 1)
	r.halt(t)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items VALUES (1, 1, 'lost')`,
		`SELECT pg_replication_slot_advance('apply', pg_current_wal_lsn())`))
	slot := e.confirmed(t)
	err := runErr(t, cfg, 30*time.Second)
	if !errors.Is(err, ErrSlotAhead) {
		t.Fatalf("Run with the slot ahead: %v; want ErrSlotAhead", err)
	}
	t.Logf("error: %v", err)
	if c := e.confirmed(t); c != slot {
		t.Fatalf("the slot moved from %s to %s", slot, c)
	}
	cfg.AcceptSlotAhead = true
	r = start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
	e.waitMarker(t, r, 2)
	r.halt(t)
	if p := e.progress(t); p < slot {
		t.Fatalf("progress row at %s, behind the slot's %s", p, slot)
	}
	conn, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	defer conn.Close(context.Background())
	var n int
	must(t, conn.QueryRow(ctx, `SELECT count(*) FROM items WHERE id = 1`).Scan(&n))
	if n != 0 {
		t.Fatal("the transaction the slot skipped is on the target")
	}
	cfg.AcceptSlotAhead = false // the progress row caught up with the slot: no error now
	r = start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (3)`))
	e.waitMarker(t, r, 3)
}

// TestSlotGone: a progress row whose slot no longer exists (dropped, or not on a promoted standby)
// stops Run with replication.ErrSlotNotFound, even with CreateSlot: a new slot would start after
// the changes the old one had not sent, and the target would silently miss them.
func TestSlotGone(t *testing.T) {
	e := newEnv(t, testMajors[len(testMajors)-1])
	ctx := pgtest.Context(t, time.Minute)
	cfg := e.config(t, Buffered)
	cfg.Source.CreateSlot = true
	r := start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	e.waitMarker(t, r, 1)
	r.halt(t)
	must(t, pgtest.Exec(ctx, e.src, `SELECT pg_drop_replication_slot('apply')`, `INSERT INTO items VALUES (1, 1, 'unsent')`))
	err := runErr(t, cfg, 30*time.Second)
	if !errors.Is(err, replication.ErrSlotNotFound) {
		t.Fatalf("Run with the slot gone: %v; want replication.ErrSlotNotFound", err)
	}
	t.Logf("error: %v", err)
	if n := pgtest.Count(t, e.src, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'apply'`); n != 0 {
		t.Fatal("a new slot was created in place of the one the progress row belongs to")
	}
}

// TestProgressSourceSystem: a progress table made without the source system's columns is
// upgraded and its row takes the source's system identifier; a row naming another system stops
// Run with ErrSourceChanged, as does one beyond the source's WAL, without retrying.
func TestProgressSourceSystem(t *testing.T) {
	e := newEnv(t, testMajors[len(testMajors)-1])
	ctx := pgtest.Context(t, time.Minute)
	slot := e.confirmed(t)
	must(t, pgtest.Exec(ctx, e.dst, `CREATE TABLE pgreorder_apply_progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL)`,
		fmt.Sprintf(`INSERT INTO pgreorder_apply_progress VALUES ('apply', '%s')`, slot)))
	cfg := e.config(t, Buffered)
	r := start(t, cfg)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	e.waitMarker(t, r, 1)
	r.halt(t)
	src, err := pgx.Connect(ctx, e.src)
	must(t, err)
	defer src.Close(context.Background())
	var sys string
	must(t, src.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys))
	dst, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	defer dst.Close(context.Background())
	var got string
	var tl int
	must(t, dst.QueryRow(ctx, `SELECT system_id, timeline FROM pgreorder_apply_progress WHERE slot = 'apply'`).Scan(&got, &tl))
	if got != sys || tl != 1 {
		t.Fatalf("progress row names system %s timeline %d; want %s timeline 1", got, tl, sys)
	}
	e.compare(t)

	_, err = dst.Exec(ctx, `UPDATE pgreorder_apply_progress SET system_id = '42'`)
	must(t, err)
	err = runErr(t, cfg, 30*time.Second)
	if !errors.Is(err, ErrSourceChanged) {
		t.Fatalf("Run with a progress row of another system: %v; want ErrSourceChanged", err)
	}
	t.Logf("error: %v", err)

	_, err = dst.Exec(ctx, `UPDATE pgreorder_apply_progress SET system_id = $1, end_lsn = 'FF/0'`, sys)
	must(t, err)
	err = runErr(t, cfg, 30*time.Second)
	if !errors.Is(err, ErrSourceChanged) {
		t.Fatalf("Run with a progress row beyond the source's WAL: %v; want ErrSourceChanged", err)
	}
	t.Logf("error: %v", err)
}

// TestTwoSourcesOneSlotName: two source systems with slots of the same name replicating into one
// target with the same progress table do not wait for each other's fence: the second stops with
// ErrSourceChanged, naming both systems, while the first keeps running.
func TestTwoSourcesOneSlotName(t *testing.T) {
	e := newEnv(t, testMajors[len(testMajors)-1])
	ctx := pgtest.Context(t, time.Minute)
	r := start(t, e.config(t, Buffered))
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	e.waitMarker(t, r, 1)

	var in pgtest.Install
	for _, i := range pgtest.FindInstalls() {
		if i.Major == testMajors[len(testMajors)-1] {
			in = i
		}
	}
	if in.Major == 0 {
		pgtest.Unavailable(t, "the newest PostgreSQL is not installed")
	}
	other, err := pgtest.Start(ctx, in, pgtest.Options{})
	must(t, err)
	t.Cleanup(func() { other.Stop() })
	must(t, pgtest.Exec(ctx, other.ConnString("postgres"), `CREATE TABLE marker (id int PRIMARY KEY)`,
		`CREATE PUBLICATION pub FOR ALL TABLES`, `SELECT pg_create_logical_replication_slot('apply', 'pgoutput')`))
	cfg := e.config(t, Buffered)
	cfg.Source.ConnString = other.ReplicationConnString("postgres")
	err = runErr(t, cfg, 30*time.Second)
	if !errors.Is(err, ErrSourceChanged) {
		t.Fatalf("second source: %v; want ErrSourceChanged", err)
	}
	t.Logf("error: %v", err)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
	e.waitMarker(t, r, 2)
}

// TestPositionErrorsNotRetried: what a progress row that does not fit the source means is not
// cured by starting again.
func TestPositionErrorsNotRetried(t *testing.T) {
	for _, err := range []error{
		&replication.CheckError{Setting: "Buffer.SkipThrough", Err: replication.ErrResumeAhead},
		&replication.CheckError{Setting: "Buffer.SkipThrough", Err: replication.ErrSlotAhead},
		&replication.CheckError{Setting: "system", Err: replication.ErrSystemChanged},
		fmt.Errorf("%w: x", ErrSlotAhead),
		fmt.Errorf("%w: x", ErrSourceChanged),
	} {
		if retryable(err) {
			t.Errorf("%v is retried", err)
		}
	}
}
