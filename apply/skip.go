package apply

import (
	"context"
	"fmt"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Skipping one source transaction (Config.SkipLSN), as ALTER SUBSCRIPTION ... SKIP does. The
// skip is recorded in the slot's progress row (skipped_lsn, skipped_xid, skipped_at, columns
// added to the progress table when a skip is first asked for) by the same synchronous target
// transaction that moves the row past the skipped transaction: after a crash either both
// happened (a restart with the same SkipLSN finds the record and applies on) or neither (the
// restart skips it then).

// ErrSkipLSN is wrapped by the error Run stops with when Config.SkipLSN is not the commit LSN of
// the next source transaction to apply. The error names that transaction's commit LSN when it
// is known.
var ErrSkipLSN = retry.Stop("apply: SkipLSN is not the commit LSN of the next transaction to apply")

// skipState is what a session knows of Config.SkipLSN.
type skipState struct {
	pending bool // the first transaction handed out must be the one to skip
	sql     string
}

// setupSkip adds the skip columns to the progress table, and decides whether this session has a
// transaction to skip: not when the progress row records that SkipLSN was skipped already. A
// SkipLSN behind the progress row (a transaction applied, or never one) is refused at once.
func (s *session) setupSkip(ctx context.Context, resume decoding.LSN) error {
	lsn := s.cfg.SkipLSN
	if lsn == 0 {
		return nil
	}
	done, xid, skipped, upsert, err := s.leader.SetupSkip(ctx, s.leader.Table(s.cfg.ProgressTable), s.cfg.Source.Slot)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	if skipped && done == lsn {
		s.log.Info("the transaction of SkipLSN was skipped already: applying on", "skip_lsn", lsn, "xid", xid)
		return nil
	}
	if resume != 0 && lsn < resume {
		return configerr.WithHint(ErrSkipLSN, ": ", "%s: the target has applied the source's transactions up to %s, past it; "+
			"the next transaction to apply commits after %s (a stop on a change names its commit LSN)", skipField(lsn), resume, resume)
	}
	s.skip.pending = true
	s.skip.sql = upsert
	return nil
}

// skipRefused returns the error for the first transaction t of a session with a skip pending
// when it is not the one SkipLSN names, or for an idle advance past SkipLSN.
func (s *session) skipRefused(t *reorderbuffer.Txn) error {
	lsn := s.cfg.SkipLSN
	if t.Part == reorderbuffer.Advance {
		return configerr.WithHint(ErrSkipLSN, ": ", "%s: no source transaction to apply commits there (the source's WAL "+
			"is at %s, with nothing to apply before it)", skipField(lsn), t.EndLSN)
	}
	return configerr.WithHint(ErrSkipLSN, ": ", "%s, but the next transaction to apply is transaction %d with commit LSN %s: "+
		"give that LSN to skip it, or none to apply it", skipField(lsn), t.Xid, t.CommitLSN)
}
