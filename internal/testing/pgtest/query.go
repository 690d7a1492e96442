package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// PollInterval is how often Until and Eventually look at their condition again.
const PollInterval = 10 * time.Millisecond

// Until calls cond at once and then every PollInterval until it returns true, and returns true;
// it returns false when ctx ends first. cond runs on the calling goroutine, so it may fail the
// test itself; Until touches no testing.TB, so that a goroutine other than the test's may call it.
func Until(ctx context.Context, cond func() bool) bool {
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// Eventually waits as Until for at most within, and fails t, naming what it waited for, when
// cond did not hold by then.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if !Until(ctx, cond) {
		require.FailNowf(t, "condition not met", "waited %v for %s", within, what)
	}
}

// QueryOne runs sql with args on a new connection to connString, within a minute, and returns
// the one value of its only row scanned into a T. An error, or no row, fails t.
func QueryOne[T any](t testing.TB, connString, sql string, args ...any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var v T
	require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(&v), "in %q", sql)
	return v
}

// Count returns the number a query such as SELECT count(*) ... yields (see QueryOne).
func Count(t testing.TB, connString, sql string, args ...any) int64 {
	t.Helper()
	return QueryOne[int64](t, connString, sql, args...)
}

// QueryText runs sql (one or more statements, simple protocol) on a new connection to
// connString, within a minute, and returns the first column of the last statement's first row
// as text: "" when it has no row or the value is NULL. An error fails t.
func QueryText(t testing.TB, connString, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, connString)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	res, err := conn.Exec(ctx, sql).ReadAll()
	require.NoError(t, err, "in %q", sql)
	if len(res) == 0 || len(res[len(res)-1].Rows) == 0 {
		return ""
	}
	return string(res[len(res)-1].Rows[0][0])
}

// ClockPast returns once the clock_timestamp() of the server of connString has moved past the
// value it had when ClockPast was called. A transaction committed before the call and one
// committed after it, on that server or on another of this machine (they read the same clock),
// then have commit timestamps in that order, never equal.
func ClockPast(t testing.TB, connString string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var then time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&then))
	Eventually(t, time.Minute, "the server's clock to move", func() bool {
		var past bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT clock_timestamp() > $1`, then).Scan(&past))
		return past
	})
}
