package pgsession_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// hostile are database defaults other than every pinned value (as SQL, and as current_setting
// reads them back), none of which ends a session of the test.
var hostile = map[string][2]string{
	"client_encoding":                     {"LATIN1", "LATIN1"},
	"datestyle":                           {"'SQL, DMY'", "SQL, DMY"},
	"intervalstyle":                       {"sql_standard", "sql_standard"},
	"extra_float_digits":                  {"-15", "-15"},
	"bytea_output":                        {"escape", "escape"},
	"standard_conforming_strings":         {"off", "off"},
	"array_nulls":                         {"off", "off"},
	"xmloption":                           {"document", "document"},
	"search_path":                         {"evil, public", "evil, public"},
	"statement_timeout":                   {"'1h'", "1h"},
	"lock_timeout":                        {"'1h'", "1h"},
	"idle_in_transaction_session_timeout": {"'1h'", "1h"},
	"idle_session_timeout":                {"'1h'", "1h"},
	"transaction_timeout":                 {"'1h'", "1h"},
	"default_transaction_isolation":       {"serializable", "serializable"},
	"default_transaction_read_only":       {"on", "on"},
}

// TestPinnedSettings gives a database a value other than the pinned one of every setting: each
// kind of connection sees the pinned values of its kind and the database's of the others,
// transaction_timeout included where the server has it (older servers refuse it at startup, and
// are connected to again without it); a Target's BeforeSearchPath sees the user's search_path.
func TestPinnedSettings(t *testing.T) {
	pgtest.EachMajor(t, []int{15, 16, 17, 18}, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		db := pgtest.NewDatabase(t, srv)
		var all []pgsession.Setting
		var names []string
		for _, k := range []pgsession.Kind{pgsession.Replication, pgsession.Source, pgsession.Target, pgsession.Store} {
			for _, s := range pgsession.Settings(k) {
				if s.Since <= srv.Major() && !strings.Contains(strings.Join(names, ","), s.Name) {
					all, names = append(all, s), append(names, s.Name)
				}
			}
		}
		var alter []string
		for _, s := range all {
			h, ok := hostile[s.Name]
			if !ok {
				t.Fatalf("no hostile value of %s to test", s.Name)
			}
			alter = append(alter, "ALTER DATABASE "+pgsession.QuoteIdent(db)+" SET "+s.Name+" = "+h[0])
		}
		pgtest.ExecAll(t, srv.ConnString("postgres"), alter...)
		pc, err := pgsession.ParseConnString(srv.ConnString(db))
		if err != nil {
			t.Fatal(err)
		}
		read := "SELECT n, pg_catalog.current_setting(n) FROM pg_catalog.unnest('{" + strings.Join(names, ",") + "}'::text[]) n " +
			"UNION ALL SELECT 'application_name', pg_catalog.current_setting('application_name')"
		check := func(kind pgsession.Kind, rows [][]string) {
			t.Helper()
			got := map[string]string{}
			for _, r := range rows {
				got[r[0]] = r[1]
			}
			for _, s := range all {
				want := hostile[s.Name][1]
				if s.Kinds&kind != 0 {
					want = s.Value
				}
				if g := got[s.Name]; g != want && !(s.Name == "datestyle" && strings.HasPrefix(g, want+", ")) {
					t.Errorf("kind %d: %s = %q, want %q", kind, s.Name, g, want)
				}
			}
			if got["application_name"] != "test" {
				t.Errorf("kind %d: application_name %q", kind, got["application_name"])
			}
		}

		for _, kind := range []pgsession.Kind{pgsession.Replication, pgsession.Source, pgsession.Target} {
			var userPath string
			o := pgsession.Options{Kind: kind, Config: pc, ApplicationName: "test"}
			if kind == pgsession.Target {
				o.BeforeSearchPath = func(ctx context.Context, conn *pgconn.PgConn) error {
					r, err := conn.Exec(ctx, "SHOW search_path").ReadAll()
					if err == nil {
						userPath = string(r[0].Rows[0][0])
					}
					return err
				}
			}
			conn, err := pgsession.Connect(ctx, o)
			if err != nil {
				t.Fatalf("kind %d: %v", kind, err)
			}
			res, err := conn.Exec(ctx, read).ReadAll()
			conn.Close(ctx)
			if err != nil {
				t.Fatalf("kind %d: %v", kind, err)
			}
			var rows [][]string
			for _, r := range res[0].Rows {
				rows = append(rows, []string{string(r[0]), string(r[1])})
			}
			check(kind, rows)
			if kind == pgsession.Target && userPath != "evil, public" {
				t.Errorf("BeforeSearchPath saw search_path %q, want the database's", userPath)
			}
		}

		pcfg, err := pgsession.ParsePgxConnString(srv.ConnString(db))
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgsession.ConnectPgx(ctx, pcfg, pgsession.Options{Kind: pgsession.Store, ApplicationName: "test"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, read)
		if err != nil {
			t.Fatal(err)
		}
		var got [][]string
		for rows.Next() {
			var n, v string
			if err := rows.Scan(&n, &v); err != nil {
				t.Fatal(err)
			}
			got = append(got, []string{n, v})
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		check(pgsession.Store, got)

		hookErr := errors.New("names")
		_, err = pgsession.Connect(ctx, pgsession.Options{Kind: pgsession.Target, Config: pc,
			BeforeSearchPath: func(context.Context, *pgconn.PgConn) error { return hookErr }})
		if !errors.Is(err, hookErr) {
			t.Errorf("BeforeSearchPath's error: %v", err)
		}
	})
}
