package kafkasink_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
)

// positionsOf counts the positions of slot "s" committed to the offsets topic: one per Kafka
// transaction of the stream.
func positionsOf(t *testing.T, ctx context.Context, c *kafkatest.Cluster, prefix string) int {
	t.Helper()
	n := 0
	for _, rec := range readCommitted(t, ctx, c, prefix+".offsets")[prefix+".offsets"] {
		if string(rec.Key) == "s" {
			n++
		}
	}
	return n
}

// TestGrouping: a backlog of one-row source transactions goes into far fewer Kafka transactions,
// each source transaction whole and exactly once; a lone transaction is committed at once, alone,
// with no traffic after it; with Group.MaxTransactions 1 every source transaction is its own
// Kafka transaction.
func TestGrouping(t *testing.T) {
	c := kafkatest.Shared(t)
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, 2*time.Minute)
	dsn := setupTable(t, srv, 0)
	prefix := newPrefix(t)
	kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix}
	fcfg := feedConfig(dsn)
	fcfg.Replication.StatusInterval = 10 * time.Second // no idle advance commits for the lone transaction
	r := start(t, ctx, fcfg, kcfg)
	r.waitPast(t, ctx, 0) // the copy is done

	// A lone transaction: committed within well under a status interval, in a Kafka
	// transaction of its own.
	before := r.sink.Stats().Transactions
	t0 := time.Now()
	lone := commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (0, 'lone')")
	r.waitPast(t, ctx, lone)
	d := time.Since(t0)
	t.Logf("a lone transaction committed to Kafka after %v", d)
	require.Less(t, d, 5*time.Second, "the lone transaction waited for more")
	require.Equal(t, before+1, r.sink.Stats().Transactions)
	require.NoError(t, r.stop())
	base := positionsOf(t, ctx, c, prefix)

	// A backlog: grouped.
	const backlog = 300
	pgtest.ExecAll(t, dsn, `DO $$ BEGIN FOR i IN 1..300 LOOP INSERT INTO t VALUES (i, 'b'); COMMIT; END LOOP; END $$`)
	last := commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (-1, 'last')")
	r = start(t, ctx, fcfg, kcfg)
	r.waitPast(t, ctx, last)
	require.NoError(t, r.stop())
	grouped := positionsOf(t, ctx, c, prefix) - base
	t.Logf("%d source transactions in %d Kafka transactions", backlog+1, grouped)
	require.LessOrEqual(t, grouped, int(r.sink.Stats().Transactions)) // and the Resume unit, without a position
	require.Less(t, grouped, (backlog+1)/5, "the backlog was not grouped")

	// Every source transaction once, whole (one event each here), in commit order.
	recs := readCommitted(t, ctx, c, prefix+".public.t")[prefix+".public.t"]
	m := model{}
	seen := map[string]bool{}
	for _, rec := range recs {
		e := parseEvent(t, rec)
		require.NoError(t, m.apply(e), string(rec.Value))
		require.False(t, seen[e.Transaction.ID], "transaction %s twice", e.Transaction.ID)
		seen[e.Transaction.ID] = true
	}
	require.Len(t, seen, backlog+2)
	require.Equal(t, tableModel(t, ctx, dsn, "t"), m)

	// A commit bound far below any commit's duration (Group.CommitMultiple, with a MinDelay of a
	// nanosecond): one Kafka transaction per source transaction of a backlog too.
	base = positionsOf(t, ctx, c, prefix)
	pgtest.ExecAll(t, dsn, `DO $$ BEGIN FOR i IN 501..520 LOOP INSERT INTO t VALUES (i, 'bound'); COMMIT; END LOOP; END $$`)
	last = commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (-3, 'last')")
	bound := kcfg
	bound.Group = changefeed.Grouping{CommitMultiple: 1e-12, MinDelay: time.Nanosecond}
	r = start(t, ctx, fcfg, bound)
	r.waitPast(t, ctx, last)
	require.NoError(t, r.stop())
	require.GreaterOrEqual(t, positionsOf(t, ctx, c, prefix)-base, 21, "a Kafka transaction held several source transactions")

	// Grouping off: one Kafka transaction per source transaction.
	pgtest.ExecAll(t, dsn, `DO $$ BEGIN FOR i IN 1001..1020 LOOP INSERT INTO t VALUES (i, 'one'); COMMIT; END LOOP; END $$`)
	last = commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (-2, 'last')")
	one := kcfg
	one.Group = changefeed.Grouping{MaxTransactions: 1}
	r = start(t, ctx, fcfg, one)
	r.waitPast(t, ctx, last)
	require.NoError(t, r.stop())
	require.GreaterOrEqual(t, r.sink.Stats().Transactions, int64(21))
}

// TestGroupingDefaults: Config.Group's zero fields take the defaults, the commit bound included;
// negative ones are refused.
func TestGroupingDefaults(t *testing.T) {
	s, err := kafkasink.Open(kafkasink.Config{Brokers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, changefeed.Grouping{MaxTransactions: kafkasink.DefaultGroupTransactions, MaxBytes: kafkasink.DefaultGroupBytes,
		MaxDelay: kafkasink.DefaultGroupDelay, CommitMultiple: kafkasink.DefaultGroupCommitMultiple, MinDelay: kafkasink.DefaultGroupMinDelay},
		s.Grouping())
	for _, g := range []changefeed.Grouping{{CommitMultiple: -1}, {MinDelay: -time.Millisecond}} {
		_, err := kafkasink.Open(kafkasink.Config{Brokers: []string{"127.0.0.1:1"}, Group: g})
		require.ErrorIs(t, err, kafkasink.ErrInvalidConfig, "%+v", g)
	}
}
