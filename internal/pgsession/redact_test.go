package pgsession

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

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
		{"host=/tmp statement_cache_capacity=x password=PgxOnly1", "host=/tmp statement_cache_capacity=x password=xxxxx", []string{"PgxOnly1"}},
	} {
		require.Equal(t, tc.want, RedactConnString(tc.dsn), tc.dsn)
		_, err := ParseConnString(tc.dsn)
		_, pgxErr := ParsePgxConnString(tc.dsn)
		require.Error(t, pgxErr, tc.dsn)
		for _, err := range []error{err, pgxErr} {
			if err == nil { // statement_cache_capacity is pgx's alone
				continue
			}
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
	}
	_, err := ParseConnString("host=/tmp password=fine")
	require.NoError(t, err)
	_, err = ParsePgxConnString("host=/tmp password=fine")
	require.NoError(t, err)
	require.NoError(t, RedactConnError(nil, "password=x"))
}

// TestRedactConnError: the message loses every password of the connection string, quoted in
// any form, and still unwraps to the error.
func TestRedactConnError(t *testing.T) {
	const dsn = `host=db password='it\'s Secret1' sslpassword=Key2`
	cause := errors.New("cause")
	err := RedactConnError(errorsJoin(cause, dsn, "it's Secret1", "Key2"), dsn)
	require.ErrorIs(t, err, cause)
	for _, s := range []string{"Secret1", "Key2"} {
		require.NotContains(t, err.Error(), s)
	}
	require.Contains(t, err.Error(), "host=db password=xxxxx sslpassword=xxxxx")
}

func errorsJoin(cause error, parts ...string) error {
	return &wrapped{msg: strings.Join(parts, " | ") + ": " + cause.Error(), err: cause}
}

type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// TestTidyConnectError: pgconn's report of both attempts (with TLS, then without) comes on one
// line; another error's message is left as it is.
func TestTidyConnectError(t *testing.T) {
	require.Equal(t, "x", TidyConnectError("x", errors.New("x")))
	pc, err := pgconn.ParseConfig("host=127.0.0.1 port=1 user=u dbname=d sslmode=prefer connect_timeout=5")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pgconn.ConnectConfig(ctx, pc)
	var ce *pgconn.ConnectError
	require.ErrorAs(t, err, &ce)
	msg := TidyConnectError("connect: "+err.Error(), err)
	require.NotContains(t, msg, "\n")
	require.True(t, strings.HasPrefix(msg, "connect: failed to connect to `user=u database=d`: "), msg)
}
