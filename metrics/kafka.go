package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// KafkaStats are the counters of a sink that writes a stream into Kafka transactions, as
// kafkasink.Sink.Stats gives them (a program converts one to the other: this package does not
// depend on Kafka's client).
type KafkaStats struct {
	// Events and Bytes count the records produced (keys and values), committed or not.
	Events, Bytes int64
	// Transactions counts the Kafka transactions committed, CommitTime the time spent
	// committing them (flushing and ending each), in all.
	Transactions int64
	CommitTime   time.Duration
	// Committed is the source position (an LSN as a byte offset) the last committed Kafka
	// transaction holds: what a restart resumes after.
	Committed uint64
}

// KafkaSource gives a Kafka sink's counters. KafkaStats must be safe to call from any goroutine
// at any time.
type KafkaSource interface {
	KafkaStats() KafkaStats
}

// KafkaFunc adapts a function to a KafkaSource.
type KafkaFunc func() KafkaStats

// KafkaStats calls f.
func (f KafkaFunc) KafkaStats() KafkaStats { return f() }

// ErrNoSink is returned by NewKafkaCollector for a nil sink.
var ErrNoSink = errors.New("metrics: no Kafka sink")

// KafkaCollector exports a Kafka sink's counters, and how far its committed position is behind
// what the stream received, as Prometheus metrics:
//
//	pgreorder_kafka_produced_events_total   counter  records produced (committed or not)
//	pgreorder_kafka_produced_bytes_total    counter  their key and value bytes
//	pgreorder_kafka_commit_seconds          summary  Kafka transaction commits: _count, _sum
//	pgreorder_kafka_committed_position_bytes gauge   the source LSN the last commit holds
//	pgreorder_kafka_lag_bytes               gauge    WAL received from the source past it
//
// The lag is 0 while the stream is caught up (replication.Activity.CaughtUp: everything
// received was handed out and acknowledged, so committed in Kafka), although the server's
// keepalives carry the received position past the last committed transaction's end;
// otherwise it is the stream's received position minus the committed one.
// Register it beside the stream's Collector, or pass it to Handler.
type KafkaCollector struct {
	sink   KafkaSource
	stream Source // may be nil: no lag

	events, bytes, commit, committed, lag *prometheus.Desc
}

// NewKafkaCollector returns a collector of sink's counters; stream, when not nil, is the stream
// the sink writes (for the lag), such as the *changefeed.Feed it is the store of. opts.Labels
// are added to every metric (RateWindow is unused).
func NewKafkaCollector(sink KafkaSource, stream Source, opts Options) (*KafkaCollector, error) {
	if sink == nil {
		return nil, ErrNoSink
	}
	if _, err := newDescs(opts.Labels); err != nil {
		return nil, err
	}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, opts.Labels) }
	return &KafkaCollector{sink: sink, stream: stream,
		events:    d("pgreorder_kafka_produced_events_total", "Records produced into Kafka, committed or not (tombstones included, source positions not)."),
		bytes:     d("pgreorder_kafka_produced_bytes_total", "Key and value bytes of the records produced into Kafka."),
		commit:    d("pgreorder_kafka_commit_seconds", "Kafka transaction commits (flushing the transaction's records, then ending it): how many, and the time they took."),
		committed: d("pgreorder_kafka_committed_position_bytes", "Source position (LSN as a byte offset) the last committed Kafka transaction holds: a restart resumes after it."),
		lag:       d("pgreorder_kafka_lag_bytes", "WAL the stream received from the source past the position committed in Kafka (0 if none received yet)."),
	}, nil
}

// Describe sends the metrics' descriptions.
func (c *KafkaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.events, c.bytes, c.commit, c.committed, c.lag} {
		ch <- d
	}
}

// Collect reads the sink (and the stream's position) and sends the metrics.
func (c *KafkaCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.sink.KafkaStats()
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(st.Events))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstSummary(c.commit, uint64(st.Transactions), st.CommitTime.Seconds(), nil)
	ch <- prometheus.MustNewConstMetric(c.committed, prometheus.GaugeValue, float64(st.Committed))
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(c.lagBytes(st)))
}

// Lag returns the WAL the stream received past the sink's committed position (0 without a
// stream, while it is caught up, or before anything was received).
func (c *KafkaCollector) Lag() int64 { return c.lagBytes(c.sink.KafkaStats()) }

func (c *KafkaCollector) lagBytes(st KafkaStats) int64 {
	if c.stream == nil || c.stream.Activity().CaughtUp {
		return 0
	}
	recv := uint64(c.stream.Progress().Received)
	if recv <= st.Committed {
		return 0
	}
	return int64(recv - st.Committed)
}
