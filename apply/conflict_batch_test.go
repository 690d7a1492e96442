package apply

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestConflictsInBatch is a model test of conflicts met inside batches. Random source
// transactions change a few keys of kv that random local writes on the target change too, and
// every conflict type gets a random resolution that does not stop. One Applier sends its
// statements in batches (and groups, coalesced), the other, the model, applies every statement
// on its own and resolves its conflicts before the next is sent, as PostgreSQL's subscriber
// does: both targets must end with the same rows and count the same conflicts.
func TestConflictsInBatch(t *testing.T) {
	rng := seeded(t)
	oldest, newest := testMajors[0], testMajors[len(testMajors)-1]
	servers := map[int]*pgtest.Server{oldest: conflictServer(t, oldest), newest: conflictServer(t, newest)}
	for _, v := range []struct {
		major  int
		origin bool // with a replication origin, updates and deletes check the row's origin
		mode   Mode
	}{
		{newest, true, Buffered},
		{newest, false, Buffered},
		{newest, true, Parallel},
		{newest, false, Parallel},
		{newest, true, Eager},
		{newest, false, Eager},
		{oldest, true, Buffered},
		{oldest, true, Parallel},
	} {
		name := fmt.Sprintf("pg%d/origin/%s", v.major, v.mode)
		if !v.origin {
			name = fmt.Sprintf("pg%d/no-origin/%s", v.major, v.mode)
		}
		seed := rng.Uint64()
		t.Run(name, func(t *testing.T) {
			runConflictsInBatch(t, servers[v.major], rand.New(rand.NewPCG(seed, 0)), v.origin, v.mode)
		})
	}
}

func runConflictsInBatch(t *testing.T, srv *pgtest.Server, rng *rand.Rand, origin bool, mode Mode) {
	e := conflictEnv(t, srv)
	model := *e
	model.dst, model.slot = srv.ConnString(pgtest.NewDatabase(t, srv)), "conflicts_model"
	pgtest.ExecAll(t, model.dst, conflictSchema...)
	const pad = `CREATE TABLE pad (id int PRIMARY KEY, v text)`
	pgtest.ExecAll(t, e.src, pad)
	pgtest.ExecAll(t, e.dst, pad)
	pgtest.ExecAll(t, model.dst, pad)
	pgtest.ExecAll(t, e.src, `SELECT pg_create_logical_replication_slot('conflicts_model', 'pgoutput')`)

	// last_update_wins only with an origin: without one the rows the Applier wrote carry the
	// time they were applied, which a retry changes, not their source transaction's.
	choices := []conflict.Resolution{conflict.Skip, conflict.ApplyRemote, conflict.LastUpdateWins}
	if !origin {
		choices = choices[:2]
	}
	res := map[conflict.Type]conflict.Resolution{}
	for _, ct := range conflict.Types() {
		res[ct] = choices[rng.IntN(len(choices))]
	}
	t.Logf("resolutions %v", res)
	var log, modelLog pgtest.LockedBuffer
	cfg, mcfg := e.conflictConfig(t, &log, res), model.conflictConfig(t, &modelLog, res)
	cfg.Mode, mcfg.stepwise = mode, true
	if origin {
		dropOrigins(t, e.dst, cfg.Origin)
		dropOrigins(t, model.dst, mcfg.Origin)
	} else {
		cfg.Origin, mcfg.Origin = "", ""
	}
	var trace strings.Builder // the workload, for a failure
	t.Cleanup(func() {
		if t.Failed() {
			t.Log("workload:\n" + trace.String())
			t.Log("batched:\n" + log.String())
			t.Log("model:\n" + modelLog.String())
		}
	})
	r, mr := start(t, cfg), start(t, mcfg)

	ctx := pgtest.Context(t, time.Minute)
	connect := func(dsn string) *pgx.Conn {
		c, err := pgx.Connect(ctx, dsn)
		must(t, err)
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	src, dst, mdst := connect(e.src), connect(e.dst), connect(model.dst)
	const keys = 8
	val := func() any { // a key or, rarely, NULL for the unique column
		if rng.IntN(8) == 0 {
			return nil
		}
		return rng.IntN(keys)
	}
	for round := 1; round <= 5; round++ {
		// Local writes, the same on both targets (each alone: a violation leaves the rows as
		// they were on both).
		for i := range 4 + rng.IntN(4) {
			sql, args := randomChange(rng, keys, val, fmt.Sprintf("l%d.%d", round, i))
			_, err1 := dst.Exec(ctx, sql, args...)
			_, err2 := mdst.Exec(ctx, sql, args...)
			fmt.Fprintf(&trace, "local %s %v: %v\n", sql, args, err1)
			if (err1 == nil) != (err2 == nil) || (err1 != nil && !isViolationErr(err1)) {
				t.Fatalf("local %s %v: %v, %v", sql, args, err1, err2)
			}
		}
		// Source transactions of a few changes each; a change that violates a constraint on the
		// source is rolled back to its savepoint.
		// The last one is larger than the Appliers' work memory: streamed, applied as it comes by
		// Eager's and Parallel's workers, spooled once it is to be applied alone.
		txns := 6 + rng.IntN(6)
		for x := range txns {
			tx, err := src.Begin(ctx)
			must(t, err)
			streamed := x == txns-1
			var xid string
			must(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid))
			fmt.Fprintf(&trace, "source transaction %s (r%d.%d, streamed %v)\n", xid, round, x, streamed)
			if streamed {
				_, err := tx.Exec(ctx, `INSERT INTO pad SELECT $1 * 1000 + g, repeat('p', 400) FROM generate_series(1, 900) g`, round)
				must(t, err)
			}
			n := 1 + rng.IntN(6)
			if streamed {
				n = 6 + rng.IntN(10)
			}
			for i := range n {
				sql, args := randomChange(rng, keys, val, fmt.Sprintf("r%d.%d.%d", round, x, i))
				_, err := tx.Exec(ctx, "SAVEPOINT c")
				must(t, err)
				_, err = tx.Exec(ctx, sql, args...)
				fmt.Fprintf(&trace, "  %s %v: %v\n", sql, args, err)
				if err != nil {
					if !isViolationErr(err) {
						t.Fatalf("source %s %v: %v", sql, args, err)
					}
					_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT c")
					must(t, err)
				}
				if streamed {
					_, err := tx.Exec(ctx, `INSERT INTO pad SELECT $1 * 1000 + 950 + $2, repeat('p', 400)`, round, i)
					must(t, err)
				}
			}
			must(t, tx.Commit(ctx))
		}
		_, err := src.Exec(ctx, `INSERT INTO marker VALUES ($1)`, round)
		must(t, err)
		e.waitMarker(t, r, round)
		model.waitMarker(t, mr, round)
		if got, want := rowsOf(t, e.dst), rowsOf(t, model.dst); got != want {
			t.Fatalf("round %d: the batched target has\n%s\nthe model\n%s", round, got, want)
		}
	}
	e.settled(t, r)
	model.settled(t, mr)
	st, mst := r.a.Stats(), mr.a.Stats()
	var counts []string
	// An INSERT's conflicts skipped whichever they are are resolved in a batch against the
	// rows as they stand then (see target.Conn's skipsInserts): one local row or several.
	merged := res[conflict.InsertExists] == conflict.Skip && res[conflict.MultipleUniqueConflicts] == conflict.Skip
	for _, ct := range conflict.Types() {
		if merged && (ct == conflict.InsertExists || ct == conflict.MultipleUniqueConflicts) {
			ie, mu := conflict.InsertExists, conflict.MultipleUniqueConflicts
			if st.Conflicts(ie)+st.Conflicts(mu) != mst.Conflicts(ie)+mst.Conflicts(mu) {
				t.Errorf("insert_exists and multiple_unique_conflicts: %d and %d batched, %d and %d in the model",
					st.Conflicts(ie), st.Conflicts(mu), mst.Conflicts(ie), mst.Conflicts(mu))
			}
		} else if st.Conflicts(ct) != mst.Conflicts(ct) {
			t.Errorf("%s conflicts: %d batched, %d in the model", ct, st.Conflicts(ct), mst.Conflicts(ct))
		}
		counts = append(counts, fmt.Sprintf("%s %d", ct, mst.Conflicts(ct)))
	}
	if n, m := pgtest.Count(t, e.dst, `SELECT count(*) FROM pad`), pgtest.Count(t, model.dst, `SELECT count(*) FROM pad`); n != m {
		t.Errorf("%d rows in pad, %d in the model's", n, m)
	}
	t.Logf("conflicts: %s; serial retries %d", strings.Join(counts, ", "), st.SerialRetries)
}

// randomChange is an INSERT, UPDATE or DELETE of kv on keys below keys, its text column set to
// tag.
func randomChange(rng *rand.Rand, keys int, val func() any, tag string) (string, []any) {
	id := rng.IntN(keys)
	switch rng.IntN(6) {
	case 0, 1:
		return `INSERT INTO kv VALUES ($1, $2, $3)`, []any{id, val(), tag}
	case 2:
		return `UPDATE kv SET v = $2 WHERE id = $1`, []any{id, tag}
	case 3:
		return `UPDATE kv SET u = $2, v = $3 WHERE id = $1`, []any{id, val(), tag}
	case 4:
		return `UPDATE kv SET id = $2, v = $3 WHERE id = $1`, []any{id, rng.IntN(keys), tag}
	default:
		return `DELETE FROM kv WHERE id = $1`, []any{id}
	}
}

// isViolationErr reports whether err is a unique violation.
func isViolationErr(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
