// Package metrics reports on a running replication stream (a *replication.Stream, or a Source
// that runs one, such as a *changefeed.Feed or an *apply.Applier): how far it
// is behind the server, in bytes and in time; what the consumer has not acknowledged and for
// how long; memory and spill files; transactions and changes received, as counters and as rates;
// reconnections. It gives them as a plain struct (Collector.Reading, with a one-line human
// summary in Reading.String) and as a Prometheus collector (Collector implements
// prometheus.Collector) that the caller registers. It is the only package of the module that
// depends on the Prometheus client library.
//
// # Definitions
//
// Lag in bytes is Position.Received (the highest WAL position the server sent, in XLogData and
// keepalive messages) minus Position.Flushed (the flush position last confirmed to the server in
// a standby status update). It is the WAL the server has sent past what the slot confirms. It
// falls to 0 at the first status update after the consumer has acknowledged everything and the
// server, having nothing more to send, sent a keepalive: at most the stream's StatusInterval
// after it caught up.
//
// Lag in time is 0 while the stream is caught up (replication.Activity: the server's last
// message was a keepalive saying it had sent everything, nothing waits in the buffer, and every
// transaction handed out is acknowledged). Otherwise it is now minus the commit time of the last
// transaction the stream handed out, or, when none was handed out since the stream was last
// caught up (or since it started), now minus that moment: a stream that was idle for an hour and
// starts receiving a transaction is seconds behind, not an hour. Commit times come from the
// server's clock, so a clock difference between the hosts adds to it (it is never negative).
// It grows while the consumer works on a transaction, and while a large transaction is being
// received: both delay what comes after.
//
// The age of the oldest unacknowledged transaction is now minus the moment the stream handed out
// the oldest transaction not acknowledged yet (local, monotonic clock), 0 when every transaction
// handed out is acknowledged. It measures the consumer alone: transactions waiting in the buffer
// count in the lag, not here.
//
// Rates (transactions and changes received per second) are computed from the counters over a
// sliding window of readings: each reading (Collector.Reading, Collect) compares the counters with the
// latest earlier reading at least Options.RateWindow old (10s by default), or the oldest one
// there is. Prometheus users should prefer rate() over the _total counters, which are exact; the
// rate gauges are for dashboards without PromQL and for the summary line.
//
// For an *apply.Applier the consumer is the applier: a transaction is acknowledged once it is
// committed and flushed on the target with its progress row, so the lag in bytes is the source
// WAL received past what the target holds durably, and the lag in time runs from the commit time
// of the last transaction committed on the target (apply.Applier.Activity). Between its
// sessions the Applier reports what its last session's stream reported, and is not caught up.
//
// # Concurrency
//
// Collector reads the stream only through the methods it documents as safe from any goroutine
// (Progress, Stats or BufferStats, Activity, Reconnects): a Prometheus scrape, or a progress printer, may run
// while the consumer is inside Next or reads a transaction. Collector's methods may be called
// from several goroutines at once. Stats walks the buffer's open transactions, so a reading costs
// O(open transactions): read every few seconds, not per transaction.
//
// # Serving
//
// Handler gives an http.Handler for /metrics with the collector and the Go runtime and process
// collectors in a registry of their own; Listen serves it on an address and serves nothing else.
// Applications with a registry of their own register the Collector there instead:
//
//	c, err := metrics.New(stream, metrics.Options{Labels: map[string]string{"slot": "cdc"}})
//	prometheus.MustRegister(c)
package metrics
