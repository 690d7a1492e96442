package apply

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// fullEnv is a source and a target database of a shared server with schema on both sides and a
// slot; the source publishes every table.
func fullEnv(t *testing.T, major int, slot string, schema []string) *env {
	t.Helper()
	return serverEnv(t, pgtest.Shared(t, major), slot, schema)
}

// serverEnv is fullEnv on srv.
func serverEnv(t *testing.T, srv *pgtest.Server, slot string, schema []string) *env {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
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
	if got, want := tableText(t, e.dst, table), tableText(t, e.src, table); got != want {
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
				cfg.Source.Binary = binary
				r := start(t, cfg)
				pgtest.ExecAll(t, e.src,
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
				pgtest.ExecAll(t, e.src,
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

// TestStatementsBounded applies changes of many tables with a small statement cache, and
// updates and deletes of a REPLICA IDENTITY FULL table in many patterns of NULLs: the statements
// prepared on a connection stay within the bound (one more while a batch uses them all), the
// evicted ones are prepared again when needed, and the rows are the source's.
func TestStatementsBounded(t *testing.T) {
	const tables, bound = 20, 6
	schema := []string{
		`CREATE TABLE nulls (a int, b int, c int, d int, e int, f int, g int, h int, i int, j int)`,
		`ALTER TABLE nulls REPLICA IDENTITY FULL`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	for i := range tables {
		schema = append(schema, fmt.Sprintf(`CREATE TABLE many%d (id int PRIMARY KEY, v text)`, i))
	}
	e := fullEnv(t, testMajors[len(testMajors)-1], "bounded", schema)

	// 1,024 patterns of NULLs: row n has NULL in column k when bit k of n is set.
	cols := "a, b, c, d, e, f, g, h, i, j"
	var vals []string
	for k := range 10 {
		vals = append(vals, fmt.Sprintf("CASE WHEN n & %d = 0 THEN n END", 1<<k))
	}
	pgtest.ExecAll(t, e.src, `INSERT INTO nulls (`+cols+`) SELECT `+strings.Join(vals, ", ")+` FROM generate_series(0, 1023) n`)
	r := start(t, e.config(t, Buffered))
	pgtest.ExecAll(t, e.src, `UPDATE nulls SET a = coalesce(a, -1) + 0`, `DELETE FROM nulls WHERE b IS NULL`, `INSERT INTO marker VALUES (1)`)
	e.waitMarker(t, r, 1)
	r.halt(t)
	e.sameRows(t, "nulls")
	if most := r.a.stats.PreparedMost.Load(); most > 4 {
		t.Errorf("%d statements prepared on one connection for one table's updates and deletes, want at most 4", most)
	}

	// Binary values: the changes go one prepared statement each, not as set statements.
	cfg := e.config(t, Buffered)
	cfg.Source.Binary = true
	cfg.maxStatements = bound
	r = start(t, cfg)
	for round := range 2 {
		var stmts []string
		for i := range tables {
			id := round * 10
			stmts = append(stmts,
				fmt.Sprintf(`INSERT INTO many%d VALUES (%d, 'a'), (%d, 'b')`, i, id+1, id+2),
				fmt.Sprintf(`UPDATE many%d SET v = 'updated' WHERE id = %d`, i, id+1),
				fmt.Sprintf(`DELETE FROM many%d WHERE id = %d`, i, id+2))
		}
		pgtest.ExecAll(t, e.src, append(stmts, fmt.Sprintf(`INSERT INTO marker VALUES (%d)`, round+2))...)
		e.waitMarker(t, r, round+2)
	}
	r.halt(t)
	for i := range tables {
		e.sameRows(t, fmt.Sprintf("many%d", i))
	}
	most, prepares := r.a.stats.PreparedMost.Load(), r.a.stats.Prepares.Load()
	t.Logf("%d statements prepared, at most %d on one connection", prepares, most)
	if most > bound+1 {
		t.Errorf("%d statements prepared on one connection at once, want at most %d", most, bound+1)
	}
	if prepares < 2*3*tables {
		t.Errorf("%d statements prepared: evicted statements were not prepared again", prepares)
	}
}

// TestFullIdentityKeyed replicates REPLICA IDENTITY FULL tables whose target has a unique index
// on NOT NULL columns, which Buffered and Parallel apply as set statements (their updates and
// deletes name the row by the key's index and the whole old row): rows updated several times in
// a transaction, deleted and inserted again, NULLs matching NULLs, a column without equality
// operator (json), a two-column key. A transaction of many updates takes a few statements, not
// one per row; the rows are the source's.
func TestFullIdentityKeyed(t *testing.T) {
	schema := []string{
		`CREATE TABLE fk (id int NOT NULL, doc json, v text, n int NOT NULL)`,
		`CREATE UNIQUE INDEX fk_id ON fk (id)`,
		`ALTER TABLE fk REPLICA IDENTITY FULL`,
		`CREATE TABLE fk2 (a int NOT NULL, b text NOT NULL, v text, PRIMARY KEY (a, b))`,
		`ALTER TABLE fk2 REPLICA IDENTITY FULL`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := fullEnv(t, major, "fullkeyed", schema)
				pgtest.ExecAll(t, e.src,
					`INSERT INTO fk SELECT i, CASE WHEN i % 3 = 0 THEN NULL ELSE json_build_object('i', i) END,
						CASE WHEN i % 4 = 0 THEN NULL ELSE 'v' || i END, i FROM generate_series(1, 400) i`,
					`INSERT INTO fk2 SELECT i % 20, 'b' || (i / 20), CASE WHEN i % 5 = 0 THEN NULL ELSE 'x' END FROM generate_series(0, 199) i`)
				r := start(t, e.config(t, mode))
				pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (1)`)
				e.waitMarker(t, r, 1)
				before := r.a.stats.Statements.Load()
				pgtest.ExecAll(t, e.src, `UPDATE fk SET n = n + 1000 WHERE id <= 300`, `INSERT INTO marker VALUES (2)`)
				e.waitMarker(t, r, 2)
				if n := r.a.stats.Statements.Load() - before; n >= 100 {
					t.Errorf("300 updates of a FULL table with a unique key took %d statements: not set-based", n)
				}
				pgtest.ExecAll(t, e.src,
					`BEGIN; UPDATE fk SET v = 'twice' WHERE id % 7 = 0; UPDATE fk SET doc = '{"again": true}', v = NULL WHERE id % 7 = 0; COMMIT`,
					`BEGIN; DELETE FROM fk WHERE id % 11 = 0; INSERT INTO fk SELECT i, NULL, 'back', -i FROM generate_series(11, 400, 11) i; COMMIT`,
					`BEGIN; UPDATE fk SET doc = NULL WHERE id % 5 = 1; DELETE FROM fk WHERE id % 13 = 0; UPDATE fk SET n = 0 WHERE id % 17 = 0; COMMIT`,
					`BEGIN; INSERT INTO fk VALUES (1000, '[1]', NULL, 1); UPDATE fk SET v = 'new' WHERE id = 1000; DELETE FROM fk WHERE id = 1000; COMMIT`,
					`UPDATE fk2 SET v = coalesce(v, 'was null') || '!' WHERE a % 3 = 0`,
					`BEGIN; DELETE FROM fk2 WHERE a = 1; INSERT INTO fk2 VALUES (1, 'b0', NULL); UPDATE fk2 SET v = 'y' WHERE v IS NULL; COMMIT`,
					`INSERT INTO marker VALUES (3)`)
				e.waitMarker(t, r, 3)
				r.halt(t)
				e.sameRows(t, "fk")
				e.sameRows(t, "fk2")
				// Parallel keys the dependencies of a FULL table with such a key by it: nothing
				// is serialized.
				if n := r.a.stats.eng.SerialTxns.Load(); n != 0 {
					t.Errorf("%d transactions of FULL tables with a target key were serialized", n)
				}
			})
		}
	}
}

// TestFullIdentityKeyedConflicts: with conflict detection, an update or delete of a FULL table
// applied set-based whose target row differs from the old row in a column besides the key, or
// is gone, is a conflict reported as row by row reports it (update_missing, delete_missing,
// skipped: the local row stays); the other changes of the transaction apply.
func TestFullIdentityKeyedConflicts(t *testing.T) {
	schema := []string{
		`CREATE TABLE fkc (id int NOT NULL, v text, n int NOT NULL)`,
		`CREATE UNIQUE INDEX fkc_id ON fkc (id)`,
		`ALTER TABLE fkc REPLICA IDENTITY FULL`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	major := testMajors[len(testMajors)-1]
	for _, mode := range []Mode{Buffered, Parallel} {
		t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
			e := fullEnv(t, major, "fullconflicts", schema)
			var log pgtest.LockedBuffer
			cfg := e.conflictConfig(t, &log, nil)
			cfg.Mode = mode
			dropOrigins(t, e.dst, cfg.Origin)
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(log.String())
				}
			})
			pgtest.ExecAll(t, e.src, `INSERT INTO fkc SELECT i, 'v' || i, i FROM generate_series(1, 10) i`, `INSERT INTO marker VALUES (1)`)
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			r.halt(t)
			// Rows whose key is there, one column besides it differing: the set statements would
			// change as many rows as they name if they matched the key alone.
			pgtest.ExecAll(t, e.dst, `UPDATE fkc SET v = 'local' WHERE id IN (3, 7)`)
			pgtest.ExecAll(t, e.src, `BEGIN; UPDATE fkc SET n = n + 100 WHERE id IN (2, 3, 4); DELETE FROM fkc WHERE id IN (6, 7); COMMIT`,
				`INSERT INTO marker VALUES (2)`)
			r = start(t, cfg)
			e.waitMarker(t, r, 2)
			r.halt(t)
			// A row gone.
			pgtest.ExecAll(t, e.dst, `DELETE FROM fkc WHERE id = 5`)
			pgtest.ExecAll(t, e.src, `BEGIN; DELETE FROM fkc WHERE id = 5; UPDATE fkc SET n = -n WHERE id = 8; COMMIT`, `INSERT INTO marker VALUES (3)`)
			r2 := start(t, cfg)
			e.waitMarker(t, r2, 3)
			r2.halt(t)
			ctx := pgtest.Context(t, time.Minute)
			c, err := pgx.Connect(ctx, e.dst)
			must(t, err)
			defer c.Close(context.Background())
			var got string
			must(t, c.QueryRow(ctx, `SELECT string_agg(id || ':' || v || ':' || n, ' ' ORDER BY id) FROM fkc`).Scan(&got))
			if want := "1:v1:1 2:v2:102 3:local:3 4:v4:104 7:local:7 8:v8:-8 9:v9:9 10:v10:10"; got != want {
				t.Errorf("target rows %s, want %s", got, want)
			}
			for ct, want := range map[conflict.Type]int64{conflict.UpdateMissing: 1, conflict.DeleteMissing: 2} {
				if n := r.a.stats.Conflicts[ct].Load() + r2.a.stats.Conflicts[ct].Load(); n != want {
					t.Errorf("%v: %d conflicts, want %d", ct, n, want)
				}
			}
		})
	}
}

// TestFullIdentityTargetKey replicates REPLICA IDENTITY FULL tables whose target has a primary
// key (fpk) or a replica identity index (fri), as PostgreSQL's subscriber does: an update or a
// delete finds its row by that key alone, so a row changed on the target in another column is
// still the row. With an origin, that is update_origin_differs and delete_origin_differs,
// reported by the key ("replica identity (id)=(3)") and resolved as by default: the source's
// change applies and the target ends with the source's rows. Without one, the changes apply
// as they come. In every mode; Parallel tracks the tables by that key (nothing serialized). A
// key column GENERATED ALWAYS on the target (fga) takes updates that keep the key.
func TestFullIdentityTargetKey(t *testing.T) {
	schema := []string{
		`CREATE TABLE fpk (id int NOT NULL, v text, n int NOT NULL)`,
		`CREATE UNIQUE INDEX fpk_id ON fpk (id)`,
		`ALTER TABLE fpk REPLICA IDENTITY FULL`,
		`CREATE TABLE fri (id int NOT NULL, v text, n int NOT NULL)`,
		`CREATE UNIQUE INDEX fri_id ON fri (id)`,
		`ALTER TABLE fri REPLICA IDENTITY FULL`,
		`CREATE TABLE fga (id int NOT NULL, v text)`,
		`ALTER TABLE fga REPLICA IDENTITY FULL`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	for _, major := range testMajors {
		srv := conflictServer(t, major)
		for _, mode := range []Mode{Buffered, Eager, Parallel} {
			for _, origin := range []bool{true, false} {
				t.Run(fmt.Sprintf("pg%d/%s/origin=%v", major, mode, origin), func(t *testing.T) {
					e := serverEnv(t, srv, "fulltargetkey", schema)
					// fga's key is GENERATED ALWAYS on the target, as pg_dump makes an identity
					// column: an update that keeps the key does not write it.
					pgtest.ExecAll(t, e.dst, `ALTER TABLE fpk ADD PRIMARY KEY USING INDEX fpk_id`,
						`ALTER TABLE fri REPLICA IDENTITY USING INDEX fri_id`,
						`ALTER TABLE fga ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY, ADD PRIMARY KEY (id)`)
					cfg, log := e.loggedConfig(t, nil)
					if !origin {
						cfg.Origin = ""
					}
					cfg.Mode = mode
					pgtest.ExecAll(t, e.src, `INSERT INTO fpk SELECT i, 'v' || i, i FROM generate_series(1, 10) i`,
						`INSERT INTO fri SELECT i, 'v' || i, i FROM generate_series(1, 10) i`,
						`INSERT INTO fga SELECT i, 'v' || i FROM generate_series(1, 10) i`, `INSERT INTO marker VALUES (1)`)
					r := start(t, cfg)
					e.waitMarker(t, r, 1)
					r.halt(t)
					pgtest.ExecAll(t, e.dst, `UPDATE fpk SET v = 'local' WHERE id IN (3, 7)`, `UPDATE fri SET v = 'local' WHERE id IN (3, 7)`)
					pgtest.ExecAll(t, e.src,
						`BEGIN; UPDATE fpk SET n = n + 100 WHERE id IN (2, 3, 4); DELETE FROM fpk WHERE id IN (6, 7);
							UPDATE fri SET n = n + 100 WHERE id IN (2, 3, 4); DELETE FROM fri WHERE id IN (6, 7); COMMIT`,
						`BEGIN; UPDATE fpk SET v = 'again' WHERE id = 3; UPDATE fri SET v = 'again' WHERE id = 3; COMMIT`,
						`UPDATE fga SET v = 'new' WHERE id % 2 = 0`, `UPDATE fga SET v = 'one' WHERE id = 1`, `DELETE FROM fga WHERE id = 9`,
						`INSERT INTO marker VALUES (2)`)
					r = start(t, cfg)
					e.waitMarker(t, r, 2)
					r.halt(t)
					e.sameRows(t, "fpk")
					e.sameRows(t, "fri")
					e.sameRows(t, "fga")
					want := map[conflict.Type]int64{conflict.UpdateOriginDiffers: 0, conflict.DeleteOriginDiffers: 0, conflict.UpdateMissing: 0, conflict.DeleteMissing: 0}
					if origin {
						want[conflict.UpdateOriginDiffers], want[conflict.DeleteOriginDiffers] = 2, 2
						if s := log.String(); !strings.Contains(s, "replica identity (id)=(3)") {
							t.Errorf("no conflict reported by the target's key, replica identity (id)=(3)")
						}
					}
					for ct, n := range want {
						if got := r.a.stats.Conflicts[ct].Load(); got != n {
							t.Errorf("%v: %d conflicts, want %d", ct, got, n)
						}
					}
					if n := r.a.stats.eng.SerialTxns.Load(); n != 0 {
						t.Errorf("%d transactions of FULL tables with a target key were serialized", n)
					}
				})
			}
		}
	}
}

// TestFullIdentityTargetKeyUpdateDeleted: a REPLICA IDENTITY FULL table found by its target's
// primary key gets tombstones as any keyed table: a row deleted on the target after the source
// updated it is update_deleted (skipped, by default), in every mode.
func TestFullIdentityTargetKeyUpdateDeleted(t *testing.T) {
	schema := []string{
		`CREATE TABLE fpk (id int NOT NULL, v text, n int NOT NULL)`,
		`CREATE UNIQUE INDEX fpk_id ON fpk (id)`,
		`ALTER TABLE fpk REPLICA IDENTITY FULL`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	srv := conflictServer(t, testMajors[len(testMajors)-1])
	for _, mode := range []Mode{Buffered, Eager, Parallel} {
		t.Run(mode.String(), func(t *testing.T) {
			e := serverEnv(t, srv, "fullupdel", schema)
			pgtest.ExecAll(t, e.dst, `ALTER TABLE fpk ADD PRIMARY KEY USING INDEX fpk_id`)
			cfg, log := e.loggedConfig(t, nil)
			cfg.Mode = mode
			cfg.Conflicts.Retention = time.Minute
			pgtest.ExecAll(t, e.src, `INSERT INTO fpk SELECT i, 'v' || i, i FROM generate_series(1, 4) i`, `INSERT INTO marker VALUES (1)`)
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			waitTriggerOn(t, e.dst, "fpk")
			r.halt(t)
			pgtest.ExecAll(t, e.src, `UPDATE fpk SET n = 20 WHERE id = 2`)
			pgtest.ClockPast(t, e.src) // the target's delete commits after the source's update
			pgtest.ExecAll(t, e.dst, `DELETE FROM fpk WHERE id = 2`)
			pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (2)`)
			r = start(t, cfg)
			e.waitMarker(t, r, 2)
			r.halt(t)
			if got := tableText(t, e.dst, "fpk"); got != "(1,v1,1) | (3,v3,3) | (4,v4,4)" {
				t.Errorf("target rows %s", got)
			}
			if n := r.a.stats.Conflicts[conflict.UpdateDeleted].Load(); n != 1 {
				t.Errorf("update_deleted: %d conflicts, want 1", n)
			}
			if !strings.Contains(log.String(), "replica identity (id)=(2)") {
				t.Errorf("no update_deleted reported by the target's key, replica identity (id)=(2)")
			}
		})
	}
}
