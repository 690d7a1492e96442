package metrics

import (
	"math"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/replication"
)

// clock is a fake clock for the computations.
type clock struct{ t time.Time }

func (c *clock) now() time.Time                { return c.t }
func (c *clock) advance(d time.Duration)       { c.t = c.t.Add(d) }
func newClock() *clock                         { return &clock{t: time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)} }
func near(got, want float64) bool              { return math.Abs(got-want) <= 1e-9*math.Max(1, math.Abs(want)) }
func (c *clock) ago(d time.Duration) time.Time { return c.t.Add(-d) }

func TestRates(t *testing.T) {
	t.Run("steady", func(t *testing.T) {
		c := newClock()
		r := rates{window: 10 * time.Second}
		if tx, ch := r.observe(sample{at: c.now()}); tx != 0 || ch != 0 {
			t.Fatalf("first reading: %v, %v; want 0", tx, ch)
		}
		var n int64
		for i := range 60 {
			c.advance(time.Second)
			n += 100
			tx, ch := r.observe(sample{at: c.now(), txns: n, changes: 7 * n})
			if !near(tx, 100) || !near(ch, 700) {
				t.Fatalf("second %d: %v txn/s, %v changes/s; want 100, 700", i+1, tx, ch)
			}
		}
		if len(r.samples) > 20 {
			t.Fatalf("%d readings kept for a 10s window read every second", len(r.samples))
		}
	})
	t.Run("window", func(t *testing.T) {
		// 1000 transactions in one second, then nothing: the rate is spread over the window,
		// and 0 once the burst is older than it.
		c := newClock()
		r := rates{window: 10 * time.Second}
		r.observe(sample{at: c.now()})
		c.advance(time.Second)
		if tx, _ := r.observe(sample{at: c.now(), txns: 1000}); !near(tx, 1000) {
			t.Fatalf("during the burst: %v", tx)
		}
		for i := 2; i <= 10; i++ {
			c.advance(time.Second)
			if tx, _ := r.observe(sample{at: c.now(), txns: 1000}); !near(tx, 1000/float64(i)) {
				t.Fatalf("%ds after the start: %v; want %v", i, tx, 1000/float64(i))
			}
		}
		for range 2 {
			c.advance(time.Second)
			r.observe(sample{at: c.now(), txns: 1000})
		}
		if tx, _ := r.observe(sample{at: c.now(), txns: 1000}); tx != 0 {
			t.Fatalf("a window after the burst: %v; want 0", tx)
		}
	})
	t.Run("sparse", func(t *testing.T) {
		// Readings a minute apart: the rate is over the minute.
		c := newClock()
		r := rates{window: 10 * time.Second}
		r.observe(sample{at: c.now()})
		c.advance(time.Minute)
		if tx, ch := r.observe(sample{at: c.now(), txns: 600, changes: 60}); !near(tx, 10) || !near(ch, 1) {
			t.Fatalf("%v, %v; want 10, 1", tx, ch)
		}
	})
	t.Run("frequent", func(t *testing.T) {
		// A reading every millisecond for a minute keeps a bounded number of readings, and the
		// rate stays right.
		c := newClock()
		r := rates{window: 10 * time.Second}
		var n int64
		for range 60000 {
			c.advance(time.Millisecond)
			n += 3
			tx, _ := r.observe(sample{at: c.now(), txns: n})
			if c.now().Sub(newClock().now()) > 11*time.Second && !near(tx, 3000) {
				t.Fatalf("at %v: %v txn/s; want 3000", c.now(), tx)
			}
		}
		if len(r.samples) > 20 {
			t.Fatalf("%d readings kept", len(r.samples))
		}
	})
	t.Run("odd", func(t *testing.T) {
		c := newClock()
		r := rates{window: 10 * time.Second}
		r.observe(sample{at: c.now(), txns: 100})
		if tx, _ := r.observe(sample{at: c.now(), txns: 200}); tx != 0 {
			t.Fatalf("no time passed: %v", tx)
		}
		c.advance(time.Second)
		if tx, _ := r.observe(sample{at: c.now(), txns: 50}); tx != 0 {
			t.Fatalf("counter went down: %v", tx)
		}
		c.advance(-time.Hour)
		if tx, _ := r.observe(sample{at: c.now(), txns: 500}); tx != 0 || len(r.samples) != 1 {
			t.Fatalf("clock went back: %v, %d readings", tx, len(r.samples))
		}
		c.advance(2 * time.Second)
		if tx, _ := r.observe(sample{at: c.now(), txns: 700}); !near(tx, 100) {
			t.Fatalf("after the clock went back: %v; want 100", tx)
		}
	})
}

func TestTimeLag(t *testing.T) {
	c := newClock()
	tests := []struct {
		name string
		a    replication.Activity
		want time.Duration
	}{
		{"caught up", replication.Activity{CaughtUp: true, LastCommitTime: c.ago(time.Hour), LastHandedOut: c.ago(time.Hour)}, 0},
		{"nothing known", replication.Activity{}, 0},
		{"never handed out", replication.Activity{BehindSince: c.ago(5 * time.Second)}, 5 * time.Second},
		{"backlog", replication.Activity{
			BehindSince: c.ago(time.Minute), LastHandedOut: c.ago(time.Second), LastCommitTime: c.ago(time.Hour),
		}, time.Hour},
		{"handed out when it fell behind", replication.Activity{
			BehindSince: c.ago(3 * time.Second), LastHandedOut: c.ago(3 * time.Second), LastCommitTime: c.ago(4 * time.Second),
		}, 4 * time.Second},
		{"idle for an hour, then a transaction being received", replication.Activity{
			BehindSince: c.ago(2 * time.Second), LastHandedOut: c.ago(time.Hour), LastCommitTime: c.ago(time.Hour),
		}, 2 * time.Second},
		{"server clock ahead", replication.Activity{
			BehindSince: c.ago(time.Second), LastHandedOut: c.now(), LastCommitTime: c.t.Add(time.Minute),
		}, 0},
	}
	for _, tt := range tests {
		if got := timeLag(tt.a, c.now()); got != tt.want {
			t.Errorf("%s: %v; want %v", tt.name, got, tt.want)
		}
	}
}

func TestOldestUnackedAge(t *testing.T) {
	c := newClock()
	if got := oldestUnackedAge(replication.Activity{}, c.now()); got != 0 {
		t.Fatalf("none: %v", got)
	}
	if got := oldestUnackedAge(replication.Activity{OldestUnackedAt: c.ago(90 * time.Second)}, c.now()); got != 90*time.Second {
		t.Fatalf("%v; want 1m30s", got)
	}
}

func TestLagBytes(t *testing.T) {
	for _, tt := range []struct {
		p    replication.Progress
		want int64
	}{
		{replication.Progress{}, 0},
		{replication.Progress{Received: 0x1_0000_0100, Flushed: 0x1_0000_0000}, 256},
		{replication.Progress{Received: 100, Flushed: 100}, 0},
		{replication.Progress{Received: 100, Flushed: 200}, 0}, // the slot's position before anything was received
	} {
		if got := lagBytes(tt.p); got != tt.want {
			t.Errorf("%+v: %d; want %d", tt.p, got, tt.want)
		}
	}
}

func TestHumanUnits(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{fmtCount(0), "0"}, {fmtCount(7), "7"}, {fmtCount(0.5), "0.5"}, {fmtCount(2.26), "2.3"},
		{fmtCount(950), "950"}, {fmtCount(999.4), "999"}, {fmtCount(999.6), "1.00k"}, {fmtCount(12345), "12.3k"},
		{fmtCount(123456), "123k"}, {fmtCount(1.21e6), "1.21M"}, {fmtCount(4e9), "4.00G"}, {fmtCount(-1500), "-1.50k"},
		{fmtBytes(0), "0 B"}, {fmtBytes(1023), "1023 B"}, {fmtBytes(1536), "1.50 KiB"}, {fmtBytes(64 << 20), "64.0 MiB"},
		{fmtBytes(1<<30 + 1<<29), "1.50 GiB"}, {fmtBytes(1023 << 20), "1023 MiB"}, {fmtBytes(1024<<20 - 1), "1.00 GiB"},
		{fmtBytes(-2048), "-2.00 KiB"},
		{fmtDuration(0), "0s"}, {fmtDuration(250 * time.Millisecond), "250ms"}, {fmtDuration(3200 * time.Millisecond), "3.2s"},
		{fmtDuration(3 * time.Second), "3s"}, {fmtDuration(245 * time.Second), "4m05s"}, {fmtDuration(127 * time.Minute), "2h07m"},
		{fmtDuration(76 * time.Hour), "3d04h"}, {fmtDuration(-2 * time.Second), "-2s"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q; want %q", tt.got, tt.want)
		}
	}
}
