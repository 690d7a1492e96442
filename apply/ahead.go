package apply

import (
	"context"
	"fmt"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
)

// Relaxed commit order (Config.CommitOrder). A worker that commits transactions ahead of the
// committed prefix records them in its row of the ahead table (the progress table's name with
// "_ahead"; see target.AheadSQL), in the same target transaction. A session, in any mode, reads
// those rows when it starts: the position to resume from is the highest of the slot's progress row
// and of the rows' prefixes, and the transactions of the rows' spans past it were committed
// already: they are handed out again by the stream and not applied (alreadyApplied). The rows are
// folded into one (worker 0) at once, with the progress row moved to that position, so that the
// workers of the new session start from empty rows; the workers' rows then drop the spans the
// prefix passes as they are rewritten, and the folded row goes at the next session's start.
//
// The rows belong to the slot's progress row: a session that finds rows but no progress row (the
// row was deleted, to copy again) deletes them. So that a first session's workers never record
// anything before a progress row exists, a relaxed session writes one at the stream's start
// position when there is none.

// setupAhead creates the ahead table in relaxed mode, reads what it records of the slot, folds it,
// and returns the position to resume from (resume, the progress row's, or past it).
func (s *session) setupAhead(ctx context.Context, resume decoding.LSN) (decoding.LSN, error) {
	tg := s.leader
	progress := tg.Table(s.cfg.ProgressTable)
	s.aheadTable = target.CompanionTable(progress, "_ahead")
	had, err := tg.HasProgress(ctx, progress, s.cfg.Source.Slot)
	if err != nil {
		return 0, fmt.Errorf("apply: %w", err)
	}
	s.hadProgress = had
	rows, all, _, err := tg.AheadRows(ctx, s.aheadTable, s.cfg.Source.Slot, s.key.System, s.cfg.relaxed())
	if err != nil {
		return 0, fmt.Errorf("apply: %w", err)
	}
	if all == 0 {
		return resume, nil
	}
	if !s.hadProgress {
		if err := tg.DeleteAhead(ctx, s.aheadTable, s.cfg.Source.Slot); err != nil {
			return 0, fmt.Errorf("apply: %w", err)
		}
		s.log.Info("the slot has rows in the ahead table but no progress row: deleted them", "slot", s.cfg.Source.Slot, "table", s.aheadTable)
		return resume, nil
	}
	prefix := resume
	var folded schedule.Ahead
	for _, r := range rows {
		if err := folded.AddFlat(r.Spans); err != nil {
			return 0, fmt.Errorf("apply: ahead table %s: %w", s.aheadTable, err)
		}
		prefix = max(prefix, r.End)
	}
	folded.Prune(prefix)
	if err := s.foldAhead(ctx, prefix, folded.Flat()); err != nil {
		return 0, err
	}
	s.applied = folded
	if prefix > resume || folded.Len() > 0 {
		s.log.Info("transactions committed out of order before the restart (relaxed commit order) are not applied again",
			"slot", s.cfg.Source.Slot, "resume_after", prefix, "progress_row", resume, "committed_ahead", folded.Len())
	}
	return prefix, nil
}

// foldAhead replaces the slot's rows of the ahead table by one, worker 0's, with the spans past
// prefix, and moves the progress row to prefix, in one synchronous target transaction.
func (s *session) foldAhead(ctx context.Context, prefix decoding.LSN, spans []decoding.LSN) error {
	if err := s.leader.FoldAhead(ctx, s.aheadTable, s.flushSQL, s.key, prefix, spans); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return nil
}

// ensureProgress writes the progress row, at the stream's start position, when the slot had none
// and the workers may write rows of the ahead table (relaxed): they belong to it.
func (s *session) ensureProgress(ctx context.Context, resume decoding.LSN) error {
	if !s.cfg.relaxed() || s.hadProgress {
		return nil
	}
	pos := max(resume, s.stream.Progress().Start)
	if err := s.leader.FlushWAL(ctx, s.flushSQL, s.key.Args(pos)); err != nil {
		return err
	}
	s.hadProgress = true
	s.persisted = max(s.persisted, pos)
	return nil
}
