package metrics_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/scrape"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/replication"
)

// An Applier is a source of metrics, with its reorder buffer's statistics.
var _ metrics.BufferSource = (*apply.Applier)(nil)

// TestApplierMetrics serves the metrics of an apply.Applier over HTTP and checks the lag: 0 once
// caught up; in bytes and in seconds, the seconds growing, while a lock on the target holds the
// applier back from a transaction it received; 0 again once it applied it; growing while the
// applier is stopped (between sessions), with the positions and counters of the last session;
// and 0 again, with a reconnection counted and no counter gone back, once it runs again.
func TestApplierMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	for _, major := range majors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// The target is on the other server when there are two: one server would decode the
			// applier's own progress row writes, and send them as new WAL, without end.
			srv, dsrv := pgtest.Shared(t, major), pgtest.Shared(t, major)
			for _, m := range majors(t) {
				if m != major {
					dsrv = pgtest.Shared(t, m)
				}
			}
			srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, dsrv)
			src, dst := srv.ConnString(srcDB), dsrv.ConnString(dstDB)
			const table = `CREATE TABLE a (id int PRIMARY KEY, v text)`
			require.NoError(t, pgtest.Exec(ctx, src, table, `CREATE PUBLICATION p FOR TABLE a`,
				`SELECT pg_create_logical_replication_slot('am', 'pgoutput')`))
			require.NoError(t, pgtest.Exec(ctx, dst, table))
			a, err := apply.New(apply.Config{
				Source: replication.Config{ConnString: srv.ReplicationConnString(srcDB), Slot: "am", Publications: []string{"p"}, StatusInterval: 50 * time.Millisecond},
				Target: dst,
				Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
			})
			require.NoError(t, err)
			ms, err := metrics.Serve("127.0.0.1:0", a, metrics.Options{Labels: map[string]string{"slot": "am"}})
			require.NoError(t, err)
			defer ms.Close(ctx)
			url := "http://" + ms.Addr() + "/metrics"
			const (
				lagBytes = `pgreorder_lag_bytes{slot="am"}`
				lagSecs  = `pgreorder_lag_seconds{slot="am"}`
				caughtUp = `pgreorder_caught_up{slot="am"}`
				acked    = `pgreorder_acknowledged_transactions_total{slot="am"}`
				received = `pgreorder_wal_position_bytes{position="received",slot="am"}`
				flushed  = `pgreorder_wal_position_bytes{position="flushed",slot="am"}`
				reconn   = `pgreorder_reconnects_total{slot="am"}`
				txns     = `pgreorder_received_transactions_total{slot="am"}`
			)
			// Before Run, it answers: nothing yet.
			v := scrape.Get(ctx, t, url)
			require.Zero(t, v[lagBytes])
			require.Zero(t, v[lagSecs])

			run := func() (stop func()) {
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- a.Run(rctx) }()
				return func() {
					cancel()
					require.ErrorIs(t, <-done, context.Canceled)
				}
			}
			// wait scrapes until cond holds.
			wait := func(what string, cond func(map[string]float64) bool) map[string]float64 {
				t.Helper()
				var v map[string]float64
				met := pgtest.Until(ctx, func() bool { v = scrape.Get(ctx, t, url); return cond(v) })
				require.True(t, met, "waiting for %s; last scrape: %v; stats: %+v", what, v, a.Stats())
				return v
			}
			isCaughtUp := func(v map[string]float64) bool {
				return v[caughtUp] == 1 && v[lagBytes] == 0 && v[lagSecs] == 0
			}
			stop := run()
			wait("caught up at the start", isCaughtUp)

			// A lock on the target holds the applier back from the transaction it receives.
			lock := pgtest.Connect(t, dst)
			defer lock.Close(context.Background())
			pgtest.MustExec(t, lock, `BEGIN; LOCK TABLE a IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, pgtest.Exec(ctx, src, `INSERT INTO a SELECT g, 'x' FROM generate_series(1, 100) g`))
			v = wait("behind, in bytes and in time", func(v map[string]float64) bool {
				return v[caughtUp] == 0 && v[lagBytes] > 0 && v[lagSecs] > 0 && v[txns] >= 1
			})
			require.Equal(t, v[received]-v[flushed], v[lagBytes])
			first := v[lagSecs]
			wait("the lag in time growing while held back", func(v map[string]float64) bool { return v[lagSecs] > first })
			require.Zero(t, a.Stats().Txns, "nothing applied while the lock holds")
			pgtest.MustExec(t, lock, `COMMIT`)
			v = wait("caught up once applied", func(v map[string]float64) bool { return isCaughtUp(v) && v[acked] >= 1 })
			require.Equal(t, v[received], v[flushed])
			require.Equal(t, int64(1), a.Stats().Txns)

			// Between sessions: the last session's positions and counters, and a lag in time that
			// grows from the moment it ended.
			stop()
			before := v
			v = wait("behind while stopped", func(v map[string]float64) bool { return v[caughtUp] == 0 && v[lagSecs] > 0 })
			for _, name := range []string{received, flushed, acked, txns} {
				require.GreaterOrEqual(t, v[name], before[name], name)
			}
			require.Equal(t, v[received]-v[flushed], v[lagBytes])
			first, stopped := v[lagSecs], v
			v = wait("the lag in time growing while stopped", func(v map[string]float64) bool { return v[lagSecs] > first })
			for _, name := range []string{received, flushed, acked, txns, lagBytes} {
				require.Equal(t, stopped[name], v[name], "%s: what the last session reported", name)
			}

			// Running again, with a transaction committed meanwhile.
			require.NoError(t, pgtest.Exec(ctx, src, `INSERT INTO a VALUES (0, 'while stopped')`))
			stop = run()
			defer stop()
			v = wait("caught up again", func(v map[string]float64) bool { return isCaughtUp(v) && a.Stats().Txns == 2 })
			require.Equal(t, float64(1), v[reconn], "the second session counts as a reconnection")
			require.GreaterOrEqual(t, v[acked], before[acked]+1)
			require.GreaterOrEqual(t, v[flushed], before[flushed])
			require.GreaterOrEqual(t, v[txns], before[txns]+1)
		})
	}
}
