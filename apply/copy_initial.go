package apply

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/apply/internal/initcopy"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/snapshot"
)

// The initial copy (Config.Copy): a session that finds no progress row for its slot copies the
// published tables in the slot's exported snapshot, then streams from the slot's consistent
// point. The copy's record on the target and its writing are package initcopy's; the copy's
// steps are changefeed's.

var (
	// ErrTargetNotEmpty: Config.Copy would copy into a target table that holds rows, and
	// Config.CopyTruncate is off. Nothing was copied and the slot was dropped again.
	ErrTargetNotEmpty = retry.Stop("apply: initial copy: target table is not empty")
	// ErrCopySlotExists: Config.Copy found the slot on the source, but the target has neither a
	// progress row for it nor the record of a copy that created it: the slot was made by someone
	// else, and the target may lack what the source committed before it. Drop the slot to copy
	// afresh, or run without Copy if the target already holds the data.
	ErrCopySlotExists = retry.Stop("apply: initial copy: the slot exists, but the target has no record of it")
)

// copyConfig prepares the initial copy for the Feed: the copy table (created if missing) and
// whether it records a copy of the slot that began and did not finish, the Copier that writes
// into the target, and the snapshot's configuration. On failure what was copied is discarded
// once the slot is dropped; what could not be discarded, the next session does.
func (s *session) copyConfig(ctx context.Context) (c *initcopy.Copier, begun bool, scfg snapshot.Config, err error) {
	ct := target.CompanionTable(s.leader.Table(s.cfg.ProgressTable), "_copy")
	if err := s.leader.CreateCopyTable(ctx, ct); err != nil {
		return nil, false, scfg, fmt.Errorf("apply: %w", err)
	}
	rows, err := target.Query(ctx, s.leader.PG(), "SELECT relation FROM "+ct+" WHERE slot = $1", s.cfg.Source.Slot)
	if err != nil {
		return nil, false, scfg, fmt.Errorf("apply: reading the copy table %s: %w", ct, err)
	}
	// The connection, publications and binary values are the stream's (InitialCopy).
	scfg = snapshot.Config{Workers: s.cfg.CopyWorkers, Logger: s.log}
	if s.cfg.hooks != nil {
		scfg.ChunkSize = s.cfg.hooks.copyChunkSize
	}
	c = &initcopy.Copier{Leader: s.leader, CopyTable: ct, TablesTable: s.tablesTable(), Slot: s.cfg.Source.Slot, Key: s.key, Upsert: s.progSQL,
		Truncate: s.cfg.CopyTruncate, Log: s.log, Registry: s.reg, Stats: &s.stats.Counters, Host: copyHost{s}}
	return c, len(rows) > 0, scfg, nil
}

// copyHost is the session as the initial copy's initcopy.Host.
type copyHost struct{ s *session }

func (h copyHost) Hook(ctx context.Context, stage string, end decoding.LSN) error {
	return h.s.cfg.hook(ctx, stage, txnRef{EndLSN: end})
}

func (h copyHost) CheckTables(ctx context.Context, tables []*snapshot.Table) error {
	return h.s.copyTables(ctx, tables) // tables.go: all missing at once, or created
}

func (h copyHost) MappingError(err error) error {
	var ce *target.ChangeError
	if errors.As(err, &ce) {
		return changeError{ce}
	}
	return err
}

func (h copyHost) NotEmpty(tables []string) error {
	return configerr.WithHint(ErrTargetNotEmpty, ": ", "%s (empty it, or set %s to let the copy truncate it)",
		strings.Join(tables, ", "), field("CopyTruncate"))
}

func (h copyHost) Copied(cp decoding.LSN, tables []target.KnownTable) {
	h.s.resume = cp
	h.s.tables.Known(tables) // a table added from now on ends the session, and the next copies it
}

// Connect opens the copy's connection i: its rows count in Stats.InitialCopyRows; as the
// workers', it holds the fence's shared lock (a later session waits for it to be gone), and its
// transactions carry an origin of the Applier's.
func (h copyHost) Connect(ctx context.Context, i int) (_ *target.Conn, err error) {
	s := h.s
	o := s.cfg.targetOptions()
	o.InitialCopy = true
	tg, err := connectTarget(ctx, o, "pgreorder apply "+s.cfg.Source.Slot+" c"+strconv.Itoa(i), &s.stats.Counters)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			tg.Close(context.WithoutCancel(ctx))
		}
	}()
	_, fence := s.fenceKeys()
	if err := tg.LockShared(ctx, fence); err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	if err := s.copyOriginSetup(ctx, tg, i); err != nil {
		return nil, err
	}
	return tg, nil
}
