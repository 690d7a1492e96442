package replication

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestAttempt(t *testing.T) {
	base, err := pgconn.ParseConfig("host=/nonexistent application_name=mine ExTrA_FlOaT_DiGiTs=0")
	if err != nil {
		t.Fatal(err)
	}
	var hooked *pgconn.Config
	pc, err := attempt(context.Background(), base, func(_ context.Context, c *pgconn.Config) error {
		hooked = c
		c.RuntimeParams["search_path"] = "x" // the map exists for the hook
		return nil
	}, DefaultSettings(), "default", false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if hooked != pc || pc == base {
		t.Error("the hook did not get the attempt's own copy")
	}
	if base.RuntimeParams["search_path"] != "" || base.RuntimeParams["extra_float_digits"] != "" {
		t.Errorf("base was modified: %v", base.RuntimeParams)
	}
	want := map[string]string{"application_name": "mine", "search_path": "pg_catalog, pg_temp", "datestyle": "ISO",
		"standard_conforming_strings": "on", "statement_timeout": "0", "idle_session_timeout": "0",
		"intervalstyle": "postgres", "extra_float_digits": "3", "client_encoding": "UTF8"}
	for k, v := range want {
		if pc.RuntimeParams[k] != v {
			t.Errorf("%s = %q, want %q (%v)", k, pc.RuntimeParams[k], v, pc.RuntimeParams)
		}
	}
	if pc.RuntimeParams["ExTrA_FlOaT_DiGiTs"] != "" {
		t.Error("a setting given in another letter case was kept beside the pinned one")
	}

	hookErr := errors.New("no token")
	_, err = attempt(context.Background(), base, func(context.Context, *pgconn.Config) error { return hookErr },
		DefaultSettings(), "default", false, slog.New(slog.DiscardHandler))
	if !errors.Is(err, hookErr) {
		t.Errorf("hook error: got %v", err)
	}
}

func TestConnectNotParsed(t *testing.T) {
	_, err := ConnectSQL(context.Background(), SQLConnConfig{Config: &pgconn.Config{}})
	if !errors.Is(err, ErrNotParsed) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got %v, want ErrNotParsed", err)
	}
}

// TestRedact: no password of a connection string that fails to parse reaches the error's message,
// however it is written.
func TestRedact(t *testing.T) {
	for _, tc := range []struct {
		dsn, want string
		secrets   []string
	}{
		{"host=/tmp password = TopSecret8 port=abc", "host=/tmp password = xxxxx port=abc", []string{"TopSecret8"}},
		{`host=/tmp password='Top\'Secret9 x' port=abc`, "host=/tmp password=xxxxx port=abc", []string{"Top", "Secret9"}},
		{"host=/tmp PASSWORD=Secret5a sslpassword='key pass' port=abc", "host=/tmp PASSWORD=xxxxx sslpassword=xxxxx port=abc", []string{"Secret5a", "key pass"}},
		{"host=/tmp password='untermSecret more port=1", "host=/tmp password=xxxxx", []string{"untermSecret", "more"}},
		{"host=/tmp password Secret4b port=1", "host=/tmp password xxxxx", []string{"Secret4b"}},
		{"postgres://u:TopSecret7@h:abc/db", "postgres://u:xxxxx@h:abc/db", []string{"TopSecret7"}},
		{"postgresql://u:Top%2FSec@ret6@h:abc/db?password=Other3c&sslmode=disable",
			"postgresql://u:xxxxx@h:abc/db?password=xxxxx&sslmode=disable", []string{"Top", "Sec", "ret6", "Other3c"}},
		{"postgres://h:abc/db?password=Query2d", "postgres://h:abc/db?password=xxxxx", []string{"Query2d"}},
	} {
		require.Equal(t, tc.want, RedactConnString(tc.dsn), tc.dsn)
		_, err := ParseConnString(tc.dsn)
		require.Error(t, err, tc.dsn)
		for _, s := range tc.secrets {
			require.NotContains(t, err.Error(), s, tc.dsn)
		}
		var pe *pgconn.ParseConfigError
		if errors.As(err, &pe) {
			for _, s := range tc.secrets {
				require.NotContains(t, pe.ConnString, s, tc.dsn)
			}
		}
	}
	_, err := ParseConnString("host=/tmp password=fine")
	require.NoError(t, err)
}
