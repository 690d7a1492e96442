package changefeed

import (
	"errors"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// TestEndedActivity: the Feed's Activity over its attempts' streams. Counts are summed and
// Started is the first stream's; between streams, and while a new stream has not caught up yet,
// the Feed is behind since the last stream ended if that one was caught up, else since it fell
// behind (or, never caught up, since before it started); a stream that caught up and fell behind
// again is behind since then.
func TestEndedActivity(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var e ended
	if got := e.activity(replication.Activity{HandedOut: 3, Started: at(1), BehindSince: at(1)}, true); got.HandedOut != 3 || !got.BehindSince.Equal(at(1)) {
		t.Fatalf("before any stream ended: %+v", got)
	}

	// A first stream, behind from its start and never caught up, ends.
	e.addReadings(replication.Progress{Start: 10, Received: 50, Flushed: 40, Acked: 40}, reorderbuffer.Stats{TotalTxns: 5},
		replication.Activity{Started: at(1), BehindSince: at(1), HandedOut: 5, Acked: 5})
	between := e.activity(replication.Activity{}, false)
	if !between.BehindSince.Equal(at(1)) || between.HandedOut != 5 || !between.Started.Equal(at(1)) {
		t.Errorf("between streams, after one never caught up: %+v; want behind since 1s, 5 handed out, started at 1s", between)
	}
	// The second has not caught up yet: still behind since the first fell behind.
	cur := replication.Activity{Started: at(20), BehindSince: at(20), HandedOut: 2, Acked: 1}
	if got := e.activity(cur, true); !got.BehindSince.Equal(at(1)) || got.HandedOut != 7 || got.Acked != 6 || !got.Started.Equal(at(1)) {
		t.Errorf("a second stream not caught up yet: %+v; want behind since 1s, 7 handed out, 6 acknowledged, started at 1s", got)
	}
	// Caught up now: the current stream's own reading.
	cur.CaughtUp, cur.BehindSince = true, time.Time{}
	if got := e.activity(cur, true); !got.CaughtUp || !got.BehindSince.IsZero() {
		t.Errorf("a second stream caught up: %+v", got)
	}
	// Fell behind again at 30s: behind since then.
	cur.CaughtUp, cur.BehindSince = false, at(30)
	if got := e.activity(cur, true); !got.BehindSince.Equal(at(30)) {
		t.Errorf("a second stream behind again: %+v; want behind since 30s", got)
	}
	// It ends while behind (since 30s); a third never caught up starts: behind since 30s.
	e.addReadings(replication.Progress{Received: 90}, reorderbuffer.Stats{}, cur)
	if got := e.activity(replication.Activity{Started: at(40), BehindSince: at(40)}, true); !got.BehindSince.Equal(at(30)) {
		t.Errorf("a third stream after one that ended behind: %+v; want behind since 30s", got)
	}
	// A stream that ended caught up: behind since it ended (now), not before.
	before := time.Now()
	e.addReadings(replication.Progress{}, reorderbuffer.Stats{}, replication.Activity{Started: at(40), CaughtUp: true})
	if got := e.activity(replication.Activity{}, false); got.BehindSince.Before(before) {
		t.Errorf("after a stream that ended caught up: behind since %v, before it ended (%v)", got.BehindSince, before)
	}
	if p := e.progress(replication.Progress{Received: 60}); p.Received != 90 || p.Flushed != 40 {
		t.Errorf("progress %+v: not the highest reported", p)
	}
}

// TestContinue: a Feed continued from another has its readings, and Continue refuses misuse.
func TestContinue(t *testing.T) {
	prev, f := &Feed{}, &Feed{}
	prev.past.addReadings(replication.Progress{Received: 70, Flushed: 60, Acked: 60}, reorderbuffer.Stats{TotalTxns: 4},
		replication.Activity{HandedOut: 4, Acked: 4})
	prev.streams, prev.restarts = 2, 1
	if err := f.Continue(prev); err != nil {
		t.Fatal(err)
	}
	if f.Reconnects() != 1 || f.Progress().Flushed != 60 || f.Stats().TotalTxns != 4 || f.Activity().HandedOut != 4 {
		t.Errorf("continued: reconnects %d, progress %+v, stats %+v, activity %+v", f.Reconnects(), f.Progress(), f.Stats(), f.Activity())
	}
	for name, c := range map[string]func() error{
		"nil":     func() error { return f.Continue(nil) },
		"itself":  func() error { return f.Continue(f) },
		"running": func() error { g := &Feed{}; g.running = true; return g.Continue(prev) },
	} {
		if err := c(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v; want ErrInvalidConfig", name, err)
		}
	}
}
