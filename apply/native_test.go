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

// TestConflictsMatchNative holds the Applier against PostgreSQL's own subscriber, as an oracle:
// a subscription of the same publication, into a third database of the same server, with the
// same rows and the same local changes (rows changed and deleted on the target) before the
// source updates and deletes them. Both targets must end with the same rows, and on PostgreSQL
// 18, whose subscriber counts its conflicts (pg_stat_subscription_stats), with the same
// conflicts of each type. The tables: keyed by a primary key; REPLICA IDENTITY FULL whose target
// has a primary key (found by it: a row changed in another column is still the row); FULL whose
// target has only a unique index, and FULL without an index (found by the whole old row: a row
// changed in another column is missing); and tables whose every column is in the key (FULL with
// such a target primary key, and keyed), updated to the values they have. Updates of the key among the changes. Every mode; the
// conflicts are resolved as PostgreSQL resolves them (Config's default).
func TestConflictsMatchNative(t *testing.T) {
	tables := []string{"kd", "fpk", "fu", "fn", "fko", "kko"}
	schema := []string{
		`CREATE TABLE kko (id int NOT NULL, n int NOT NULL, PRIMARY KEY (id, n))`, // keyed, every column in the key
		`CREATE TABLE fko (id int NOT NULL, n int NOT NULL)`,                      // FULL, every column in the target's key
		`CREATE UNIQUE INDEX fko_id ON fko (id, n)`,
		`ALTER TABLE fko REPLICA IDENTITY FULL`,
		`CREATE TABLE kd (id int PRIMARY KEY, v text, n int NOT NULL)`,
		`CREATE TABLE fpk (id int NOT NULL, v text, n int NOT NULL)`,
		`CREATE UNIQUE INDEX fpk_id ON fpk (id)`,
		`ALTER TABLE fpk REPLICA IDENTITY FULL`,
		`CREATE TABLE fu (id int NOT NULL, v text, n int NOT NULL)`,
		`CREATE UNIQUE INDEX fu_id ON fu (id)`,
		`ALTER TABLE fu REPLICA IDENTITY FULL`,
		`CREATE TABLE fn (id int, v text, n int)`,
		`ALTER TABLE fn REPLICA IDENTITY FULL`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	targetOnly := []string{`ALTER TABLE fpk ADD PRIMARY KEY USING INDEX fpk_id`, `ALTER TABLE fko ADD PRIMARY KEY USING INDEX fko_id`}
	// fko: rows changed on the target in no column (there are none besides the key), deleted, and
	// updated by the source to the same values (an update that writes nothing new).
	var local, remote []string
	for _, tb := range []string{"fko", "kko"} {
		local = append(local, `DELETE FROM `+tb+` WHERE id IN (5, 9)`)
		remote = append(remote, `BEGIN; UPDATE `+tb+` SET n = n WHERE id IN (2, 5); UPDATE `+tb+` SET n = n + 100 WHERE id = 4; DELETE FROM `+tb+` WHERE id IN (6, 9); COMMIT`)
	}
	for _, tb := range tables[:4] {
		local = append(local, `UPDATE `+tb+` SET v = 'local' WHERE id IN (3, 7, 10)`, `DELETE FROM `+tb+` WHERE id IN (5, 9)`)
		remote = append(remote, `BEGIN; UPDATE `+tb+` SET n = n + 100 WHERE id IN (2, 3, 4, 5); DELETE FROM `+tb+` WHERE id IN (6, 7, 9); COMMIT`,
			`UPDATE `+tb+` SET id = id + 100 WHERE id IN (8, 10)`) // the key changes, of a row as it was and of one changed
	}
	for _, major := range testMajors {
		srv := conflictServer(t, major)
		for _, mode := range []Mode{Buffered, Eager, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := serverEnv(t, srv, "oracle", schema)
				nat := srv.ConnString(pgtest.NewDatabase(t, srv))
				pgtest.ExecAll(t, nat, schema...)
				pgtest.ExecAll(t, nat, targetOnly...)
				pgtest.ExecAll(t, e.dst, targetOnly...)
				pgtest.ExecAll(t, e.src, `SELECT pg_create_logical_replication_slot('oracle_native', 'pgoutput')`)
				pgtest.ExecAll(t, nat, `CREATE SUBSCRIPTION oracle_sub CONNECTION '`+strings.ReplaceAll(e.src, `'`, `''`)+`' PUBLICATION pub
					WITH (create_slot = false, slot_name = 'oracle_native', copy_data = false)`)
				t.Cleanup(func() { // before the databases go
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					if err := pgtest.Exec(ctx, nat, `ALTER SUBSCRIPTION oracle_sub DISABLE`, `ALTER SUBSCRIPTION oracle_sub SET (slot_name = NONE)`,
						`DROP SUBSCRIPTION oracle_sub`); err != nil {
						t.Errorf("dropping the subscription: %v", err)
					}
				})
				cfg, _ := e.loggedConfig(t, nil)
				cfg.Mode = mode
				rows := []string{`INSERT INTO fko SELECT i, i FROM generate_series(1, 10) i`, `INSERT INTO kko SELECT i, i FROM generate_series(1, 10) i`}
				for _, tb := range tables[:4] {
					rows = append(rows, `INSERT INTO `+tb+` SELECT i, 'v' || i, i FROM generate_series(1, 10) i`)
				}
				pgtest.ExecAll(t, e.src, append(rows, `INSERT INTO marker VALUES (1)`)...)
				r := start(t, cfg)
				e.waitMarker(t, r, 1)
				r.halt(t)
				waitNative(t, nat, 1)

				pgtest.ExecAll(t, e.dst, local...)
				pgtest.ExecAll(t, nat, local...)
				pgtest.ExecAll(t, e.src, append(remote, `INSERT INTO marker VALUES (2)`)...)
				r = start(t, cfg)
				e.waitMarker(t, r, 2)
				r.halt(t)
				waitNative(t, nat, 2)

				// A round whose only conflict is such an update of a row the target lost (no
				// other change falls back to row by row with it).
				for _, dsn := range []string{e.dst, nat} {
					pgtest.ExecAll(t, dsn, `DELETE FROM fko WHERE id = 3`, `DELETE FROM kko WHERE id = 3`)
				}
				pgtest.ExecAll(t, e.src, `BEGIN; UPDATE fko SET n = n WHERE id = 3; UPDATE kko SET n = n WHERE id = 3; INSERT INTO marker VALUES (3); COMMIT`)
				r2 := start(t, cfg)
				e.waitMarker(t, r2, 3)
				r2.halt(t)
				waitNative(t, nat, 3)

				for _, tb := range tables {
					if ours, theirs := tableText(t, e.dst, tb), tableText(t, nat, tb); ours != theirs {
						t.Errorf("%s: the Applier's target\n%s\nPostgreSQL's subscriber's\n%s", tb, ours, theirs)
					}
				}
				if major < 18 {
					return // no conflict statistics
				}
				types := []conflict.Type{conflict.UpdateOriginDiffers, conflict.UpdateMissing, conflict.DeleteOriginDiffers, conflict.DeleteMissing}
				ours := make([]int64, len(types))
				for i, ct := range types {
					ours[i] = r.a.stats.Conflicts[ct].Load() + r2.a.stats.Conflicts[ct].Load()
				}
				// The subscriber's worker reports its counts after a transaction, at most once a
				// second: wait until they are ours, giving it a transaction (a marker) every half
				// second meanwhile, for at most a minute.
				var theirs []int64
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				for i := 100; ; i++ {
					theirs = nativeConflicts(t, nat, types)
					if fmt.Sprint(theirs) == fmt.Sprint(ours) || ctx.Err() != nil {
						break
					}
					pgtest.ExecAll(t, e.src, fmt.Sprintf(`INSERT INTO marker VALUES (%d)`, i))
					select {
					case <-ctx.Done():
					case <-time.After(500 * time.Millisecond):
					}
				}
				for i, ct := range types {
					if ours[i] != theirs[i] {
						t.Errorf("%v: the Applier counted %d, PostgreSQL's subscriber %d", ct, ours[i], theirs[i])
					}
				}
				if ours[0] == 0 || ours[1] == 0 || ours[2] == 0 || ours[3] == 0 {
					t.Errorf("conflicts %v of %v: the workload should meet each type", ours, types)
				}
			})
		}
	}
}

// waitNative waits until PostgreSQL's subscriber into dsn applied marker id.
func waitNative(t *testing.T, dsn string, id int) {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	c, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer c.Close(context.Background())
	pgtest.Eventually(t, time.Minute, fmt.Sprintf("PostgreSQL's subscriber to apply marker %d", id), func() bool {
		var n int
		must(t, c.QueryRow(ctx, `SELECT count(*) FROM marker WHERE id = $1`, id).Scan(&n))
		return n > 0
	})
}

// nativeConflicts returns the conflicts of each type PostgreSQL's subscriber oracle_sub counted
// (PostgreSQL 18's pg_stat_subscription_stats).
func nativeConflicts(t *testing.T, dsn string, types []conflict.Type) []int64 {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	c, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer c.Close(context.Background())
	cols := make([]string, len(types))
	for i, ct := range types {
		cols[i] = "confl_" + ct.String()
	}
	out := make([]int64, len(types))
	dest := make([]any, len(types))
	for i := range out {
		dest[i] = &out[i]
	}
	must(t, c.QueryRow(ctx, `SELECT `+strings.Join(cols, ", ")+` FROM pg_stat_subscription_stats WHERE subname = 'oracle_sub'`).Scan(dest...))
	return out
}
