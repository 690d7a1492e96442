package metrics

import (
	"fmt"
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
)

// metric is one exported metric: its name, help, type, and how to read it from a Reading. A
// metric with a variable label reads one value per label value.
type metric struct {
	name, help string
	kind       prometheus.ValueType
	label      string   // variable label, or ""
	values     []string // its values, in the order of read's result
	read       func(*Reading) []float64
	desc       *prometheus.Desc
}

func one(f func(*Reading) float64) func(*Reading) []float64 {
	return func(s *Reading) []float64 { return []float64{f(s)} }
}

// catalog lists the metrics, in the order they are collected.
func catalog() []metric {
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	return []metric{
		{name: "pgreorder_lag_bytes", kind: gauge,
			help: "WAL the server sent past the flush position confirmed to it: received minus flushed position. 0 once the consumer has caught up and a status update went out.",
			read: one(func(s *Reading) float64 { return float64(s.LagBytes) })},
		{name: "pgreorder_lag_seconds", kind: gauge,
			help: "How far behind the server the consumer is: now minus the commit time of the last transaction handed out (or the moment the stream stopped being caught up, if later). 0 while caught up.",
			read: one(func(s *Reading) float64 { return s.Lag.Seconds() })},
		{name: "pgreorder_caught_up", kind: gauge,
			help: "1 while the stream is caught up: the server has sent everything, nothing waits to be handed out, and everything handed out is acknowledged.",
			read: one(func(s *Reading) float64 { return b2f(s.Activity.CaughtUp) })},
		{name: "pgreorder_wal_position_bytes", kind: gauge, label: "position",
			values: []string{"received", "flushed", "acknowledged"},
			help:   "WAL positions (LSNs as byte offsets): received from the server, flushed (confirmed to the server), acknowledged (the consumer's acknowledged prefix, the position to resume after).",
			read: func(s *Reading) []float64 {
				p := s.Position
				return []float64{float64(p.Received), float64(p.Flushed), float64(p.Acked)}
			}},
		{name: "pgreorder_unacknowledged_transactions", kind: gauge,
			help: "Transactions handed out to the consumer and not acknowledged yet.",
			read: one(func(s *Reading) float64 { return float64(s.Activity.Unacked) })},
		{name: "pgreorder_oldest_unacknowledged_age_seconds", kind: gauge,
			help: "Time since the oldest transaction not acknowledged yet was handed out to the consumer. 0 if none.",
			read: one(func(s *Reading) float64 { return s.OldestUnackedAge.Seconds() })},
		{name: "pgreorder_queued_transactions", kind: gauge,
			help: "Committed transactions received in full and waiting to be handed out.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.QueuedTxns) })},
		{name: "pgreorder_open_transactions", kind: gauge,
			help: "Transactions being received: not yet committed or aborted (prepared ones included).",
			read: one(func(s *Reading) float64 { return float64(s.Stats.OpenTxns) })},
		{name: "pgreorder_memory_bytes", kind: gauge,
			help: "Bytes of transaction records held in memory now (the amount the work memory limit bounds).",
			read: one(func(s *Reading) float64 { return float64(s.Stats.MemoryBytes) })},
		{name: "pgreorder_memory_peak_bytes", kind: gauge,
			help: "Highest pgreorder_memory_bytes since the stream started.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.PeakMemoryBytes) })},
		{name: "pgreorder_spill_files_bytes", kind: gauge,
			help: "Bytes in spill files on disk now, of transactions being received, queued or handed out.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.SpillBytesNow) })},
		{name: "pgreorder_spilled_bytes_total", kind: counter,
			help: "Bytes written to spill files.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.SpillBytes) })},
		{name: "pgreorder_spilled_transactions_total", kind: counter,
			help: "Transactions spilled to disk at least once.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.SpillTxns) })},
		{name: "pgreorder_spills_total", kind: counter,
			help: "Times a transaction was spilled to disk (one transaction may be spilled many times).",
			read: one(func(s *Reading) float64 { return float64(s.Stats.SpillCount) })},
		{name: "pgreorder_received_transactions_total", kind: counter,
			help: "Committed transactions received in full (and non-transactional messages).",
			read: one(func(s *Reading) float64 { return float64(s.Stats.TotalTxns) })},
		{name: "pgreorder_received_changes_total", kind: counter,
			help: "Changes (and transactional logical messages) of the committed transactions received.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.TotalChanges) })},
		{name: "pgreorder_received_bytes_total", kind: counter,
			help: "pgoutput bytes of the committed transactions received.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.TotalBytes) })},
		{name: "pgreorder_received_transactions_per_second", kind: gauge,
			help: "Rate of pgreorder_received_transactions_total over the collector's rate window (rate() over the counter is exact).",
			read: one(func(s *Reading) float64 { return s.TxnsPerSecond })},
		{name: "pgreorder_received_changes_per_second", kind: gauge,
			help: "Rate of pgreorder_received_changes_total over the collector's rate window (rate() over the counter is exact).",
			read: one(func(s *Reading) float64 { return s.ChangesPerSecond })},
		{name: "pgreorder_acknowledged_transactions_total", kind: counter,
			help: "Transactions handed out and acknowledged by the consumer.",
			read: one(func(s *Reading) float64 { return float64(s.Activity.Acked) })},
		{name: "pgreorder_streamed_transactions_total", kind: counter,
			help: "Transactions the server streamed while in progress (larger than its logical_decoding_work_mem).",
			read: one(func(s *Reading) float64 { return float64(s.Stats.StreamTxns) })},
		{name: "pgreorder_streamed_bytes_total", kind: counter,
			help: "Bytes of messages received inside stream blocks.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.StreamBytes) })},
		{name: "pgreorder_aborted_transactions_total", kind: counter,
			help: "Streamed or prepared transactions received and then aborted (dropped, never handed out).",
			read: one(func(s *Reading) float64 { return float64(s.Stats.AbortedTxns) })},
		{name: "pgreorder_aborted_subtransactions_total", kind: counter,
			help: "Subtransaction aborts that cut a transaction back.",
			read: one(func(s *Reading) float64 { return float64(s.Stats.AbortedSubxacts) })},
		{name: "pgreorder_reconnects_total", kind: counter,
			help: "Times the stream connected again after losing its connection.",
			read: one(func(s *Reading) float64 { return float64(s.Reconnects) })},
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

type descs []metric

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

func newDescs(labels map[string]string) (descs, error) {
	for name := range labels {
		if !labelName.MatchString(name) || len(name) >= 2 && name[:2] == "__" {
			return nil, fmt.Errorf("metrics: invalid label name %q", name)
		}
		if name == "position" {
			return nil, fmt.Errorf("metrics: label name %q is taken by pgreorder_wal_position_bytes", name)
		}
	}
	ms := catalog()
	for i := range ms {
		m := &ms[i]
		var vars []string
		if m.label != "" {
			vars = []string{m.label}
		}
		m.desc = prometheus.NewDesc(m.name, m.help, vars, labels)
	}
	return ms, nil
}

// Describe sends the descriptions of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for i := range c.descs {
		ch <- c.descs[i].desc
	}
}

// Collect takes a Reading and sends its metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.Reading()
	for i := range c.descs {
		m := &c.descs[i]
		for j, v := range m.read(&s) {
			var lv []string
			if m.label != "" {
				lv = []string{m.values[j]}
			}
			pm, err := prometheus.NewConstMetric(m.desc, m.kind, v, lv...)
			if err != nil {
				pm = prometheus.NewInvalidMetric(m.desc, err)
			}
			ch <- pm
		}
	}
}
