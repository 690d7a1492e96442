package apply

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/pgtest"
)

// fullEnv is a source and a target database of a shared server with schema on both sides and a
// slot; the source publishes every table.
func fullEnv(t *testing.T, major int, slot string, schema []string) *env {
	t.Helper()
	srv := pgtest.Shared(t, major)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	e := &env{srv: srv, src: srv.ConnString(srcDB), dst: srv.ConnString(dstDB), repl: srv.ReplicationConnString(srcDB), slot: slot}
	must(t, pgtest.Exec(ctx, e.src, append(append([]string{}, schema...), `CREATE PUBLICATION pub FOR ALL TABLES`,
		`SELECT pg_create_logical_replication_slot('`+slot+`', 'pgoutput')`)...))
	must(t, pgtest.Exec(ctx, e.dst, schema...))
	return e
}

// sameRows fails t unless table has the same rows (as text, with duplicates) on both sides.
func (e *env) sameRows(t *testing.T, table string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := `SELECT coalesce(string_agg(r::text, ' | ' ORDER BY r::text), '') FROM ` + table + ` r`
	var got, want string
	for dsn, out := range map[string]*string{e.src: &want, e.dst: &got} {
		c, err := pgx.Connect(ctx, dsn)
		must(t, err)
		must(t, c.QueryRow(ctx, q).Scan(out))
		c.Close(context.Background())
	}
	if got != want {
		t.Errorf("%s on the target:\n%s\nwant (the source's)\n%s", table, got, want)
	}
}

// TestFullIdentityNoEquality updates and deletes rows of REPLICA IDENTITY FULL tables that
// differ only in a column whose type has no equality operator (json, xml, point, a domain over
// json) or whose "=" is not identity (box compares areas), in text and in binary: each change
// must reach the row the source changed.
func TestFullIdentityNoEquality(t *testing.T) {
	schema := []string{
		`CREATE DOMAIN jdom AS json`,
		`CREATE TABLE nj (k int, doc json, x xml, p point, b box)`,
		`ALTER TABLE nj REPLICA IDENTITY FULL`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	for _, major := range testMajors {
		for _, binary := range []bool{false, true} {
			t.Run(fmt.Sprintf("pg%d/binary=%v", major, binary), func(t *testing.T) {
				e := fullEnv(t, major, "noeq", schema)
				cfg := e.config(t, Buffered)
				cfg.Binary = binary
				r := start(t, cfg)
				execOn(t, e.src,
					`INSERT INTO nj VALUES
						(1, '{"a":1}', '<a>1</a>', '(1,1)', '((0,0),(1,1))'),
						(1, '{"a":2}', '<a>1</a>', '(1,1)', '((0,0),(1,1))'),
						(2, '{"a":1}', '<a>1</a>', '(1,1)', '((0,0),(1,1))'),
						(2, '{"a":1}', '<a>2</a>', '(1,1)', '((0,0),(1,1))'),
						(3, '{"a":1}', '<a>1</a>', '(1,1)', '((0,0),(1,1))'),
						(3, '{"a":1}', '<a>1</a>', '(2,2)', '((0,0),(1,1))'),
						(4, '{"a":1}', '<a>1</a>', '(1,1)', '((0,0),(1,1))'),
						(4, '{"a":1}', '<a>1</a>', '(1,1)', '((1,1),(2,2))'),
						(5, '{"a":1}', '<a>1</a>', '(1,1)', '((0,0),(1,1))'),
						(5, '{"a":1}', '<a>1</a>', '(1,1)', '((0,0),(1,1))'),
						(6, NULL, NULL, NULL, NULL),
						(6, '{"a":1}', NULL, NULL, NULL)`,
					`INSERT INTO marker VALUES (1)`)
				e.waitMarker(t, r, 1)
				// Each change names the second row of its pair by the one column that differs.
				execOn(t, e.src,
					`UPDATE nj SET k = 10 WHERE k = 1 AND doc::text = '{"a":2}'`,
					`UPDATE nj SET k = 20 WHERE k = 2 AND x::text = '<a>2</a>'`,
					`UPDATE nj SET k = 30 WHERE k = 3 AND p ~= '(2,2)'`,
					`DELETE FROM nj WHERE k = 4 AND b ~= '((1,1),(2,2))'`,

					`DELETE FROM nj WHERE k = 6 AND doc IS NOT NULL`,
					`INSERT INTO marker VALUES (2)`)
				e.waitMarker(t, r, 2)
				r.halt(t)
				e.sameRows(t, "nj")
			})
		}
	}
}
