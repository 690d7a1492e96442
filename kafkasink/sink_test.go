package kafkasink_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// feedConfig is a changefeed of publication p on slot s, with a small work mem (big transactions
// spill, and stream where the server can).
func feedConfig(dsn string) changefeed.Config {
	return changefeed.Config{Replication: replication.Config{ConnString: dsn, Slot: "s", Publications: []string{"p"}, Messages: true,
		Buffer: reorderbuffer.Config{WorkMem: 64 << 10}}, Logger: testLogger}
}

var testLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))

// running is a changefeed into a Sink, run in the background.
type running struct {
	sink   *kafkasink.Sink
	feed   *changefeed.Feed
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, ctx context.Context, cfg changefeed.Config, kcfg kafkasink.Config) *running {
	t.Helper()
	if kcfg.Logger == nil {
		kcfg.Logger = testLogger
	}
	sink, err := kafkasink.Open(kcfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(ctx)
	feed, err := changefeed.New(cfg, sink, sink.Handle)
	require.NoError(t, err)
	r := &running{sink: sink, feed: feed, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- feed.Run(ctx) }()
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *running) stop() error {
	r.cancel()
	err := <-r.done
	r.done <- err
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// waitPast waits until the sink committed a position beyond lsn, or the run failed.
func (r *running) waitPast(t *testing.T, ctx context.Context, lsn decoding.LSN) {
	t.Helper()
	for r.sink.Stats().Position <= lsn {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("the feed stopped: %+v", err)
		case <-ctx.Done():
			t.Fatalf("the sink did not commit past %s: %v", lsn, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// commitLSN runs statements in one transaction and returns an LSN its commit's end is beyond.
func commitLSN(t *testing.T, ctx context.Context, dsn string, statements ...string) decoding.LSN {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	for _, s := range statements {
		_, err := tx.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	var lsn string
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn))
	require.NoError(t, tx.Commit(ctx))
	l, err := decoding.ParseLSN(lsn)
	require.NoError(t, err)
	return l
}

// TestCopyAndStream: the initial copy, then streamed transactions (a big one that spills and
// streams, with a savepoint rolled back, an aborted one, a truncate, a logical message), reach
// Kafka exactly once: replayed, the events give the source table; each transaction's events
// carry its id, in order; keys are the primary key.
func TestCopyAndStream(t *testing.T) {
	c := kafkatest.Shared(t)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE TABLE u (id int PRIMARY KEY, v text)",
			"CREATE PUBLICATION p FOR TABLE t, u", "INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 100) g")
		prefix := newPrefix(t)
		r := start(t, ctx, feedConfig(dsn), kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix})
		r.waitPast(t, ctx, 0) // the copy is done
		pgtest.ExecAll(t, dsn, "INSERT INTO t VALUES (101, 'a')", "UPDATE t SET v = 'b' WHERE id = 1", "DELETE FROM t WHERE id = 2")
		commitLSN(t, ctx, dsn, "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1000, 5999) g",
			"SAVEPOINT a", "INSERT INTO t SELECT g, 'rolled back' FROM generate_series(6000, 6999) g", "ROLLBACK TO SAVEPOINT a",
			"UPDATE t SET v = 'big' WHERE id BETWEEN 1000 AND 1999")
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO t SELECT g, 'aborted' FROM generate_series(7000, 9999) g")
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		conn.Close(ctx)
		pgtest.ExecAll(t, dsn, "INSERT INTO u VALUES (1, 'u1')", "TRUNCATE u", "INSERT INTO u VALUES (2, 'u2')")
		last := commitLSN(t, ctx, dsn, "SELECT pg_logical_emit_message(true, 'pfx', 'hello')", "INSERT INTO t VALUES (102, 'last')")
		r.waitPast(t, ctx, last)
		require.NoError(t, r.stop())

		st := r.sink.Stats()
		t.Logf("events %d, bytes %d, transactions %d, commit time %v", st.Events, st.Bytes, st.Transactions, st.CommitTime)
		recs := readCommitted(t, ctx, c, prefix+".public.t", prefix+".public.u", prefix+".message", prefix+".offsets")
		m := model{}
		txns := map[string]int{}
		lastOrder := map[string]int64{}
		var order []string
		for _, rec := range recs[prefix+".public.t"] {
			e := parseEvent(t, rec)
			require.NoError(t, m.apply(e), string(rec.Value))
			require.Equal(t, fmt.Sprintf(`{"id":%v}`, map[bool]any{true: e.Before["id"], false: e.After["id"]}[e.Op == "d"]), string(rec.Key))
			if e.Op == "r" {
				require.Nil(t, e.Transaction)
				require.Equal(t, "true", e.Source.Snapshot)
				continue
			}
			id := e.Transaction.ID
			if len(order) == 0 || order[len(order)-1] != id {
				require.NotContains(t, order, id, "transaction %s interleaved", id)
				order = append(order, id)
			}
			txns[id]++
			require.Greater(t, e.Transaction.TotalOrder, lastOrder[id], "event order in transaction %s", id)
			lastOrder[id] = e.Transaction.TotalOrder
		}
		require.Equal(t, tableModel(t, ctx, dsn, "t"), m)
		require.Len(t, order, 5) // insert, update, delete, the big one, the last
		require.Equal(t, 5000+1000, txns[order[3]])

		mu := model{}
		var ops []string
		for _, rec := range recs[prefix+".public.u"] {
			e := parseEvent(t, rec)
			require.NoError(t, mu.apply(e))
			ops = append(ops, e.Op)
			if e.Op == "t" {
				require.Nil(t, rec.Key)
			}
		}
		require.Equal(t, []string{"c", "t", "c"}, ops)
		require.Equal(t, tableModel(t, ctx, dsn, "u"), mu)

		msgs := recs[prefix+".message"]
		require.Len(t, msgs, 1)
		require.Equal(t, `{"prefix":"pfx"}`, string(msgs[0].Key))
		e := parseEvent(t, msgs[0])
		require.Equal(t, "hello", string(e.Message.Content))

		// The positions: keyed by the slot, after the load probes.
		var positions int
		for _, rec := range recs[prefix+".offsets"] {
			if string(rec.Key) == "s" {
				positions++
			}
		}
		require.Equal(t, int(st.Transactions), positions)
		require.True(t, strings.Contains(string(recs[prefix+".offsets"][len(recs[prefix+".offsets"])-1].Value), `"copy_done":true`))

		// A second run resumes after the last position: nothing is sent again.
		r2 := start(t, ctx, feedConfig(dsn), kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix})
		last = commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (103, 'after restart')")
		r2.waitPast(t, ctx, last)
		require.NoError(t, r2.stop())
		recs2 := readCommitted(t, ctx, c, prefix+".public.t")
		require.Len(t, recs2[prefix+".public.t"], len(recs[prefix+".public.t"])+1)
	})
}
