package changefeed_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/stretchr/testify/require"
)

// TestSynchronousSource: a Feed is the synchronous standby of its source, whose commits wait for
// the Feed's flush report. With status updates an hour apart, each commit must still return as
// soon as the handler and the store are done with it: the Feed reports what it stored as soon as
// the stream holds nothing more, not at its next status update.
func TestSynchronousSource(t *testing.T) {
	for _, major := range testedMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx := pgtest.Context(t, 3*time.Minute)
			srv, db, dsn := ownServer(ctx, t, major)
			pgtest.ExecAll(t, dsn, `CREATE TABLE s (id int PRIMARY KEY)`, `CREATE PUBLICATION pub FOR TABLE s`)
			const name = "syncfeed"
			var handled int
			cfg := changefeed.Config{Start: changefeed.StartStream,
				Replication: replication.Config{ConnString: srv.ReplicationConnString(db) + " application_name=" + name,
					Slot: "sync_feed", Publications: []string{"pub"}, CreateSlot: true, StatusInterval: time.Hour}}
			stop := runFeed(t, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), func(ctx context.Context, b *changefeed.Batch) error {
				if b.Kind == changefeed.Transaction {
					handled++
				}
				return nil
			})
			defer func() { require.NoError(t, stop()) }()
			require.NoError(t, waitFor(ctx, func() bool {
				return pgtest.Count(t, dsn, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'sync_feed' AND active`) > 0
			}), "the Feed streams")
			// A standby that never reported a flush position is no candidate: one transaction
			// handled makes the Feed report one.
			pgtest.ExecAll(t, dsn, `INSERT INTO s VALUES (-1)`)
			waitForStandby(t, srv, name)
			wctx, wcancel := context.WithTimeout(ctx, time.Minute)
			defer wcancel()
			require.NoError(t, waitFor(wctx, func() bool {
				return pgtest.Count(t, dsn, `SELECT count(*) FROM pg_stat_replication WHERE application_name = '`+name+`' AND sync_state = 'sync'`) > 0
			}), "the Feed is the synchronous standby (it reported a flush position)")
			conn, err := pgx.Connect(ctx, dsn)
			require.NoError(t, err)
			defer conn.Close(context.Background())
			// The walsender asks for a reply within wal_sender_timeout/2 (30s by default): a commit
			// that waited for that, or for the status interval, misses this bound by far.
			for i := range 20 {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := conn.Exec(cctx, `INSERT INTO s VALUES ($1)`, i)
				cancel()
				require.NoError(t, err, "commit %d waited for the Feed's status update", i)
			}
		})
	}
}

// ownServer starts a server of major for the test alone (synchronous_standby_names, which the
// synchronous tests set, applies to every commit on a server) and makes a database on it.
func ownServer(ctx context.Context, t *testing.T, major int) (srv *pgtest.Server, db, dsn string) {
	t.Helper()
	srv, err := pgtest.Start(ctx, pgtest.Shared(t, major).Install(), pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	db = pgtest.NewDatabase(t, srv)
	return srv, db, srv.ConnString(db)
}

// waitForStandby makes every commit on srv wait for the standby whose application_name is name
// (synchronous_standby_names), until the test ends.
func waitForStandby(t *testing.T, srv *pgtest.Server, name string) {
	t.Helper()
	pgtest.ExecAll(t, srv.ConnString("postgres"), `ALTER SYSTEM SET synchronous_standby_names = '`+name+`'`, `SELECT pg_reload_conf()`)
	t.Cleanup(func() {
		_ = pgtest.Exec(context.Background(), srv.ConnString("postgres"), `ALTER SYSTEM RESET synchronous_standby_names`, `SELECT pg_reload_conf()`)
	})
}
