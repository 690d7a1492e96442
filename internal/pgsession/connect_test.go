package pgsession

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestPrepare(t *testing.T) {
	base, err := pgconn.ParseConfig("host=/nonexistent application_name=mine ExTrA_FlOaT_DiGiTs=0 replication=database Search_Path=x")
	if err != nil {
		t.Fatal(err)
	}
	orig := maps.Clone(base.RuntimeParams)
	var hooked *pgconn.Config
	o := Options{Kind: Source, Config: base, ApplicationName: "default", Logger: slog.New(slog.DiscardHandler),
		BeforeConnect: func(_ context.Context, c *pgconn.Config) error {
			hooked = c
			c.RuntimeParams["lock_timeout"] = "1s" // the map exists for the hook
			c.Password = "token"
			return nil
		}}
	pc, err := Prepare(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if hooked != pc || pc == base {
		t.Error("the hook did not get the attempt's own copy")
	}
	if !maps.Equal(base.RuntimeParams, orig) || base.Password == "token" {
		t.Errorf("base was modified: %v", base.RuntimeParams)
	}
	want := map[string]string{"application_name": "mine", "search_path": "pg_catalog, pg_temp", "datestyle": "ISO",
		"intervalstyle": "postgres", "extra_float_digits": "3", "client_encoding": "UTF8",
		"standard_conforming_strings": "on", "statement_timeout": "0", "idle_in_transaction_session_timeout": "0",
		"idle_session_timeout": "0", "lock_timeout": "1s"}
	if !maps.Equal(pc.RuntimeParams, want) {
		t.Errorf("runtime params %v\nwant %v", pc.RuntimeParams, want)
	}
	if pc.Password != "token" || pc.OnNotice == nil || ownWatcher(base, pc) {
		t.Errorf("password %q, OnNotice set %v, context watcher replaced %v", pc.Password, pc.OnNotice != nil, ownWatcher(base, pc))
	}

	o.ForceApplicationName = true
	if pc, err = Prepare(context.Background(), o); err != nil || pc.RuntimeParams["application_name"] != "default" {
		t.Errorf("forced application_name: %q, %v", pc.RuntimeParams["application_name"], err)
	}

	hookErr := errors.New("no token")
	o.BeforeConnect = func(context.Context, *pgconn.Config) error { return hookErr }
	if _, err = Prepare(context.Background(), o); !errors.Is(err, hookErr) {
		t.Errorf("hook error: got %v", err)
	}
	for _, k := range []Kind{0, Source | Target, 1 << 7} {
		if _, err := Prepare(context.Background(), Options{Kind: k, Config: base}); err == nil {
			t.Errorf("kind %d accepted", k)
		}
	}
}

// ownWatcher reports whether pc's context watcher is not base's.
func ownWatcher(base, pc *pgconn.Config) bool {
	return reflect.ValueOf(base.BuildContextWatcherHandler).Pointer() != reflect.ValueOf(pc.BuildContextWatcherHandler).Pointer()
}

// TestPrepareKinds: each kind's startup parameters are its settings without a Since, and no
// other; a Replication connection is a walsender's.
func TestPrepareKinds(t *testing.T) {
	base, err := pgconn.ParseConfig("host=/nonexistent search_path=mine")
	if err != nil {
		t.Fatal(err)
	}
	common := map[string]string{"application_name": "app", "datestyle": "ISO", "intervalstyle": "postgres",
		"extra_float_digits": "3", "client_encoding": "UTF8", "standard_conforming_strings": "on",
		"statement_timeout": "0", "idle_in_transaction_session_timeout": "0", "idle_session_timeout": "0"}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(common)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tt := range []struct {
		name  string
		kind  Kind
		later bool // BeforeSearchPath set
		want  map[string]string
	}{
		{"replication", Replication, false, with("search_path", "pg_catalog, pg_temp", "replication", "database")},
		{"source", Source, false, with("search_path", "pg_catalog, pg_temp")},
		{"target", Target, false, with("search_path", "pg_catalog, pg_temp", "lock_timeout", "0", "bytea_output", "hex",
			"array_nulls", "on", "xmloption", "content", "default_transaction_isolation", "read committed",
			"default_transaction_read_only", "off")},
		{"target, search_path later", Target, true, with("search_path", "mine", "lock_timeout", "0", "bytea_output", "hex",
			"array_nulls", "on", "xmloption", "content", "default_transaction_isolation", "read committed",
			"default_transaction_read_only", "off")},
		{"store", Store, false, with("search_path", "mine", "lock_timeout", "0")},
	} {
		o := Options{Kind: tt.kind, Config: base, ApplicationName: "app"}
		if tt.later {
			o.BeforeSearchPath = func(context.Context, *pgconn.PgConn) error { return nil }
		}
		pc, err := Prepare(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(pc.RuntimeParams, tt.want) {
			t.Errorf("%s: runtime params %v\nwant %v", tt.name, pc.RuntimeParams, tt.want)
		}
		if ownWatcher(base, pc) != (tt.kind == Replication) {
			t.Errorf("%s: a context watcher of its own: %v", tt.name, ownWatcher(base, pc))
		}
	}
}

// TestSettings: every setting is pinned on some connection, once, and the newer ones are set
// after connecting on ordinary connections only.
func TestSettings(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range settings {
		if seen[s.Name] || s.Kinds == 0 || s.Kinds&^every != 0 || s.Name == "" || s.Value == "" {
			t.Errorf("setting %+v", s)
		}
		seen[s.Name] = true
	}
	for _, k := range []Kind{Replication, Source, Target, Store} {
		names := map[string]bool{}
		for _, s := range Settings(k) {
			names[s.Name] = true
			if k == Replication && s.Since != 0 {
				t.Errorf("%s (PostgreSQL %d+) on a replication connection", s.Name, s.Since)
			}
		}
		for _, n := range []string{"datestyle", "intervalstyle", "extra_float_digits", "client_encoding",
			"standard_conforming_strings", "statement_timeout", "idle_in_transaction_session_timeout", "idle_session_timeout"} {
			if !names[n] {
				t.Errorf("kind %d does not pin %s", k, n)
			}
		}
		if names["search_path"] == (k == Store) {
			t.Errorf("kind %d: search_path pinned %v", k, names["search_path"])
		}
	}
}

func TestConnectNotParsed(t *testing.T) {
	ctx := context.Background()
	for _, o := range []Options{{Kind: Source}, {Kind: Source, Config: &pgconn.Config{}}, {Kind: Replication, Config: &pgconn.Config{}}} {
		if _, err := Connect(ctx, o); !errors.Is(err, ErrNotParsed) {
			t.Errorf("%+v: got %v, want ErrNotParsed", o, err)
		}
	}
	for _, cfg := range []*pgx.ConnConfig{nil, {}} {
		if _, err := ConnectPgx(ctx, cfg, Options{Kind: Store}); !errors.Is(err, ErrNotParsed) {
			t.Errorf("pgx %v: got %v, want ErrNotParsed", cfg, err)
		}
	}
}
