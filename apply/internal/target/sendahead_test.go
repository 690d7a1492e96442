package target

import (
	"strconv"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestSendAhead: a worker waiting for more of its transaction keeps a short run of inserts for
// the next changes to join, sends a run of copyHoldRows or more through COPY, and loses no row
// it kept: the commit sends it.
func TestSendAhead(t *testing.T) {
	pgtest.EachMajor(t, pgtest.Majors(t), func(t *testing.T, srv *Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		pgtest.ExecAll(t, dsn,
			"CREATE TABLE public.plain (k int PRIMARY KEY, v text)",
			"CREATE TABLE public.progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)")
		var stats Counters
		c := testConn(ctx, t, dsn, "sendahead", "public.progress", &stats)
		rel := NewRegistry().Intern(&decoding.Relation{RelationID: 1, Namespace: "public", Name: "plain", ReplicaIdentity: 'd',
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "k", TypeOID: 23}, {Name: "v", TypeOID: 25}}}, nil)
		next := 0
		insert := func(n int) {
			t.Helper()
			for range n {
				next++
				k := []byte(strconv.Itoa(next))
				m := &decoding.Insert{New: decoding.Tuple{{Kind: decoding.ColumnText, Data: k}, {Kind: decoding.ColumnText, Data: k}}}
				if err := c.Change(ctx, m, []*Relation{rel}); err != nil {
					t.Fatal(err)
				}
			}
		}
		sendAhead := func(wantKept int, wantStatements int64) {
			t.Helper()
			if err := c.SendAhead(ctx); err != nil {
				t.Fatal(err)
			}
			if c.ins.rows != wantKept || stats.Statements.Load() != wantStatements || len(c.ops) != 0 {
				t.Errorf("after %d inserts: %d kept, %d statements, %d operations not sent; want %d kept, %d statements, none",
					next, c.ins.rows, stats.Statements.Load(), len(c.ops), wantKept, wantStatements)
			}
		}
		c.Begin(1, nil)
		insert(100)
		sendAhead(100, 1) // BEGIN goes, the run stays
		insert(copyHoldRows - 100)
		sendAhead(0, 2) // one COPY of copyHoldRows rows
		insert(10)
		sendAhead(10, 2)
		if err := c.Commit(ctx, ProgressKey{Slot: "s", System: "1", Timeline: 1}, 100, false); err != nil {
			t.Fatal(err)
		}
		rows, err := Query(ctx, c.PG(), "SELECT count(*)::text, sum(k)::text FROM public.plain WHERE v = k::text")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(rows[0][0])+" "+string(rows[0][1]), strconv.Itoa(next)+" "+strconv.Itoa(next*(next+1)/2); got != want {
			t.Errorf("committed count, sum %s; want %s", got, want)
		}
	})
}
