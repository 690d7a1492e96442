package changefeed_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// groupingStore is a TableStore that groups.
type groupingStore struct {
	*changefeed.TableStore
	g changefeed.Grouping
}

func (s groupingStore) Grouping() changefeed.Grouping { return s.g }

// TestGrouping: with a Grouper store, a backlog of transactions is handled in few units (at most
// Grouping.MaxTransactions each), every transaction once, the position the last one's end; a
// lone transaction is committed at once, with no traffic after it.
func TestGrouping(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, time.Minute)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE TABLE out (end_lsn pg_lsn PRIMARY KEY)",
		"CREATE PUBLICATION pub FOR TABLE t")
	cfg := changefeed.Config{Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "cf",
		Publications: []string{"pub"}, StatusInterval: 10 * time.Second}} // no idle advance meanwhile
	const maxTxns = 40
	var (
		mu    sync.Mutex
		units = map[changefeed.Unit]int{} // transactions per unit
	)
	handler := func(ctx context.Context, b *changefeed.Batch) error {
		if b.Kind == changefeed.Snapshot {
			for _, err := range b.Changes() {
				if err != nil {
					return err
				}
			}
		}
		if b.Kind != changefeed.Transaction {
			return nil
		}
		mu.Lock()
		units[b.Unit]++
		mu.Unlock()
		_, err := changefeed.Tx(b).Exec(ctx, "INSERT INTO out VALUES ($1)", b.Txn.EndLSN.String())
		return err
	}
	var done chan error
	run := func() (*changefeed.Feed, func()) {
		t.Helper()
		ts, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn})
		require.NoError(t, err)
		f, err := changefeed.New(cfg, groupingStore{ts, changefeed.Grouping{MaxTransactions: maxTxns}}, handler)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done = make(chan error, 1)
		go func() { done <- f.Run(rctx) }()
		return f, func() {
			cancel()
			err := <-done
			done <- err
			if !errors.Is(err, context.Canceled) {
				require.NoError(t, err)
			}
		}
	}
	// insert commits a row and returns an LSN its transaction's end is beyond.
	insert := func(id int) decoding.LSN {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var s string
		require.NoError(t, conn.QueryRow(ctx, "WITH i AS (INSERT INTO t VALUES ($1) RETURNING 1) SELECT pg_current_wal_insert_lsn()::text FROM i", id).Scan(&s))
		l, err := decoding.ParseLSN(s)
		require.NoError(t, err)
		return l
	}
	waitAcked := func(f *changefeed.Feed, lsn decoding.LSN, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for f.Position().Acked <= lsn {
			require.True(t, time.Now().Before(deadline), "not acknowledged past %s within %v", lsn, within)
			select {
			case err := <-done:
				t.Fatalf("the feed stopped: %v", err)
			default:
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	f, stop := run()
	for deadline := time.Now().Add(30 * time.Second); f.Position().Start == 0; { // the copy is done, the stream started
		require.True(t, time.Now().Before(deadline), "the stream did not start")
		select {
		case err := <-done:
			t.Fatalf("the feed stopped: %v", err)
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A lone transaction: committed, alone, well within the status interval.
	lone := insert(0)
	waitAcked(f, lone, 5*time.Second)
	stop()
	mu.Lock()
	require.Len(t, units, 1)
	clear(units)
	mu.Unlock()

	// A backlog, grouped.
	const backlog = 200
	pgtest.ExecAll(t, dsn, `DO $$ BEGIN FOR i IN 1..200 LOOP INSERT INTO t VALUES (i); COMMIT; END LOOP; END $$`)
	last := insert(-1)
	f, stop = run()
	waitAcked(f, last, 30*time.Second)
	stop()
	total := 0
	for _, n := range units {
		require.LessOrEqual(t, n, maxTxns)
		total += n
	}
	t.Logf("%d transactions in %d units", total, len(units))
	require.Equal(t, backlog+1, total)
	require.Less(t, len(units), total/2, "the backlog was not grouped")
	require.GreaterOrEqual(t, len(units), (backlog+1+maxTxns-1)/maxTxns)

	// Every transaction's write is there once (the key), and the stored position is the last's.
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var rows int
	var maxEnd, stored string
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*), max(end_lsn)::text FROM out").Scan(&rows, &maxEnd))
	require.NoError(t, conn.QueryRow(ctx, "SELECT end_lsn::text FROM "+changefeed.DefaultTable+" WHERE slot = 'cf'").Scan(&stored))
	require.Equal(t, backlog+2, rows)
	require.Equal(t, maxEnd, stored)
}
