package apply

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
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
	rows, err := target.Query(ctx, tg.PG(), "SELECT pg_catalog.count(*) FROM "+progress+" WHERE slot = $1", s.cfg.Source.Slot)
	if err != nil {
		return 0, fmt.Errorf("apply: reading the progress table %s: %w", progress, err)
	}
	s.hadProgress = string(rows[0][0]) != "0"
	rows, err = target.Query(ctx, tg.PG(), "SELECT pg_catalog.to_regclass($1) IS NOT NULL", s.aheadTable)
	if err != nil {
		return 0, fmt.Errorf("apply: looking for the ahead table: %w", err)
	}
	if string(rows[0][0]) != "t" {
		if !s.cfg.relaxed() {
			return resume, nil
		}
		err := tg.PG().Exec(ctx, target.AheadTableSQL(s.aheadTable)).Close()
		if err != nil && !pgsession.IsCode(err, "42P07") && !pgsession.IsCode(err, "23505") { // made meanwhile
			return 0, fmt.Errorf("apply: creating the ahead table %s (relaxed commit order; as the progress table's owner, run %s): %w",
				s.aheadTable, target.AheadTableSQL(s.aheadTable), err)
		}
		return resume, nil
	}
	rows, err = target.Query(ctx, tg.PG(), "SELECT end_lsn::text, spans::text, system_id FROM "+s.aheadTable+" WHERE slot = $1",
		s.cfg.Source.Slot)
	if err != nil {
		return 0, fmt.Errorf("apply: reading the ahead table %s: %w", s.aheadTable, err)
	}
	if len(rows) == 0 {
		return resume, nil
	}
	if !s.hadProgress {
		if _, err := target.Query(ctx, tg.PG(), "DELETE FROM "+s.aheadTable+" WHERE slot = $1", s.cfg.Source.Slot); err != nil {
			return 0, fmt.Errorf("apply: deleting the slot's rows of the ahead table %s: %w", s.aheadTable, err)
		}
		s.log.Info("the slot has rows in the ahead table but no progress row: deleted them", "slot", s.cfg.Source.Slot, "table", s.aheadTable)
		return resume, nil
	}
	prefix := resume
	var folded schedule.Ahead
	for _, r := range rows {
		if string(r[2]) != s.key.System { // another source system's: the progress row names this one
			continue
		}
		p, err := decoding.ParseLSN(string(r[0]))
		if err != nil {
			return 0, fmt.Errorf("apply: ahead table %s: %w", s.aheadTable, err)
		}
		pairs, err := target.ParseLSNs(string(r[1]))
		if err == nil {
			err = folded.AddFlat(pairs)
		}
		if err != nil {
			return 0, fmt.Errorf("apply: ahead table %s: %w", s.aheadTable, err)
		}
		prefix = max(prefix, p)
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
	b := &pgconn.Batch{}
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	b.ExecParams("SET LOCAL synchronous_commit = on", nil, nil, nil, nil)
	b.ExecParams(s.flushSQL, s.key.Args(prefix), nil, nil, nil)
	b.ExecParams("DELETE FROM "+s.aheadTable+" WHERE slot = $1", [][]byte{[]byte(s.cfg.Source.Slot)}, nil, nil, nil)
	if len(spans) > 0 {
		b.ExecParams(target.AheadSQL(s.aheadTable), target.AheadArgs(s.key, 0, prefix, spans), nil, nil, nil)
	}
	b.ExecParams("COMMIT", nil, nil, nil, nil)
	if _, err := s.leader.PG().ExecBatch(ctx, b).ReadAll(); err != nil {
		return fmt.Errorf("apply: folding the slot's rows of the ahead table %s: %w", s.aheadTable, err)
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
