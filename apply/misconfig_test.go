package apply

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

var roleCounter atomic.Int32

// TestMisconfiguration checks that each kind of target the changes do not fit stops Run with an
// *ApplyError of its kind naming the relation, the source transaction and its commit (a missing
// table: with a *MissingTablesError naming it, when the session starts), that nothing from that
// transaction on was acknowledged, and that once the target is fixed a new Run resumes there and
// the target ends equal to the source. (TestTableAddedToPublication has the *ApplyError of a
// table missing on the target that first appears in the stream.)
func TestMisconfiguration(t *testing.T) {
	cases := []struct {
		name   string
		kind   error
		op     Op
		target []string // replaces the target's items table
		fix    []string
		role   bool // connect to the target as a role that may only read items
	}{
		{name: "missing-table", kind: ErrMissingTable, op: OpInsert,
			target: []string{`DROP TABLE items`},
			fix:    []string{`CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)`}},
		{name: "missing-column", kind: ErrSchemaMismatch, op: OpInsert,
			target: []string{`ALTER TABLE items DROP COLUMN note`},
			fix:    []string{`ALTER TABLE items ADD COLUMN note text`}},
		{name: "no-replica-identity", kind: ErrNoReplicaIdentity, op: OpUpdate,
			target: []string{`ALTER TABLE items DROP CONSTRAINT items_pkey`},
			fix:    []string{`ALTER TABLE items ADD PRIMARY KEY (id)`}},
		{name: "permission", kind: ErrPermission, op: OpInsert, role: true,
			fix: []string{`GRANT INSERT, UPDATE, DELETE ON items, marker TO %ROLE%`}},
		{name: "constraint", kind: ErrConstraint, op: OpUpdate,
			target: []string{`ALTER TABLE items ADD CONSTRAINT small_qty CHECK (qty < 100)`},
			fix:    []string{`ALTER TABLE items DROP CONSTRAINT small_qty`}},
	}
	for _, major := range testMajors {
		for _, c := range cases {
			t.Run(fmt.Sprintf("pg%d/%s", major, c.name), func(t *testing.T) {
				srv := pgtest.Shared(t, major)
				role := ""
				if c.role {
					role = fmt.Sprintf("apply_reader_%d_%d", os.Getpid(), roleCounter.Add(1))
					ctx := context.Background()
					must(t, pgtest.Exec(ctx, srv.ConnString("postgres"), "CREATE ROLE "+role+" LOGIN"))
					t.Cleanup(func() { // after the databases are dropped (cleanups run last first)
						if err := pgtest.Exec(context.Background(), srv.ConnString("postgres"), "DROP ROLE "+role); err != nil {
							t.Errorf("dropping role: %v", err)
						}
					})
				}
				e := newEnv(t, major, c.target...)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cfg := e.config(t, Buffered)
				if role != "" {
					// The role reads items and owns its progress row, nothing more.
					must(t, pgtest.Exec(ctx, e.dst,
						`CREATE TABLE pgreorder_apply_progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)`,
						"GRANT ALL ON pgreorder_apply_progress TO "+role,
						"GRANT SELECT ON items, marker TO "+role))
					cfg.Target += " user=" + role
				}
				sub := func(stmts []string) []string {
					out := make([]string, len(stmts))
					for i, s := range stmts {
						out[i] = strings.ReplaceAll(s, "%ROLE%", role)
					}
					return out
				}
				// Inserts, an update that takes qty to 100, more inserts.
				must(t, pgtest.Exec(ctx, e.src,
					`INSERT INTO items SELECT g, g, 'n' FROM generate_series(1, 10) g`,
					`UPDATE items SET qty = qty + 95 WHERE id = 5`,
					`INSERT INTO items VALUES (11, 0, 'after')`,
					`INSERT INTO marker VALUES (1)`))
				before := e.confirmed(t)
				a, err := New(cfg)
				must(t, err)
				err = a.Run(ctx)
				if c.kind == ErrMissingTable {
					var me *MissingTablesError
					if !errors.As(err, &me) || !errors.Is(err, ErrMissingTable) || len(me.Tables) != 1 || me.Tables[0].Name != `"public"."items"` {
						t.Fatalf("Run returned %v, want a *MissingTablesError naming items", err)
					}
					if st := a.Stats(); st.Sessions != 1 || st.Txns != 0 {
						t.Errorf("%d sessions, %d transactions: the error was retried, or came after applying", st.Sessions, st.Txns)
					}
					if confirmed := e.confirmed(t); confirmed != before {
						t.Errorf("the slot confirmed %s, was at %s: something was acknowledged", confirmed, before)
					}
					must(t, pgtest.Exec(ctx, e.dst, sub(c.fix)...))
					r := start(t, cfg)
					e.waitMarker(t, r, 1)
					r.halt(t)
					e.compare(t)
					return
				}
				var ae *ApplyError
				if !errors.As(err, &ae) {
					t.Fatalf("Run returned %v, want an *ApplyError", err)
				}
				t.Logf("error: %v", err)
				if !errors.Is(err, c.kind) {
					t.Errorf("the error is not %v", c.kind)
				}
				var pgErr *pgconn.PgError
				if c.kind != ErrMissingTable && c.kind != ErrSchemaMismatch && c.kind != ErrNoReplicaIdentity && !errors.As(err, &pgErr) {
					t.Errorf("the error does not reach the server's *pgconn.PgError")
				}
				if ae.Relation != `"public"."items"` || ae.Op != c.op || ae.Xid == 0 || ae.CommitLSN == 0 || ae.EndLSN <= ae.CommitLSN {
					t.Errorf("error fields: relation %s, op %s, xid %d, commit %s, end %s", ae.Relation, ae.Op, ae.Xid, ae.CommitLSN, ae.EndLSN)
				}
				// One retry is expected when the failing transaction was applied in a group with
				// others: the group is applied again one transaction at a time, so that the error
				// names its own. No other retry.
				if st := a.Stats(); st.Sessions > 2 || (st.Sessions == 2 && st.SerialRetries == 0) {
					t.Errorf("%d sessions (%d serial retries): the error was retried", st.Sessions, st.SerialRetries)
				}
				if confirmed := e.confirmed(t); confirmed > ae.CommitLSN {
					t.Errorf("the slot confirmed %s, past the failed commit %s", confirmed, ae.CommitLSN)
				}
				must(t, pgtest.Exec(ctx, e.dst, sub(c.fix)...))
				r := start(t, cfg)
				e.waitMarker(t, r, 1)
				r.halt(t)
				e.compare(t)
			})
		}
	}
}

// TestRefusedConcurrent checks that a change the target refuses while applied alongside earlier
// transactions (a streamed transaction applied eagerly, a committed one in parallel) is retried
// alone before it is reported, and then reported like in Buffered: an *ApplyError with the
// transaction's commit, nothing acknowledged past it, and a new Run resumes there.
func TestRefusedConcurrent(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Eager, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := newEnv(t, major, `ALTER TABLE big ADD CONSTRAINT no_bad CHECK (payload <> 'bad')`)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				must(t, pgtest.Exec(ctx, e.src,
					`INSERT INTO items SELECT g, g, 'n' FROM generate_series(1, 10) g`,
					// Streamed (larger than the server's 64kB), one row refused.
					`INSERT INTO big SELECT g, 0, CASE WHEN g = 1500 THEN 'bad' ELSE repeat('b', 100) END FROM generate_series(1, 2000) g`,
					// Small ones after it.
					`INSERT INTO items VALUES (11, 0, 'after')`,
					`INSERT INTO marker VALUES (1)`))
				cfg := e.config(t, mode)
				a, err := New(cfg)
				must(t, err)
				err = a.Run(ctx)
				var ae *ApplyError
				if !errors.As(err, &ae) || !errors.Is(err, ErrConstraint) {
					t.Fatalf("Run returned %v, want an *ApplyError of ErrConstraint", err)
				}
				t.Logf("error: %v", err)
				if ae.Relation != `"public"."big"` || ae.Xid == 0 || ae.CommitLSN == 0 {
					t.Errorf("error fields: relation %s, xid %d, commit %s", ae.Relation, ae.Xid, ae.CommitLSN)
				}
				if st := a.Stats(); st.SerialRetries != 1 || st.Sessions != 2 {
					t.Errorf("%d serial retries in %d sessions, want 1 in 2", st.SerialRetries, st.Sessions)
				}
				if confirmed := e.confirmed(t); confirmed > ae.CommitLSN {
					t.Errorf("the slot confirmed %s, past the failed commit %s", confirmed, ae.CommitLSN)
				}
				must(t, pgtest.Exec(ctx, e.dst, `ALTER TABLE big DROP CONSTRAINT no_bad`))
				r := start(t, cfg)
				e.waitMarker(t, r, 1)
				r.halt(t)
				e.compare(t)
			})
		}
	}
}
