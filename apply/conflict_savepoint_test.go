package apply

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestResolutionSurvivesLaterCopy resolves a conflict of a transaction's first statement, then
// sends a run of inserts long enough for COPY into another table, one of whose rows conflicts:
// the COPY is rolled back to its savepoint and sent again, and the first resolution must stay
// applied. Every resolution of every conflict an earlier statement meets is tried, and the
// conflict log table must say what the target kept.
func TestResolutionSurvivesLaterCopy(t *testing.T) {
	srv := conflictServer(t, testMajors[len(testMajors)-1])
	schema := []string{
		`CREATE TABLE t (id int PRIMARY KEY, v text)`,
		`CREATE TABLE u (id int PRIMARY KEY, v text)`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	type kind struct {
		ct      conflict.Type
		setup   []string // on the source, replicated first
		local   string   // on the target
		remote  string   // the source transaction's first statement
		applied string   // t on the target when the source's change wins
		kept    string   // t when the local row is kept
	}
	kinds := []kind{
		{ct: conflict.InsertExists, local: `INSERT INTO t VALUES (10, 'local')`, remote: `INSERT INTO t VALUES (10, 'remote')`,
			applied: "10,remote", kept: "10,local"},
		{ct: conflict.UpdateMissing, setup: []string{`INSERT INTO t VALUES (10, 'orig')`}, local: `DELETE FROM t WHERE id = 10`,
			remote: `UPDATE t SET v = 'remote' WHERE id = 10`, applied: "10,remote", kept: ""},
		{ct: conflict.UpdateOriginDiffers, setup: []string{`INSERT INTO t VALUES (10, 'orig')`}, local: `UPDATE t SET v = 'local' WHERE id = 10`,
			remote: `UPDATE t SET v = 'remote' WHERE id = 10`, applied: "10,remote", kept: "10,local"},
		{ct: conflict.DeleteOriginDiffers, setup: []string{`INSERT INTO t VALUES (10, 'orig')`}, local: `UPDATE t SET v = 'local' WHERE id = 10`,
			remote: `DELETE FROM t WHERE id = 10`, applied: "", kept: "10,local"},
	}
	for _, k := range kinds {
		for _, res := range []conflict.Resolution{conflict.ApplyRemote, conflict.Skip, conflict.LastUpdateWins} {
			t.Run(k.ct.String()+"/"+res.String(), func(t *testing.T) {
				e := serverEnv(t, srv, "later_copy", schema)
				var log pgtest.LockedBuffer
				resolutions := map[conflict.Type]conflict.Resolution{k.ct: res}
				uRes := res
				if k.ct != conflict.InsertExists {
					uRes = conflict.ApplyRemote
					resolutions[conflict.InsertExists] = uRes
				}
				cfg := e.conflictConfig(t, &log, resolutions)
				cfg.Conflicts.LogTable = "conflict_log"
				dropOrigins(t, e.dst, cfg.Origin)
				t.Cleanup(func() {
					if t.Failed() {
						t.Log(log.String())
					}
				})
				pgtest.ExecAll(t, e.src, append(k.setup, `INSERT INTO marker VALUES (1)`)...)
				r := start(t, cfg)
				e.waitMarker(t, r, 1)
				r.halt(t)
				pgtest.ExecAll(t, e.dst, k.local, `INSERT INTO u VALUES (3, 'local')`)
				pgtest.ClockPast(t, e.dst) // the source's commit is the later one
				pgtest.ExecAll(t, e.src, `BEGIN; `+k.remote+`; INSERT INTO u SELECT g, 'remote' FROM generate_series(1, 5) g; COMMIT`,
					`INSERT INTO marker VALUES (2)`)
				r = start(t, cfg)
				e.waitMarker(t, r, 2)
				e.settled(t, r)
				r.halt(t)

				wins := res == conflict.ApplyRemote || res == conflict.LastUpdateWins
				wantT := k.kept
				if wins {
					wantT = k.applied
				}
				uWins := uRes == conflict.ApplyRemote || uRes == conflict.LastUpdateWins
				wantU := "1,remote 2,remote 3,local 4,remote 5,remote"
				if uWins {
					wantU = "1,remote 2,remote 3,remote 4,remote 5,remote"
				}
				if got := tableRows(t, e.dst, "t"); got != wantT {
					t.Errorf("t on the target: %q, want %q", got, wantT)
				}
				if got := tableRows(t, e.dst, "u"); got != wantU {
					t.Errorf("u on the target: %q, want %q", got, wantU)
				}
				// The log table says what the target kept.
				logged := func(rel string, ct conflict.Type, won bool, r conflict.Resolution) string {
					name := r.String()
					switch {
					case r == conflict.LastUpdateWins && won:
						name = conflict.ApplyRemote.String()
					case r == conflict.LastUpdateWins:
						name = conflict.Skip.String()
					}
					return fmt.Sprintf(`"public"."%s":%s:%s`, rel, ct, name)
				}
				want := []string{logged("t", k.ct, wins, res), logged("u", conflict.InsertExists, uWins, uRes)}
				if got := logRows(t, e.dst); got != strings.Join(want, " ") {
					t.Errorf("conflict log table: %q, want %q", got, strings.Join(want, " "))
				}
			})
		}
	}
}

// tableRows returns a two-column table's rows as "id,v" strings, in id order.
func tableRows(t *testing.T, dsn, table string) string {
	t.Helper()
	return pgtest.QueryOne[string](t, dsn, `SELECT coalesce(string_agg(id || ',' || coalesce(v, '-'), ' ' ORDER BY id), '') FROM `+table)
}

// logRows returns the conflict log table's rows as relation:conflict:resolution, sorted.
func logRows(t *testing.T, dsn string) string {
	t.Helper()
	return pgtest.QueryOne[string](t, dsn, `SELECT coalesce(string_agg(relation || ':' || conflict || ':' || resolution, ' '
		ORDER BY relation, conflict), '') FROM conflict_log`)
}
