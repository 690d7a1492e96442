package apply

import (
	"fmt"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"testing"
)

// TestParallelKeyEquality: Parallel finds that two transactions touch the same row by the
// target's equality, not by the bytes sent: a numeric key deleted as 1.0 and inserted again as
// 1.00 is one row (as is character(n) with trailing spaces), and keys whose equality cannot be
// reproduced from the values (interval, a nondeterministic collation on the target) make their
// transactions serial; the rows are the source's.
func TestParallelKeyEquality(t *testing.T) {
	schema := []string{
		`CREATE TABLE num (id numeric PRIMARY KEY, v text)`,
		`CREATE TABLE pad (id char(6) PRIMARY KEY, v text)`,
		`CREATE TABLE span (id interval PRIMARY KEY, v text)`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := fullEnv(t, major, "keyforms", schema)
			pgtest.ExecAll(t, e.src, `CREATE TABLE cit (id text PRIMARY KEY, v text)`)
			pgtest.ExecAll(t, e.dst, `CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
				`CREATE TABLE cit (id text COLLATE ci PRIMARY KEY, v text)`)
			pgtest.ExecAll(t, e.src, `INSERT INTO num SELECT i / 10.0, 'v' FROM generate_series(1, 50) i`,
				`INSERT INTO pad SELECT 'p' || i, 'v' FROM generate_series(1, 20) i`)
			r := start(t, e.config(t, Parallel))
			pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			pgtest.ExecAll(t, e.src,
				`DELETE FROM num WHERE id = 1.0`, `INSERT INTO num VALUES (1.00, 'again')`, `UPDATE num SET v = 'later' WHERE id = 1`,
				`DELETE FROM num WHERE id = 2.5`, `INSERT INTO num VALUES (2.500, 'again')`,
				`DELETE FROM pad WHERE id = 'p1'`, `INSERT INTO pad VALUES ('p1', 'again')`,
				`INSERT INTO marker VALUES (2)`)
			e.waitMarker(t, r, 2)
			if n := r.a.stats.eng.SerialTxns.Load(); n != 0 {
				t.Errorf("%d transactions of numeric and character(n) keys were serialized", n)
			}
			pgtest.ExecAll(t, e.src, `INSERT INTO span VALUES ('1 day', 'a')`, `DELETE FROM span WHERE id = '24 hours'`,
				`INSERT INTO span VALUES ('24 hours', 'b')`, `INSERT INTO marker VALUES (3)`)
			e.waitMarker(t, r, 3)
			// (A run of transactions applied as one job becomes serial once.)
			span := r.a.stats.eng.SerialTxns.Load()
			if span == 0 {
				t.Error("transactions of an interval key were not serialized")
			}
			pgtest.ExecAll(t, e.src, `INSERT INTO cit VALUES ('Key', 'a')`, `DELETE FROM cit`, `INSERT INTO cit VALUES ('KEY', 'b')`,
				`INSERT INTO marker VALUES (4)`)
			e.waitMarker(t, r, 4)
			if n := r.a.stats.eng.SerialTxns.Load(); n == span {
				t.Error("transactions of a key with a nondeterministic collation on the target were not serialized")
			}
			r.halt(t)
			for _, table := range []string{"num", "pad", "span", "cit"} {
				e.sameRows(t, table)
			}
		})
	}
}
