package target

import (
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestEquality: the equality a target column compares values with, as the catalog gives it: the
// base type through domains, and a nondeterministic collation where the server has one (ICU).
func TestEquality(t *testing.T) {
	pgtest.EachMajor(t, pgtest.Majors(t), func(t *testing.T, srv *Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		pgtest.ExecAll(t, dsn, "CREATE DOMAIN public.amount AS numeric(12, 2)",
			"CREATE TABLE public.eq (n numeric PRIMARY KEY, d public.amount, f float8, c char(4), t text, a int[])",
			"CREATE TABLE public.progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)")
		c := testConn(ctx, t, dsn, "eq", "public.progress", &Counters{})
		rows, err := Query(ctx, c.PG(), "SELECT count(*) FROM pg_catalog.pg_collation WHERE collprovider = 'i'")
		if err != nil {
			t.Fatal(err)
		}
		icu := string(rows[0][0]) != "0"
		if icu {
			pgtest.ExecAll(t, dsn, "CREATE COLLATION public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
				"ALTER TABLE public.eq ADD COLUMN ci text COLLATE public.ci")
		}
		cols := []decoding.RelationColumn{{Flags: 1, Name: "n", TypeOID: 1700}, {Name: "d", TypeOID: 16400}, {Name: "f", TypeOID: 701},
			{Name: "c", TypeOID: 1042}, {Name: "t", TypeOID: 25}, {Name: "a", TypeOID: 1007}}
		type want struct {
			oid    uint32
			nondet bool
		}
		wants := []want{{1700, false}, {1700, false}, {701, false}, {1042, false}, {25, false}, {1007, false}}
		if icu {
			cols = append(cols, decoding.RelationColumn{Name: "ci", TypeOID: 25})
			wants = append(wants, want{25, true})
		}
		rel := NewRegistry().Intern(&decoding.Relation{RelationID: 1, Namespace: "public", Name: "eq", ReplicaIdentity: 'd', Columns: cols}, nil)
		m, err := c.Mapping(ctx, rel, OpInsert)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range wants {
			oid, nondet, ok := m.Equality(i)
			if !ok || oid != w.oid || nondet != w.nondet {
				t.Errorf("column %s: Equality = %d, %v, %v; want %d, %v", cols[i].Name, oid, nondet, ok, w.oid, w.nondet)
			}
		}
		if _, _, ok := m.Equality(len(cols)); ok {
			t.Error("Equality of a column past the last: ok")
		}
		if !icu {
			t.Log("no ICU collations on this server: the nondeterministic collation is not checked")
		}
	})
}
