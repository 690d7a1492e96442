// Package streams follows the replication streams of the sessions of an Applier (package apply),
// one after another, so that the Applier answers Progress, Activity, BufferStats and Reconnects
// between sessions too, over all of them, with counters that never go back: the current
// session's stream (Attach, Detach), what the ended ones reported, and the last transaction
// committed on the target (Applied). It reads the streams through their methods (package
// replication) and touches no server itself.
package streams

import (
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// Tracker follows the replication streams of an Applier's sessions: the current session's
// stream, and what the streams of the ended sessions reported. The zero value is ready; its
// methods may be called from any goroutine.
type Tracker struct {
	mu  sync.Mutex
	cur *replication.Stream // the current session's stream; nil between sessions

	pos        replication.Progress // the highest positions the ended streams reported
	buf        reorderbuffer.Stats  // the ended streams' counters, summed
	handedOut  int64                // the ended streams' Activity.HandedOut, summed
	acked      int64                // and Activity.Acked
	reconnects int                  // the ended streams' Reconnects, plus one per stream after the first
	started    int                  // streams started
	first      time.Time            // when the first stream started
	// behind is when the Applier stopped being caught up, kept across sessions: the moment a
	// stream that was caught up ended, or when an ended stream stopped being caught up. Zero
	// while caught up, and before the first stream.
	behind time.Time

	// The last transaction committed on the target: its commit time on the source, and when it
	// committed (local clock).
	lastCommit, lastApplied time.Time
}

// Attach records that s is the current session's stream.
func (w *Tracker) Attach(s *replication.Stream) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started > 0 {
		w.reconnects++
	}
	w.started++
	w.cur = s
	if w.first.IsZero() {
		w.first = s.Activity().Started
	}
}

// Detach records what the current stream reported, as it ends.
func (w *Tracker) Detach() {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.cur
	if s == nil {
		return
	}
	w.cur = nil
	p := s.Progress()
	w.pos = replication.Progress{Start: p.Start, Received: max(w.pos.Received, p.Received),
		Flushed: max(w.pos.Flushed, p.Flushed), Acked: max(w.pos.Acked, p.Acked)}
	w.buf = w.buf.Plus(s.Stats())
	act := s.Activity()
	w.handedOut += act.HandedOut
	w.acked += act.Acked
	w.reconnects += s.Reconnects()
	switch {
	case act.CaughtUp:
		w.behind = time.Now()
	case act.BehindSince.Equal(act.Started) && !w.behind.IsZero():
		// Never caught up: behind since before it started.
	default:
		w.behind = act.BehindSince
	}
}

// Applied records that t committed on the target.
func (w *Tracker) Applied(t *reorderbuffer.Txn) {
	if t.CommitTime.IsZero() {
		return // an idle advance, a non-transactional message
	}
	now := time.Now()
	w.mu.Lock()
	w.lastCommit, w.lastApplied = t.CommitTime, now
	w.mu.Unlock()
}

// Progress returns the positions of the source's WAL (replication.Stream.Progress) over all
// sessions: the current stream's, none lower than what the ended ones reported; between sessions
// what they reported.
func (w *Tracker) Progress() replication.Progress {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil {
		return w.pos
	}
	p := w.cur.Progress()
	p.Received = max(p.Received, w.pos.Received)
	p.Flushed = max(p.Flushed, w.pos.Flushed)
	p.Acked = max(p.Acked, w.pos.Acked)
	return p
}

// Activity returns the current stream's replication.Activity over all sessions: LastCommitTime
// and LastHandedOut are those of the last transaction committed on the target (Applied);
// HandedOut and Acked are summed; Started is when the first stream started; and between streams,
// or while a new one has not caught up yet, the Applier is behind since the moment the last
// stream ended if it was caught up then. Before the first stream, zero values.
func (w *Tracker) Activity() replication.Activity {
	w.mu.Lock()
	defer w.mu.Unlock()
	var act replication.Activity
	if w.cur != nil {
		act = w.cur.Activity()
		switch {
		case act.CaughtUp:
			w.behind = time.Time{}
		case act.BehindSince.Equal(act.Started) && !w.behind.IsZero():
			act.BehindSince = w.behind
		}
	} else if w.started > 0 {
		act.BehindSince = w.behind
	}
	act.Started = w.first
	act.HandedOut += w.handedOut
	act.Acked += w.acked
	act.LastCommitTime, act.LastHandedOut = w.lastCommit, w.lastApplied
	return act
}

// BufferStats returns the reorder buffer's statistics (replication.Stream.Stats): the counters
// summed over all streams, the gauges of the current one (0 between streams).
func (w *Tracker) BufferStats() reorderbuffer.Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil {
		return w.buf
	}
	s := w.cur.Stats()
	sum := w.buf.Plus(s)
	s.SpillTxns, s.SpillCount, s.SpillBytes = sum.SpillTxns, sum.SpillCount, sum.SpillBytes
	s.StreamTxns, s.StreamCount, s.StreamBytes = sum.StreamTxns, sum.StreamCount, sum.StreamBytes
	s.TotalTxns, s.TotalBytes, s.TotalChanges = sum.TotalTxns, sum.TotalBytes, sum.TotalChanges
	s.AbortedTxns, s.AbortedSubxacts = sum.AbortedTxns, sum.AbortedSubxacts
	s.RestartedTxns, s.SkippedTxns = sum.RestartedTxns, sum.SkippedTxns
	s.PeakMemoryBytes = sum.PeakMemoryBytes
	return s
}

// Reconnects returns the reconnections of the streams, plus one per stream after the first.
func (w *Tracker) Reconnects() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.reconnects
	if w.cur != nil {
		n += w.cur.Reconnects()
	}
	return n
}
