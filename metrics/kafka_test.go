package metrics_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// TestKafkaCollector: the Kafka counters are exported as given, the commits as a summary, and the
// lag is what a real stream received past the committed position: positive while a
// transaction is received and not committed, 0 once its end is.
func TestKafkaCollector(t *testing.T) {
	major := majors(t)[len(majors(t))-1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	require.NoError(t, pgtest.Exec(ctx, dsn, `CREATE TABLE k (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE k`))
	s, err := replication.Start(ctx, replication.Config{
		ConnString: srv.ReplicationConnString(db), Slot: "k", Publications: []string{"p"}, CreateSlot: true,
		StatusInterval: 50 * time.Millisecond, Buffer: reorderbuffer.Config{Dir: t.TempDir()},
	})
	require.NoError(t, err)
	defer s.Close(ctx)

	// The test is the sink: it "commits" what it consumed by setting the counters.
	var mu sync.Mutex
	var st metrics.KafkaStats
	sink := metrics.KafkaFunc(func() metrics.KafkaStats { mu.Lock(); defer mu.Unlock(); return st })
	_, err = metrics.NewKafkaCollector(nil, s, metrics.Options{})
	require.ErrorIs(t, err, metrics.ErrNoSink)
	_, err = metrics.NewKafkaCollector(sink, s, metrics.Options{Labels: map[string]string{"bad-name": "x"}})
	require.Error(t, err)
	c, err := metrics.NewKafkaCollector(sink, s, metrics.Options{Labels: map[string]string{"slot": "k"}})
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
	require.Equal(t, 5, testutil.CollectAndCount(c))
	require.Zero(t, c.Lag(), "nothing received yet")

	require.NoError(t, pgtest.Exec(ctx, dsn, `INSERT INTO k SELECT generate_series(1, 100)`))
	x, err := s.Next(ctx)
	require.NoError(t, err)
	require.Positive(t, c.Lag(), "received, not committed")
	require.EqualValues(t, s.Progress().Received, c.Lag(), "nothing committed yet: all of it")

	mu.Lock()
	st = metrics.KafkaStats{Events: 100, Bytes: 4200, Transactions: 2, CommitTime: 30 * time.Millisecond, Committed: uint64(x.EndLSN)}
	mu.Unlock()
	require.NoError(t, s.Ack(x))
	v := kafkaValues(t, c)
	require.Equal(t, 100.0, v["pgreorder_kafka_produced_events_total"])
	require.Equal(t, 4200.0, v["pgreorder_kafka_produced_bytes_total"])
	require.Equal(t, 2.0, v["pgreorder_kafka_commit_seconds_count"])
	require.InDelta(t, 0.03, v["pgreorder_kafka_commit_seconds_sum"], 1e-9)
	require.Equal(t, float64(x.EndLSN), v["pgreorder_kafka_committed_position_bytes"])
	require.Equal(t, float64(c.Lag()), v["pgreorder_kafka_lag_bytes"])
	require.Equal(t, "k", labelOf(t, c, "slot"))
	// Caught up (keepalives carry Received past the commit's end): 0.
	idle(ctx, t, s, "caught up", func() bool { return s.Activity().CaughtUp })
	require.Zero(t, c.Lag(), "caught up")
	require.Zero(t, kafkaValues(t, c)["pgreorder_kafka_lag_bytes"])
}

// kafkaValues gathers c and returns its values by name, a summary as NAME_count and NAME_sum.
func kafkaValues(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				out[mf.GetName()] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[mf.GetName()] = m.GetGauge().GetValue()
			case m.Summary != nil:
				out[mf.GetName()+"_count"] = float64(m.GetSummary().GetSampleCount())
				out[mf.GetName()+"_sum"] = m.GetSummary().GetSampleSum()
			}
		}
	}
	return out
}

// labelOf returns the value of label name on c's first metric.
func labelOf(t *testing.T, c prometheus.Collector, name string) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, l := range mfs[0].GetMetric()[0].GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
