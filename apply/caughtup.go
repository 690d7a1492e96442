package apply

import (
	"errors"

	"github.com/pgreorder/pgreorder/decoding"
)

// Config.UntilCaughtUp: Run returns nil once everything the source had written when Run started
// is applied on the target and acknowledged.

// errCaughtUp ends a session that caught up (Config.UntilCaughtUp).
var errCaughtUp = errors.New("apply: caught up")

// noteStart records, in the first session, the source's WAL position to catch up to.
func (s *session) noteStart(pos decoding.LSN) {
	if s.cfg.UntilCaughtUp && s.a.until.Load() == 0 {
		s.a.until.Store(uint64(pos))
	}
}

// caughtUp says whether the session may end for Config.UntilCaughtUp: a durable progress row is
// at or past the position to catch up to, and every commit was acknowledged to the source.
func (s *session) caughtUp() bool {
	until := decoding.LSN(s.a.until.Load())
	if !s.cfg.UntilCaughtUp || until == 0 {
		return false
	}
	a := &s.acks
	a.mu.Lock()
	persisted := a.persisted
	done := len(a.list) == 0 && persisted >= until
	a.mu.Unlock()
	if done && s.a.reached.Load() == 0 {
		s.a.reached.Store(uint64(until))
		s.log.Info("caught up", "lsn", until, "applied_lsn", persisted)
	}
	return done
}

// askPosition, for Config.UntilCaughtUp, asks the stream to hand out the source's position as an
// idle advance as soon as the source says it, when nothing is left to acknowledge: WAL the source
// wrote past the last transaction (a checkpoint is enough) is then caught up to within a round
// trip, not at the next status interval.
func (s *session) askPosition() {
	if !s.cfg.UntilCaughtUp || s.a.until.Load() == 0 || s.a.reached.Load() != 0 {
		return
	}
	a := &s.acks
	a.mu.Lock()
	idle := len(a.list) == 0
	a.mu.Unlock()
	if idle {
		s.stream.AdvanceSoon()
	}
}

// CaughtUp returns, once Run stopped for Config.UntilCaughtUp, the source's WAL position it
// caught up to (the position when Run started): everything up to it is on the target and
// acknowledged. ok is false before.
func (a *Applier) CaughtUp() (lsn decoding.LSN, ok bool) {
	if a == nil {
		return 0, false
	}
	l := a.reached.Load()
	return decoding.LSN(l), l != 0
}
