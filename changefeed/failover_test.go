package changefeed_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// failoverWorkload runs n transactions on dsn from *next on: inserts, an update and a delete of
// rows inserted before, and every third transaction thousands of rows, streamed.
func failoverWorkload(t *testing.T, dsn string, next *int, n int) {
	t.Helper()
	for i := range n {
		lo := *next
		rows := 5
		if i%3 == 0 {
			rows = 2000
		}
		*next += rows
		pgtest.ExecAll(t, dsn, fmt.Sprintf(`BEGIN; INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(%d, %d) g;
			UPDATE t SET v = 'u', n = NULL WHERE id = %d; DELETE FROM t WHERE id = %d; COMMIT`, lo, *next-1, lo, lo+1))
	}
}

// lastEnd returns the end LSN of the last transaction r recorded.
func lastEnd(t *testing.T, r *recorder) decoding.LSN {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lines[len(r.lines)-1]
	lsn, err := decoding.ParseLSN(l[strings.LastIndex(l, "@")+1:])
	require.NoError(t, err, l)
	return lsn
}

// TestFailover: a feed on a slot created with Replication.Failover, through a connection string
// naming a primary and its standby, continues on the standby once it is promoted and the primary
// stopped; stopped and run again, it resumes on the promoted standby from the FileStore's
// position (the same system, on a later timeline). Every change arrives exactly once: the
// handler's output equals the source table.
func TestFailover(t *testing.T) {
	pgtest.EachPair(t, func(t *testing.T, pair *pgtest.Pair) {
		ctx := pgtest.Context(t, 2*time.Minute)
		primary := pair.Primary.ConnString(pair.DB)
		pgtest.ExecAll(t, primary, `CREATE TABLE t (id int PRIMARY KEY, v text, n int)`, `CREATE PUBLICATION pub FOR TABLE t`)
		cfg := changefeed.Config{Start: changefeed.StartStream, Replication: replication.Config{
			ConnString: pair.ConnString(), Slot: "cf", Publications: []string{"pub"}, CreateSlot: true, Failover: true,
			StatusInterval: 100 * time.Millisecond, Reconnect: replication.ReconnectPolicy{MaxDelay: 500 * time.Millisecond},
		}}
		path := filepath.Join(t.TempDir(), "pos")
		store, err := changefeed.OpenFile(path)
		require.NoError(t, err)
		r := &recorder{txns: make(chan struct{}, 100)}
		stop := runFeed(t, cfg, store, r.handle)
		pair.WaitSynced(t, "cf") // before any transaction is open: see pgtest.Pair.WaitSynced

		// A feed on a slot without failover, stopped before the failover.
		plainCfg := cfg
		plainCfg.Replication.Slot, plainCfg.Replication.Failover = "plain", false
		plainPath := filepath.Join(t.TempDir(), "plain.pos")
		plainStore, err := changefeed.OpenFile(plainPath)
		require.NoError(t, err)
		plainRec := &recorder{txns: make(chan struct{}, 100)}
		stopPlain := runFeed(t, plainCfg, plainStore, plainRec.handle)

		next := 1
		failoverWorkload(t, primary, &next, 6)
		waitTxns(t, r, 6)
		waitTxns(t, plainRec, 6)
		require.NoError(t, stopPlain())
		pair.WaitSynced(t, "cf")
		pair.Failover(t)

		// Its slot is not on the promoted standby: the error says why.
		plainStore, err = changefeed.OpenFile(plainPath)
		require.NoError(t, err)
		err = changefeed.Run(ctx, plainCfg, plainStore, plainRec.handle)
		require.ErrorIs(t, err, replication.ErrSlotNotFound)
		require.Contains(t, err.Error(), "not created for failover (Config.Replication.Failover)")

		promoted := pair.Standby.ConnString(pair.DB)
		failoverWorkload(t, promoted, &next, 4)
		waitTxns(t, r, 4)
		end := lastEnd(t, r)
		pgtest.Eventually(t, time.Minute, "the position of the last transaction to be stored", func() bool {
			s, err := changefeed.OpenFile(path)
			require.NoError(t, err)
			defer s.Close()
			pos, ok, err := s.Load(ctx, "cf")
			require.NoError(t, err)
			return ok && pos.EndLSN >= end
		})
		require.NoError(t, stop())

		// Run again: the stored position was taken on timeline 1, the server is on timeline 2.
		store, err = changefeed.OpenFile(path)
		require.NoError(t, err)
		pos, ok, err := store.Load(ctx, "cf")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, pgtest.QueryText(t, promoted, "SELECT system_identifier::text FROM pg_control_system()"), pos.SystemID)
		require.Equal(t, "00000002", pgtest.QueryText(t, promoted, "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"), "timeline")
		stop = runFeed(t, cfg, store, r.handle)
		failoverWorkload(t, promoted, &next, 2)
		waitTxns(t, r, 2)
		require.NoError(t, stop())

		m := newModel()
		for _, l := range r.lines {
			require.NoError(t, m.apply(l), l)
		}
		require.Empty(t, diff(m.rows["public.t"], tableRows(ctx, t, promoted, "t")))
	})
}
