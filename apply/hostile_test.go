package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// The tests here give the source or the target database settings (ALTER DATABASE ... SET) that
// would change how the SQL pgreorder sends is parsed, or end its sessions, and check that they
// have no effect on the Applier's connections.

// hostileName is a column name that closes a string literal when backslashes escape quotes.
const hostileName = `x\'); DROP TABLE victim; --`

// safeDSN is dsn with the settings a test's own connections need on a database whose defaults
// were made hostile.
func safeDSN(dsn string, major int) string {
	s := dsn + " search_path=public standard_conforming_strings=on statement_timeout=0 lock_timeout=0" +
		" idle_in_transaction_session_timeout=0 idle_session_timeout=0"
	if major >= 17 {
		s += " transaction_timeout=0"
	}
	return s
}

// alterDatabase sets the defaults of the database of dsn.
func alterDatabase(t *testing.T, dsn string, settings ...string) {
	t.Helper()
	stmts := make([]string, len(settings))
	for i, s := range settings {
		stmts[i] = "DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET " + strings.ReplaceAll(s, "'", "''") +
			"', pg_catalog.current_database()); END$$"
	}
	pgtest.ExecAll(t, dsn, stmts...)
}

// hostileEnv is a source and a target database of srv with table kv (key column col) and the
// marker table, a publication and, unless copying, the slot.
func hostileEnv(t *testing.T, srv *pgtest.Server, col string, slot bool) *env {
	t.Helper()
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	e := &env{srv: srv, src: srv.ConnString(srcDB), dst: srv.ConnString(dstDB), repl: srv.ReplicationConnString(srcDB), slot: "hostile"}
	schema := []string{
		`CREATE TABLE kv (` + pgsession.QuoteIdent(col) + ` int PRIMARY KEY, u int, v text)`,
		`CREATE TABLE marker (id int PRIMARY KEY)`,
	}
	src := append(append([]string{}, schema...), `CREATE PUBLICATION pub FOR ALL TABLES`)
	if slot {
		src = append(src, `SELECT pg_create_logical_replication_slot('hostile', 'pgoutput')`)
	}
	pgtest.ExecAll(t, e.src, src...)
	pgtest.ExecAll(t, e.dst, schema...)
	return e
}

// TestTombstoneInjection: a key column whose name would end a string literal on a target whose
// database sets standard_conforming_strings = off. The tombstone trigger is installed, records
// deletions under the column's real name, and nothing else runs.
func TestTombstoneInjection(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			e := hostileEnv(t, srv, hostileName, true)
			pgtest.ExecAll(t, e.dst, `CREATE TABLE victim (i int)`)
			alterDatabase(t, e.dst, "standard_conforming_strings = off", "escape_string_warning = off")
			dst := safeDSN(e.dst, major)
			cfg := e.config(t, Buffered)
			cfg.Conflicts.Retention = 5 * time.Minute
			pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (1, 1, 'a'), (2, 2, 'b')`, `INSERT INTO marker VALUES (1)`)
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			pgtest.Eventually(t, time.Minute, "the tombstone trigger on kv", func() bool {
				return pgtest.Count(t, dst, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'kv'::regclass AND tgname = '`+detect.TombstoneTrigger+`'`) > 0
			})
			if n := pgtest.Count(t, dst, `SELECT count(*) FROM pg_class WHERE relname = 'victim'`); n != 1 {
				t.Fatalf("table victim is gone from the target")
			}
			pgtest.ExecAll(t, dst, `DELETE FROM kv WHERE u = 1`)
			if n := pgtest.Count(t, dst, `SELECT count(*) FROM pgreorder_tombstones WHERE key = ARRAY['1']`); n != 1 {
				t.Errorf("%d tombstones for the deleted row, want 1", n)
			}
			r.halt(t)
		})
	}
}

// TestTombstoneLocalSessions: local deletions by a role that may only delete from the table,
// and by a session with another search_path, are recorded, in the tombstone table of a
// progress table's schema whose name needs quoting.
func TestTombstoneLocalSessions(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			e := hostileEnv(t, srv, "id", true)
			role := "pgr_deleter_" + fmt.Sprint(major)
			pgtest.ExecAll(t, e.dst, `CREATE SCHEMA "My ""Sch"""`, `CREATE SCHEMA appschema`,
				`DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '`+role+`') THEN CREATE ROLE `+role+`; END IF; END$$`,
				`GRANT DELETE ON kv TO `+role)
			t.Cleanup(func() {
				pgtest.ExecAll(t, e.dst, `DROP OWNED BY `+role)
			})
			cfg := e.config(t, Buffered)
			cfg.ProgressTable = `"My ""Sch""".progress`
			cfg.Conflicts.Retention = 5 * time.Minute
			pgtest.ExecAll(t, e.src, `INSERT INTO kv SELECT g, g, 'a' FROM generate_series(1, 4) g`, `INSERT INTO marker VALUES (1)`)
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			waitTrigger(t, e.dst)
			// Only DELETE: no WHERE clause, which would need SELECT.
			pgtest.ExecAll(t, e.dst, `BEGIN`+`; SET LOCAL ROLE `+role+`; DELETE FROM public.kv; COMMIT`)
			pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (5, 5, 'b')`, `INSERT INTO marker VALUES (2)`)
			e.waitMarker(t, r, 2)
			pgtest.ExecAll(t, e.dst, `SET search_path = appschema; DELETE FROM public.kv WHERE id = 5`)
			got := pgtest.Count(t, e.dst, `SELECT count(*) FROM "My ""Sch""".pgreorder_tombstones`)
			if got != 5 {
				t.Errorf("%d tombstones, want 5", got)
			}
			r.halt(t)
		})
	}
}

// recordSettings is the target's trigger that records, in the Applier's session, the settings
// apply pins.
func recordSettings(names []string) []string {
	return []string{
		`CREATE TABLE public.seen (name text, setting text)`,
		`CREATE FUNCTION public.record_settings() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN
			INSERT INTO public.seen SELECT n, pg_catalog.current_setting(n, true)
			FROM pg_catalog.unnest('{` + strings.Join(names, ",") + `}'::text[]) n;
			RETURN NULL; END$$`,
		`CREATE TRIGGER record_settings AFTER INSERT ON public.marker FOR EACH ROW EXECUTE FUNCTION public.record_settings()`,
		`ALTER TABLE public.marker ENABLE ALWAYS TRIGGER record_settings`,
	}
}

// trap makes the database's default search_path find an = operator on oids before
// pg_catalog's, one that fails.
var trap = []string{
	`CREATE SCHEMA evil`,
	`CREATE FUNCTION evil.trap(oid, oid) RETURNS bool LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'trapped'; END$$`,
	`CREATE OPERATOR evil.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = evil.trap)`,
}

// hostileValues are database defaults that would break the Applier's sessions, by setting.
var hostileValues = map[string]string{
	"client_encoding":                     "LATIN1",
	"datestyle":                           "'SQL, DMY'",
	"intervalstyle":                       "sql_standard",
	"extra_float_digits":                  "-15",
	"bytea_output":                        "escape",
	"standard_conforming_strings":         "off",
	"array_nulls":                         "off",
	"xmloption":                           "document",
	"search_path":                         "evil, pg_catalog, public",
	"statement_timeout":                   "'1ms'",
	"lock_timeout":                        "'1ms'",
	"idle_in_transaction_session_timeout": "'1ms'",
	"idle_session_timeout":                "'1ms'",
	"transaction_timeout":                 "'1ms'",
	"default_transaction_isolation":       "serializable",
	"default_transaction_read_only":       "on",
}

// TestPinnedTargetSettings gives the target database a hostile value of every setting apply
// pins: the Applier (with an initial copy, tombstones and a conflict log table) still works, and
// its sessions see the pinned values.
func TestPinnedTargetSettings(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			e := hostileEnv(t, srv, "id", false)
			want := map[string]string{}
			var names, hostile []string
			for _, p := range pgsession.Settings(pgsession.Target) {
				if p.Since > major {
					continue
				}
				h, ok := hostileValues[p.Name]
				if !ok {
					t.Fatalf("no hostile value of %s to test", p.Name)
				}
				want[p.Name] = p.Value
				names = append(names, p.Name)
				hostile = append(hostile, p.Name+" = "+h)
			}
			pgtest.ExecAll(t, e.dst, append(append([]string{}, trap...), recordSettings(names)...)...)
			alterDatabase(t, e.dst, hostile...)
			dst := safeDSN(e.dst, major)
			pgtest.ExecAll(t, e.src, `INSERT INTO kv SELECT g, g, 'copied' FROM generate_series(1, 50) g`)
			cfg := e.config(t, Buffered)
			cfg.Copy = true
			cfg.ProgressTable = "public.pgreorder_apply_progress"
			cfg.Conflicts.Retention = 5 * time.Minute
			cfg.Conflicts.LogTable = "public.conflict_log"
			r := start(t, cfg)
			e.dst = dst
			e.waitProgress(t, r) // the copy is done
			pgtest.ExecAll(t, e.src, `UPDATE kv SET v = 'updated' WHERE id <= 10`, `DELETE FROM kv WHERE id > 40`, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			r.halt(t)
			if got, want := rowsOf(t, dst), rowsOf(t, e.src); got != want {
				t.Errorf("target rows differ from the source's:\n%s\nwant\n%s", got, want)
			}
			seen := map[string]string{}
			ctx := pgtest.Context(t, time.Minute)
			c, err := pgx.Connect(ctx, dst)
			must(t, err)
			defer c.Close(context.Background())
			rows, err := c.Query(ctx, `SELECT name, setting FROM public.seen`)
			must(t, err)
			for rows.Next() {
				var n, s string
				must(t, rows.Scan(&n, &s))
				seen[n] = s
			}
			must(t, rows.Err())
			for n, v := range want {
				if ok := seen[n] == v || n == "datestyle" && strings.HasPrefix(seen[n], v+","); !ok {
					t.Errorf("%s in the Applier's session: %q, want %q", n, seen[n], v)
				}
			}
		})
	}
}

// TestPinnedSourceSettings gives the source database hostile parsing settings: the initial
// copy's and the stream's connections are not affected.
func TestPinnedSourceSettings(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			e := hostileEnv(t, srv, "id", false)
			pgtest.ExecAll(t, e.src, append(append([]string{}, trap...), `INSERT INTO kv SELECT g, g, 'copied' FROM generate_series(1, 50) g`)...)
			alterDatabase(t, e.src, "search_path = evil, pg_catalog, public", "standard_conforming_strings = off")
			src := safeDSN(e.src, major)
			cfg := e.config(t, Buffered)
			cfg.Copy = true
			r := start(t, cfg)
			e.waitProgress(t, r) // the copy is done
			pgtest.ExecAll(t, src, `UPDATE kv SET v = 'updated' WHERE id <= 10`, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			r.halt(t)
			if got, want := rowsOf(t, e.dst), rowsOf(t, src); got != want {
				t.Errorf("target rows differ from the source's:\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestIdleSessionTimeout: a target whose database ends idle sessions after a second, and a
// stream that pauses longer: the Applier keeps its connection and goes on.
func TestIdleSessionTimeout(t *testing.T) {
	major := testMajors[len(testMajors)-1]
	srv := pgtest.Shared(t, major)
	e := hostileEnv(t, srv, "id", true)
	alterDatabase(t, e.dst, "idle_session_timeout = '1s'")
	dst := safeDSN(e.dst, major)
	cfg := e.config(t, Buffered)
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (1, 1, 'a')`, `INSERT INTO marker VALUES (1)`)
	r := start(t, cfg)
	raw := e.dst
	e.dst = dst
	e.waitMarker(t, r, 1)
	// The pause outlasts the timeout: a session opened after the Applier's last statement is
	// ended by the server for its idleness first.
	ctx := pgtest.Context(t, time.Minute)
	canary, err := pgconn.Connect(ctx, raw)
	must(t, err)
	defer canary.Close(context.Background())
	pid := fmt.Sprint(canary.PID())
	pgtest.Eventually(t, time.Minute, "the server ended an idle session", func() bool {
		return pgtest.Count(t, dst, `SELECT count(*) FROM pg_stat_activity WHERE pid = `+pid) == 0
	})
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (2, 2, 'b')`, `INSERT INTO marker VALUES (2)`)
	e.waitMarker(t, r, 2)
	if n := r.a.Stats().Sessions; n != 1 {
		t.Errorf("%d sessions, want 1: a connection was lost", n)
	}
	r.halt(t)
}

// TestSessionEndRetried: the error of a statement on a connection the server ended (here by
// idle_session_timeout) is a lost connection, retried, not a refused change: over TCP the
// server's FATAL 57P05 is read, over a unix socket the write fails.
func TestSessionEndRetried(t *testing.T) {
	major := testMajors[len(testMajors)-1]
	srv := pgtest.Shared(t, major)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	ctx := pgtest.Context(t, time.Minute)
	for _, c := range []struct{ name, dsn string }{{"tcp", srv.TCPConnString(db)}, {"unix", dsn}} {
		conn, err := pgconn.Connect(ctx, c.dsn+" idle_session_timeout=100")
		must(t, err)
		defer conn.Close(context.Background())
		pid := fmt.Sprint(conn.PID())
		pgtest.Eventually(t, time.Minute, "the idle session ended", func() bool {
			return pgtest.Count(t, dsn, `SELECT count(*) FROM pg_stat_activity WHERE pid = `+pid) == 0
		})
		_, err = conn.Exec(ctx, "SELECT 1").ReadAll()
		if err == nil {
			t.Fatalf("%s: a statement on an ended session succeeded", c.name)
		}
		t.Logf("%s: %v", c.name, err)
		ae := &ApplyError{Op: OpInsert, Err: target.StatementError(target.OpInsert, err)}
		if !retryable(ae) {
			t.Errorf("%s: not retryable: %v", c.name, ae)
		}
	}
	// The same for every error the server sends as it ends a session.
	for _, code := range []string{"57P05", "25P03", "25P04", "XX000"} {
		fatal := &pgconn.PgError{Severity: "FATAL", Code: code, Message: "terminating connection"}
		if err := (&ApplyError{Op: OpInsert, Err: target.StatementError(target.OpInsert, fatal)}); !retryable(err) {
			t.Errorf("FATAL %s: not retryable", code)
		}
	}
	// But not a server that refuses the connection.
	if _, err := pgconn.Connect(ctx, srv.ConnString("no_such_database")); err == nil || retryable(err) {
		t.Errorf("connecting to a missing database: %v, retryable %v", err, retryable(err))
	}
	// Nor a change the server refused.
	refused := &pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "duplicate key"}
	if err := (&ApplyError{Op: OpInsert, Err: target.StatementError(target.OpInsert, refused)}); retryable(err) {
		t.Error("a unique violation is retryable")
	}
}

// TestUninstall removes what an Applier with tombstones and an origin left on the target, and
// refuses while it runs; an Applier started afterwards sets it up again.
func TestUninstall(t *testing.T) {
	major := testMajors[len(testMajors)-1]
	srv := pgtest.Shared(t, major)
	e := hostileEnv(t, srv, "id", true)
	cfg := e.config(t, Eager)
	cfg.Workers = 2
	cfg.Origin = "pgr_uninstall"
	cfg.ProgressTable = `"My ""Sch""".progress`
	cfg.Conflicts.Retention = 5 * time.Minute
	pgtest.ExecAll(t, e.dst, `CREATE SCHEMA "My ""Sch"""`)
	dropOrigins(t, e.dst, cfg.Origin)
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (1, 1, 'a')`, `INSERT INTO marker VALUES (1)`)
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	// The triggers are made in the background, one table after the other: both must be there.
	waitTrigger(t, e.dst)
	waitTriggerOn(t, e.dst, "marker")
	ctx := pgtest.Context(t, time.Minute)
	a, err := New(cfg)
	must(t, err)
	if _, err := a.Uninstall(ctx, UninstallOptions{Progress: true, Origins: true}); !errors.Is(err, ErrSlotInUse) {
		t.Fatalf("Uninstall while running: %v, want ErrSlotInUse", err)
	}
	r.halt(t)
	left := func() map[string]int64 {
		return map[string]int64{
			"triggers": pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_trigger WHERE tgname = '`+detect.TombstoneTrigger+`'`),
			"functions": pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
				WHERE n.nspname = 'My "Sch"' AND p.proname = 'pgreorder_tombstones_record'`),
			"tables":  pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'My "Sch"'`),
			"origins": pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'pgr_uninstall%'`),
		}
	}
	before := left()
	if before["triggers"] != 2 || before["functions"] != 1 || before["tables"] == 0 || before["origins"] != 3 {
		t.Fatalf("before Uninstall: %v", before)
	}
	// Another slot's progress row keeps the progress table.
	pgtest.ExecAll(t, e.dst, `INSERT INTO "My ""Sch""".progress VALUES ('other', '0/1')`)
	u, err := a.Uninstall(ctx, UninstallOptions{Progress: true, Origins: true})
	must(t, err)
	if len(u.TombstoneTriggers) != 2 || u.TombstoneFunction == "" || u.TombstoneTable == "" || u.ProgressRows == 0 ||
		len(u.DroppedTables) != 1 || u.DroppedTables[0] != `"My ""Sch"""."progress_tables"` || len(u.Origins) != 3 {
		t.Errorf("Uninstall says it removed %+v", u)
	}
	t.Log(u)
	if got := left(); got["triggers"] != 0 || got["functions"] != 0 || got["tables"] != 2 || got["origins"] != 0 {
		t.Errorf("after Uninstall: %v, want only the progress table (and its index)", got)
	}
	if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM "My ""Sch""".progress WHERE slot = 'hostile'`); n != 0 {
		t.Errorf("the slot's progress row is still there")
	}
	// Again: nothing left to remove, and no notices about what is not there.
	if u, err := a.Uninstall(ctx, UninstallOptions{Progress: true, Origins: true}); err != nil || u.String() != "nothing to remove" {
		t.Errorf("a second Uninstall: %q, %v", u, err)
	}
	// The store comes back with the next Run.
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (2, 2, 'b')`, `INSERT INTO marker VALUES (2)`)
	r = start(t, cfg)
	e.waitMarker(t, r, 2)
	waitTrigger(t, e.dst)
	r.halt(t)
}

// TestUnqualifiedNames: the configured tables without a schema go where the target role's
// search_path says, although the Applier's sessions pin their own: an existing table where it
// is, a new one in the first schema of the path.
func TestUnqualifiedNames(t *testing.T) {
	major := testMajors[len(testMajors)-1]
	srv := pgtest.Shared(t, major)
	e := hostileEnv(t, srv, "id", true)
	pgtest.ExecAll(t, e.dst, `CREATE SCHEMA app`, `CREATE TABLE public.conflict_log (id int)`)
	alterDatabase(t, e.dst, "search_path = app, public")
	cfg := e.config(t, Buffered)
	cfg.Conflicts.Retention = 5 * time.Minute
	cfg.Conflicts.LogTable = "conflict_log"
	pgtest.ExecAll(t, e.src, `INSERT INTO kv VALUES (1, 1, 'a')`, `INSERT INTO marker VALUES (1)`)
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	waitTrigger(t, e.dst)
	r.halt(t)
	for _, table := range []string{"app.pgreorder_apply_progress", "app.pgreorder_tombstones", "public.conflict_log"} {
		if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass('`+table+`')`); n != 1 {
			t.Errorf("no table %s", table)
		}
	}
	if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM app.pgreorder_apply_progress WHERE slot = 'hostile'`); n != 1 {
		t.Errorf("no progress row in app.pgreorder_apply_progress")
	}
}
