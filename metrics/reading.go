package metrics

import (
	"errors"
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// DefaultRateWindow is the shortest span rates are computed over when Options.RateWindow is 0.
const DefaultRateWindow = 10 * time.Second

// ErrNoStream is returned by New for a nil stream.
var ErrNoStream = errors.New("metrics: no stream")

// Options configure a Collector. The zero value works.
type Options struct {
	// RateWindow is the shortest span over which the per-second rates are computed
	// (DefaultRateWindow if 0): a reading compares the counters with the latest earlier reading at
	// least that old, or with the oldest reading if none is.
	RateWindow time.Duration
	// Labels are added to every metric, for instance {"slot": "cdc"} to register the collectors
	// of several streams in one registry.
	Labels map[string]string
}

// Reading is one reading of a stream's metrics.
type Reading struct {
	// Time is when the reading was taken.
	Time time.Time

	// Progress, Activity and Reconnects are what the source's methods of those names returned;
	// Stats is what its BufferStats or Stats method returned (see Source).
	Position   replication.Progress
	Stats      reorderbuffer.Stats
	Activity   replication.Activity
	Reconnects int

	// LagBytes is Position.Received minus Position.Flushed (0 if negative): WAL the server sent
	// past the position confirmed to it.
	LagBytes int64
	// Lag is how far behind the server the consumer is in time: 0 when caught up, otherwise now
	// minus the commit time of the last transaction handed out (see the package documentation).
	Lag time.Duration
	// OldestUnackedAge is how long ago the oldest transaction not acknowledged yet was handed out
	// (0 if none).
	OldestUnackedAge time.Duration
	// TxnsPerSecond and ChangesPerSecond are the rates of Stats.TotalTxns and Stats.TotalChanges
	// over the rate window (0 on the first reading).
	TxnsPerSecond, ChangesPerSecond float64
}

// Source is what a Collector reads: a *replication.Stream; a consumer that runs one, such as a
// *changefeed.Feed (zero values while it has no stream yet); or an *apply.Applier, which reports
// the streams of its sessions and answers between sessions too. Its methods must be safe to call
// from any goroutine at any time, as replication.Stream's are.
//
// The reorder buffer's statistics (Snapshot.Stats) come from the source's BufferStats method if
// it is a BufferSource, or else its Stats method if it is a StatsSource; they are zero otherwise.
type Source interface {
	Progress() replication.Progress
	Activity() replication.Activity
	Reconnects() int
}

// StatsSource is a Source that reports its reorder buffer with Stats, as *replication.Stream and
// *changefeed.Feed do.
type StatsSource interface {
	Source
	Stats() reorderbuffer.Stats
}

// BufferSource is a Source that reports its reorder buffer with BufferStats, as *apply.Applier
// does (its Stats are its own counters).
type BufferSource interface {
	Source
	BufferStats() reorderbuffer.Stats
}

// bufferStats reads s's reorder buffer statistics.
func bufferStats(s Source) reorderbuffer.Stats {
	switch b := s.(type) {
	case BufferSource:
		return b.BufferStats()
	case StatsSource:
		return b.Stats()
	}
	return reorderbuffer.Stats{}
}

// Collector reads a stream's metrics. It implements prometheus.Collector: register it with a
// prometheus.Registerer, or serve it with Handler. Its methods are safe for concurrent use, and
// may run while the stream's consumer is inside Next.
type Collector struct {
	stream Source
	descs  descs
	now    func() time.Time // the clock; time.Now outside tests

	mu    sync.Mutex // guards rates
	rates rates
}

// New returns a Collector for s. It fails for a nil s and for invalid label names.
func New(s Source, opts Options) (*Collector, error) {
	if st, ok := s.(*replication.Stream); s == nil || ok && st == nil {
		return nil, ErrNoStream
	}
	d, err := newDescs(opts.Labels)
	if err != nil {
		return nil, err
	}
	w := opts.RateWindow
	if w <= 0 {
		w = DefaultRateWindow
	}
	c := &Collector{stream: s, descs: d, now: time.Now, rates: rates{window: w}}
	c.Reading() // the first reading: the base of the first rates
	return c, nil
}

// Reading reads the stream's metrics now, and records the reading for the rates.
func (c *Collector) Reading() Reading {
	s := c.stream
	snap := Reading{
		Position:   s.Progress(),
		Stats:      bufferStats(s),
		Activity:   s.Activity(),
		Reconnects: s.Reconnects(),
	}
	c.mu.Lock()
	snap.Time = c.now()
	snap.TxnsPerSecond, snap.ChangesPerSecond = c.rates.observe(sample{
		at: snap.Time, txns: snap.Stats.TotalTxns, changes: snap.Stats.TotalChanges,
	})
	c.mu.Unlock()
	snap.LagBytes = lagBytes(snap.Position)
	snap.Lag = timeLag(snap.Activity, snap.Time)
	snap.OldestUnackedAge = oldestUnackedAge(snap.Activity, snap.Time)
	return snap
}

// lagBytes is the WAL the server sent past the flush position confirmed to it.
func lagBytes(p replication.Progress) int64 {
	if p.Received <= p.Flushed {
		return 0
	}
	return int64(p.Received - p.Flushed)
}

// timeLag is 0 while the stream is caught up; otherwise now minus the commit time of the last
// transaction handed out since the stream stopped being caught up or, if there is none, minus
// the moment it stopped. Never negative.
func timeLag(a replication.Activity, now time.Time) time.Duration {
	if a.CaughtUp {
		return 0
	}
	ref := a.BehindSince
	if !a.LastCommitTime.IsZero() && !a.LastHandedOut.Before(a.BehindSince) {
		ref = a.LastCommitTime
	}
	if ref.IsZero() {
		return 0
	}
	return max(0, now.Sub(ref))
}

// oldestUnackedAge is how long ago the oldest unacknowledged transaction was handed out.
func oldestUnackedAge(a replication.Activity, now time.Time) time.Duration {
	if a.OldestUnackedAt.IsZero() {
		return 0
	}
	return max(0, now.Sub(a.OldestUnackedAt))
}

// sample is one reading of the counters the rates are computed from.
type sample struct {
	at            time.Time
	txns, changes int64
}

// rates computes per-second rates over a sliding window of readings. It keeps the readings of
// the last window, thinned to about eight per window, plus the latest one older than the window.
type rates struct {
	window  time.Duration
	samples []sample // in time order
}

// observe records a reading and returns the rates since the base reading: the latest earlier one
// at least window old, or else the oldest one. Both are 0 when there is no earlier reading, when
// no time passed, and when a counter went down.
func (r *rates) observe(s sample) (txns, changes float64) {
	if n := len(r.samples); n > 0 && s.at.Before(r.samples[n-1].at) {
		r.samples = r.samples[:0] // the clock went back: start again
	}
	r.samples = append(r.samples, s)
	// Thin: of three readings within an eighth of the window, the middle one is not needed.
	if n := len(r.samples); n >= 3 && r.samples[n-1].at.Sub(r.samples[n-3].at) < r.window/8 {
		r.samples[n-2] = r.samples[n-1]
		r.samples = r.samples[:n-1]
	}
	// Drop the readings before the base.
	cut := s.at.Add(-r.window)
	i := 0
	for i+2 < len(r.samples) && !r.samples[i+1].at.After(cut) {
		i++
	}
	if i > 0 {
		n := copy(r.samples, r.samples[i:])
		r.samples = r.samples[:n]
	}
	if len(r.samples) < 2 {
		return 0, 0
	}
	base := r.samples[0]
	dt := s.at.Sub(base.at).Seconds()
	if dt <= 0 {
		return 0, 0
	}
	perSecond := func(now, then int64) float64 {
		if now < then {
			return 0
		}
		return float64(now-then) / dt
	}
	return perSecond(s.txns, base.txns), perSecond(s.changes, base.changes)
}
