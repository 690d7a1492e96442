package apply

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestParallelUniqueOrder: a transaction that takes a unique value an earlier one frees meets
// the earlier row when a worker applies it before the earlier one: the dependency tracker cannot
// see it (a DELETE or an UPDATE sends the replica identity key, not the old row's other unique
// columns). That conflict is not the source's and must not be resolved as one: with
// insert_exists and update_exists resolved as skip or apply_remote, the target must still end
// with the source's rows, and count no conflict. The earlier transaction is held on the target
// by a lock on its row until the later one met the row (and, as it must, waited for the earlier
// one's commit); the test fails if it does neither.
//
// An INSERT's conflict is resolved when its batch is sent, which in source commit order is once
// the transaction's turn came, unless the batch fills: only relaxed commit order sends it sooner
// for sure. An UPDATE of a unique column goes after a savepoint at once, in either order.
func TestParallelUniqueOrder(t *testing.T) {
	cases := []struct {
		name   string
		orders []CommitOrder
		first  string // blocked on the target by the lock on row 1
		later  []string
	}{
		{"insert", []CommitOrder{CommitRelaxed}, `DELETE FROM uq WHERE id = 1`,
			[]string{`INSERT INTO uq VALUES (2, 10, 'second')`, `UPDATE uq SET v = 'second, updated' WHERE id = 2`}},
		{"update", []CommitOrder{CommitSource, CommitRelaxed}, `UPDATE uq SET u = 11 WHERE id = 1`,
			[]string{`UPDATE uq SET u = 10, v = 'moved' WHERE id = 3`, `UPDATE uq SET v = 'moved, updated' WHERE id = 3`}},
	}
	for _, major := range testMajors {
		for _, c := range cases {
			for _, order := range c.orders {
				for _, res := range []conflict.Resolution{conflict.Skip, conflict.ApplyRemote} {
					t.Run(fmt.Sprintf("pg%d/%s/%v/%v", major, c.name, order, res), func(t *testing.T) {
						testParallelUniqueOrder(t, major, order, res, c.first, c.later)
					})
				}
			}
		}
	}
}

func testParallelUniqueOrder(t *testing.T, major int, order CommitOrder, res conflict.Resolution, first string, later []string) {
	e := fullEnv(t, major, "uniqueorder", []string{
		`CREATE TABLE uq (id int PRIMARY KEY, u int NOT NULL UNIQUE, v text)`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
		`CREATE TABLE events (src text NOT NULL, seq int NOT NULL)`,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pgtest.ExecAll(t, e.src, `INSERT INTO uq VALUES (1, 10, 'first'), (3, 30, 'third')`, `INSERT INTO marker VALUES (1)`)
	cfg := e.config(t, Parallel)
	cfg.Workers, cfg.CommitOrder = 4, order
	cfg.runTxns = 1 // the later transactions never join the first's run
	cfg.Conflicts.Resolutions = map[conflict.Type]conflict.Resolution{conflict.InsertExists: res, conflict.UpdateExists: res}
	settled := make(chan struct{}, 1)
	cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
		if stage == "conflict-settle" {
			select {
			case settled <- struct{}{}:
			default:
			}
		}
		return nil
	}}
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	// With relaxed order the marker may commit ahead of the rows.
	pgtest.Eventually(t, time.Minute, "the rows on the target", func() bool { return pgtest.Count(t, e.dst, `SELECT count(*) FROM uq`) == 2 })

	lock, err := pgx.Connect(ctx, e.dst)
	must(t, err)
	defer lock.Close(context.Background())
	tx, err := lock.Begin(ctx)
	must(t, err)
	tag, err := tx.Exec(ctx, `SELECT * FROM uq WHERE id = 1 FOR UPDATE`)
	must(t, err)
	if tag.RowsAffected() != 1 {
		t.Fatalf("locked %d rows of id 1 on the target, want 1", tag.RowsAffected())
	}
	pgtest.ExecAll(t, e.src, first)
	pgtest.Eventually(t, time.Minute, "the first transaction waiting for the row's lock on the target", func() bool {
		return pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	// The later transactions, independent of the first by their replica identity keys, go to
	// other workers.
	pgtest.ExecAll(t, e.src, later...)
	must(t, independent(ctx, e.src, "b", 20))
	for {
		st := r.a.Stats()
		if st.InsertExists > 0 || st.UpdateExists > 0 {
			break
		}
		select {
		case <-settled:
		case err := <-r.done:
			r.stop = nil
			t.Fatalf("apply stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("the later transaction neither met the row nor waited for the first (stats %+v)", st)
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	must(t, tx.Rollback(ctx))
	pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (2)`)
	e.waitMarker(t, r, 2)
	e.settled(t, r) // with relaxed order the marker may commit ahead of earlier transactions
	pgtest.Eventually(t, time.Minute, "every source transaction acknowledged", func() bool {
		return r.a.Stats().CommittedAhead == 0 || pgtest.Count(t, e.dst, `SELECT count(*) FROM events`) == 20
	})
	// The events may all be there while a later transaction of uq, which waited for the first
	// one, has yet to commit: the halt would roll it back. Wait for the rows themselves.
	e.waitSame(t, "uq", "events")
	r.halt(t)
	e.sameRows(t, "uq")
	e.sameRows(t, "events")
	st := r.a.Stats()
	for _, ct := range conflict.Types() {
		if n := st.Conflicts(ct); n != 0 {
			t.Errorf("%d %s conflicts the source did not have", n, ct)
		}
	}
	if st.ConflictWaits == 0 {
		t.Error("ConflictWaits is 0")
	}
}
