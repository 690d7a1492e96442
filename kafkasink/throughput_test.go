package kafkasink_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
)

// TestThroughput measures, when PGREORDER_KAFKA_THROUGHPUT=1, how fast a backlog reaches Kafka:
// many small transactions, and one big one.
func TestThroughput(t *testing.T) {
	if os.Getenv("PGREORDER_KAFKA_THROUGHPUT") != "1" {
		t.Skip("set PGREORDER_KAFKA_THROUGHPUT=1 to measure")
	}
	c := kafkatest.Shared(t)
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, 5*time.Minute)
	dsn := setupTable(t, srv, 0)
	prefix := newPrefix(t)
	kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix, Partitions: 3}
	r := start(t, ctx, feedConfig(dsn), kcfg)
	r.waitPast(t, ctx, 0)
	require.NoError(t, r.stop())
	const small = 2000
	pgtest.ExecAll(t, dsn, `DO $$ BEGIN FOR i IN 1..2000 LOOP INSERT INTO t VALUES (i, md5(i::text)); COMMIT; END LOOP; END $$`)
	last := commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (-1, 'last')")
	t0 := time.Now()
	r = start(t, ctx, feedConfig(dsn), kcfg)
	r.waitPast(t, ctx, last)
	d := time.Since(t0)
	t.Logf("%d one-row transactions: %v, %.0f transactions/s", small, d, small/d.Seconds())
	require.NoError(t, r.stop())
	last = commitLSN(t, ctx, dsn, "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(10000, 209999) g")
	t0 = time.Now()
	r = start(t, ctx, feedConfig(dsn), kcfg)
	r.waitPast(t, ctx, last)
	d = time.Since(t0)
	t.Logf("one transaction of 200000 rows: %v, %.0f events/s", d, 200000/d.Seconds())
	require.NoError(t, r.stop())
}
