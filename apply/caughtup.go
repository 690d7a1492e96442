package apply

import (
	"github.com/pgreorder/pgreorder/apply/internal/engine"
	"github.com/pgreorder/pgreorder/decoding"
)

// Config.UntilCaughtUp: Run returns nil once everything the source had written when Run started
// is applied on the target and acknowledged.

// errCaughtUp ends a session that caught up (Config.UntilCaughtUp).
var errCaughtUp = engine.ErrCaughtUp

// noteStart records, in the first session, the source's WAL position to catch up to.
func (s *session) noteStart(pos decoding.LSN) {
	if s.cfg.UntilCaughtUp && s.a.until.Load() == 0 {
		s.a.until.Store(uint64(pos))
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
