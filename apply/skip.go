package apply

import (
	"context"
	"fmt"

	"github.com/pgreorder/pgreorder/apply/internal/target"
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
	table := s.leader.Table(s.cfg.ProgressTable)
	rows, err := target.Query(ctx, s.leader.PG(), `SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute
		WHERE attrelid = $1::regclass AND attname IN ('skipped_lsn', 'skipped_xid', 'skipped_at') AND NOT attisdropped`, table)
	if err == nil && string(rows[0][0]) != "3" {
		err = s.leader.PG().Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN IF NOT EXISTS skipped_lsn pg_lsn, "+
			"ADD COLUMN IF NOT EXISTS skipped_xid bigint, ADD COLUMN IF NOT EXISTS skipped_at timestamptz").Close()
	}
	if err != nil {
		return fmt.Errorf("apply: adding the skip columns to the progress table %s (as its owner, run ALTER TABLE %s "+
			"ADD COLUMN skipped_lsn pg_lsn, ADD COLUMN skipped_xid bigint, ADD COLUMN skipped_at timestamptz): %w", table, table, err)
	}
	rows, err = target.Query(ctx, s.leader.PG(), "SELECT skipped_lsn::text, skipped_xid::text FROM "+table+" WHERE slot = $1", s.cfg.Source.Slot)
	if err != nil {
		return fmt.Errorf("apply: reading the progress table %s: %w", table, err)
	}
	if len(rows) == 1 && rows[0][0] != nil {
		if done, err := decoding.ParseLSN(string(rows[0][0])); err == nil && done == lsn {
			s.log.Info("the transaction of SkipLSN was skipped already: applying on", "skip_lsn", lsn, "xid", string(rows[0][1]))
			return nil
		}
	}
	if resume != 0 && lsn < resume {
		return configerr.WithHint(ErrSkipLSN, ": ", "%s: the target has applied the source's transactions up to %s, past it; "+
			"the next transaction to apply commits after %s (a stop on a change names its commit LSN)", skipField(lsn), resume, resume)
	}
	s.skip.pending = true
	s.skip.sql = "INSERT INTO " + table + " AS p (slot, end_lsn, system_id, timeline, skipped_lsn, skipped_xid, skipped_at) " +
		"VALUES ($1, $2::pg_lsn, $3, $4::int, $5::pg_lsn, $6::bigint, pg_catalog.now()) ON CONFLICT (slot) DO UPDATE SET " +
		"end_lsn = GREATEST(p.end_lsn, excluded.end_lsn), skipped_lsn = excluded.skipped_lsn, skipped_xid = excluded.skipped_xid, " +
		"skipped_at = excluded.skipped_at WHERE p.system_id = excluded.system_id RETURNING pg_catalog.pg_current_wal_insert_lsn()::text"
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
