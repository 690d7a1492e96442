package changefeed_test

import (
	"context"
	"errors"
	"fmt"
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
		pgtest.Eventually(t, within, fmt.Sprintf("an acknowledgement past %s", lsn), func() bool {
			select {
			case err := <-done:
				t.Fatalf("the feed stopped: %v", err)
			default:
			}
			return f.Progress().Acked > lsn
		})
	}

	f, stop := run()
	pgtest.Eventually(t, 30*time.Second, "the copy to be done and the stream to start", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the feed stopped: %v", err)
		default:
		}
		return f.Progress().Start != 0
	})
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

// boundStore is a TableStore that groups, and tells each position its units commit.
type boundStore struct {
	*changefeed.TableStore
	g         changefeed.Grouping
	committed chan decoding.LSN
}

func (s boundStore) Grouping() changefeed.Grouping { return s.g }

func (s boundStore) Begin(ctx context.Context, worker int) (changefeed.Unit, error) {
	u, err := s.TableStore.Begin(ctx, worker)
	if err != nil {
		return nil, err
	}
	return boundUnit{u, s.committed}, nil
}

type boundUnit struct {
	changefeed.Unit
	committed chan decoding.LSN
}

func (u boundUnit) Commit(ctx context.Context, pos *changefeed.Position) error {
	if err := u.Unit.Commit(ctx, pos); err != nil {
		return err
	}
	if pos != nil && pos.CopyDone {
		select {
		case u.committed <- pos.EndLSN:
		case <-ctx.Done():
		}
	}
	return nil
}

// TestGroupingCommitBound: Grouping.CommitMultiple bounds how long a unit stays open to that
// multiple of how long a commit takes (from the first commit on; MinDelay before), never below
// MinDelay nor above MaxDelay. A backlog that MaxDelay alone lets group (an hour) is one
// transaction a unit with a multiple far below any commit's duration, or with a MaxDelay below
// the multiple's bound; it is grouped with a MinDelay above the multiple's bound, and, after the
// first unit, with a multiple far above any commit's duration.
func TestGroupingCommitBound(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, 2*time.Minute)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE t")
	cfg := changefeed.Config{Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "cf",
		Publications: []string{"pub"}, StatusInterval: 10 * time.Second}} // no idle advance meanwhile
	var (
		mu    sync.Mutex
		units []changefeed.Unit // in the order their first transaction was handled
		sizes = map[changefeed.Unit]int{}
	)
	handler := func(ctx context.Context, b *changefeed.Batch) error {
		for _, err := range b.Changes() {
			if err != nil {
				return err
			}
		}
		if b.Kind != changefeed.Transaction {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if sizes[b.Unit] == 0 {
			units = append(units, b.Unit)
		}
		sizes[b.Unit]++
		return nil
	}
	// run runs a feed grouping with g until it committed a position past lsn, and returns the
	// number of transactions of each of its units, in order.
	run := func(g changefeed.Grouping, past decoding.LSN) []int {
		t.Helper()
		ts, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn})
		require.NoError(t, err)
		store := boundStore{ts, g, make(chan decoding.LSN)}
		f, err := changefeed.New(cfg, store, handler)
		require.NoError(t, err)
		mu.Lock()
		units, sizes = nil, map[changefeed.Unit]int{}
		mu.Unlock()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Run(rctx) }()
		for stored := decoding.LSN(0); stored <= past; {
			select {
			case stored = <-store.committed:
			case err := <-done:
				t.Fatalf("the feed stopped: %v", err)
			}
		}
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		mu.Lock()
		defer mu.Unlock()
		var n []int
		for _, u := range units {
			n = append(n, sizes[u])
		}
		return n
	}
	// backlog commits n one-row transactions after the last ones, and returns an LSN the last
	// one's end is beyond (read in it).
	next := 0
	backlog := func(n int) decoding.LSN {
		t.Helper()
		pgtest.ExecAll(t, dsn, fmt.Sprintf(`DO $$ BEGIN FOR i IN %d..%d LOOP INSERT INTO t VALUES (i); COMMIT; END LOOP; END $$`, next+1, next+n-1))
		next += n
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var s string
		require.NoError(t, conn.QueryRow(ctx, "WITH i AS (INSERT INTO t VALUES ($1) RETURNING 1) SELECT pg_current_wal_insert_lsn()::text FROM i", next).Scan(&s))
		l, err := decoding.ParseLSN(s)
		require.NoError(t, err)
		return l
	}
	// The copy (of nothing), which makes the slot.
	run(changefeed.Grouping{}, 0)

	const n = 60
	hour := time.Hour
	for _, c := range []struct {
		name    string
		g       changefeed.Grouping
		grouped bool
	}{
		{"multiple far below a commit", changefeed.Grouping{MaxTransactions: 1000, MaxDelay: hour, CommitMultiple: 1e-12}, false},
		{"MaxDelay below the multiple's bound", changefeed.Grouping{MaxTransactions: 1000, MaxDelay: time.Nanosecond, CommitMultiple: 1e12}, false},
		{"MinDelay above the multiple's bound", changefeed.Grouping{MaxTransactions: 1000, MaxDelay: hour, CommitMultiple: 1e-12, MinDelay: hour}, true},
		{"multiple far above a commit", changefeed.Grouping{MaxTransactions: 1000, MaxDelay: hour, CommitMultiple: 1e12}, true},
	} {
		sizes := run(c.g, backlog(n))
		t.Logf("%s: %d transactions in %d units: %v", c.name, n, len(sizes), sizes)
		total := 0
		for _, s := range sizes {
			total += s
		}
		require.Equal(t, n, total, c.name)
		if !c.grouped {
			require.Len(t, sizes, n, "%s: a unit held more than one transaction", c.name)
			continue
		}
		require.Less(t, len(sizes), n/2, "%s: the backlog was not grouped", c.name)
		if c.g.MinDelay == 0 {
			// No commit measured yet: the first unit is bounded by MinDelay alone.
			require.Equal(t, 1, sizes[0], c.name)
		}
	}
}
