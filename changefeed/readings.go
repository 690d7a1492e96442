package changefeed

import (
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// ended is what the streams of the attempts that ended reported, so that the Feed's readings
// (Progress, Stats, Activity) go on across attempts, each of which has a stream and a reorder
// buffer of its own: counters summed, positions the highest, never going back.
type ended struct {
	n          int                  // streams ended
	pos        replication.Progress // the highest positions they reported
	stats      reorderbuffer.Stats  // their counters, summed
	handedOut  int64                // their Activity.HandedOut, summed
	acked      int64                // and Activity.Acked
	started    time.Time            // when the first started
	lastCommit time.Time            // the last transaction handed out: its commit time
	lastOut    time.Time            // and when
	behind     time.Time            // when the last ended, if it was caught up; else when it fell behind
}

// add records what s reported, as it ends.
func (e *ended) add(s *replication.Stream) { e.addReadings(s.Progress(), s.Stats(), s.Activity()) }

// addReadings records the readings of a stream that ended.
func (e *ended) addReadings(p replication.Progress, st reorderbuffer.Stats, act replication.Activity) {
	if e.n == 0 {
		e.started = act.Started
		e.pos.Start = p.Start
	}
	e.n++
	e.pos.Received = max(e.pos.Received, p.Received)
	e.pos.Flushed = max(e.pos.Flushed, p.Flushed)
	e.pos.Acked = max(e.pos.Acked, p.Acked)
	e.stats = e.stats.Plus(st)
	e.handedOut += act.HandedOut
	e.acked += act.Acked
	if !act.LastHandedOut.IsZero() {
		e.lastCommit, e.lastOut = act.LastCommitTime, act.LastHandedOut
	}
	switch {
	case act.CaughtUp:
		e.behind = time.Now()
	case act.BehindSince.Equal(act.Started) && !e.behind.IsZero():
		// Never caught up: behind since before it started.
	default:
		e.behind = act.BehindSince
	}
}

// progress returns p, none of its positions below what the ended streams reported.
func (e *ended) progress(p replication.Progress) replication.Progress {
	if e.n == 0 {
		return p
	}
	p.Received = max(p.Received, e.pos.Received)
	p.Flushed = max(p.Flushed, e.pos.Flushed)
	p.Acked = max(p.Acked, e.pos.Acked)
	return p
}

// activity returns the current stream's act (zero between streams) over the ended ones: counts
// summed, Started the first stream's, the last transaction handed out kept, and between streams,
// or while the current one has not caught up yet, behind since the last one ended (if it was
// caught up then).
func (e *ended) activity(act replication.Activity, current bool) replication.Activity {
	if e.n == 0 {
		return act
	}
	if !current || !act.CaughtUp && act.BehindSince.Equal(act.Started) {
		act.BehindSince = e.behind
	}
	act.HandedOut += e.handedOut
	act.Acked += e.acked
	act.Started = e.started
	if act.LastHandedOut.IsZero() {
		act.LastCommitTime, act.LastHandedOut = e.lastCommit, e.lastOut
	}
	return act
}

// statsOf returns st, the current stream's statistics (zero between streams), with the ended
// streams' counters added; the gauges (memory, spill files now, positions) are the current one's.
func (e *ended) statsOf(st reorderbuffer.Stats) reorderbuffer.Stats {
	if e.n == 0 {
		return st
	}
	return st.Plus(e.stats)
}

// Continue makes f's readings (Progress, Stats, Activity, Reconnects) go on from those of prev, a
// Feed of the same slot whose Run has returned, as if f's attempts were more of prev's: its
// positions never below prev's, its counters added to prev's, and its first stream a restart.
// A consumer that runs a new Feed after another (package apply, at each Run of an Applier) keeps
// one set of readings so. It must be called before f's Run.
func (f *Feed) Continue(prev *Feed) error {
	if prev == nil || prev == f {
		return fmt.Errorf("%w: Continue needs another Feed", ErrInvalidConfig)
	}
	prev.mu.Lock()
	running, past, streams, restarts := prev.running && prev.stream != nil, prev.past, prev.streams, prev.restarts
	prev.mu.Unlock()
	if running {
		return fmt.Errorf("%w: Continue from a Feed that still streams", ErrInvalidConfig)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running {
		return fmt.Errorf("%w: Continue after Run", ErrInvalidConfig)
	}
	f.past, f.streams, f.restarts = past, streams, restarts
	return nil
}
