package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/initcopy"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/snapshot"
)

// Tables added to the publications (Config.NewTables). The tables table (the progress table's
// name with "_tables", see target.KnownTable) records the source tables the target holds whole:
// those of the initial copy, or those published when the slot was first followed without one.
// Each session lists the published tables when it starts, and copies those the table does not
// record before it streams: from a temporary slot's exported snapshot, in one target transaction
// that also records them with the snapshot's consistent point C. The stream then leaves out
// their changes of the transactions whose commit record begins before C (those are in the copy)
// and applies the rest: no row missing or twice, whatever was written to them meanwhile. Until
// a durable progress row is past C the session applies Buffered (whole transactions, whose commit
// position is known), then starts over in the configured mode. A table the session does not
// know, described by the stream or listed by the Feed's publication check, ends the session,
// and the next one copies it at once. A crash in the copy rolls its transaction back: the next
// session copies again. What a session knows of the tables is initcopy.Tables.

// tablesTable returns the quoted, qualified name of the tables table.
func (s *session) tablesTable() string {
	return target.CompanionTable(s.leader.Table(s.cfg.ProgressTable), "_tables")
}

// newTables returns the session's initcopy.Tables, which follows no tables until Start or Known.
func (s *session) newTables() *initcopy.Tables {
	return &initcopy.Tables{Leader: s.leader, Table: s.tablesTable(), Key: s.key, Log: s.log,
		Own:        s.leader.OwnTables(s.leader.Table(s.cfg.ProgressTable), s.cfg.Conflicts.LogTable, s.cfg.Conflicts.TombstoneTable),
		StreamOnly: s.cfg.NewTables == changefeed.NewTablesStream, StreamOnlyOption: field("NewTables").String() + " is NewTablesStream"}
}

// followTables takes up the published tables as the session found them (nil when they could
// not be listed; see initcopy.Tables.Start), and copies those added to the publications.
func (s *session) followTables(ctx context.Context, published []target.Published, resume decoding.LSN) error {
	tt := s.tablesTable()
	if err := s.leader.CreateTablesTable(ctx, tt); err != nil {
		if !pgsession.IsCode(err, "42501") {
			return fmt.Errorf("apply: %w", err)
		}
		s.a.once("tables table", func() {
			s.log.Warn("the target role may not create the tables table: tables added to the publications are not copied, "+
				"only their changes from then on are applied (create the table as another role, or grant CREATE on its schema)",
				"table", tt, "err", err)
		})
		return nil
	}
	added, err := s.tables.Start(ctx, published, resume)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	if len(added) == 0 {
		return nil
	}
	return s.copyAdded(ctx, added)
}

// copyAdded copies the added tables from a snapshot of their own (see initcopy.Copier.Added).
func (s *session) copyAdded(ctx context.Context, added []target.Published) error {
	oids := make(map[uint32]bool, len(added))
	names := make([]string, len(added))
	for i, p := range added {
		oids[p.OID] = true
		names[i] = initcopy.Display(p.Name)
	}
	slices.Sort(names)
	list := strings.Join(names, ", ")
	start := time.Now()
	scfg := snapshot.Config{Workers: 1, Logger: s.log}
	if s.cfg.hooks != nil {
		scfg.ChunkSize = s.cfg.hooks.copyChunkSize
	}
	rcfg := s.cfg.Source
	rcfg.Logger = s.log
	s.log.Info("tables added to the publications: taking a snapshot of them (the temporary slot waits for the transactions "+
		"running on the source to end)", "tables", list, "slot", s.cfg.Source.Slot)
	ts, err := changefeed.OpenTableSnapshot(ctx, rcfg, scfg, func(t *snapshot.Table) bool { return oids[t.OID] })
	if err != nil {
		return fmt.Errorf("apply: copying the tables added to the publications (%s): %w", list, err)
	}
	defer ts.Close(context.WithoutCancel(ctx))
	if len(ts.Session.Tables()) == 0 {
		s.log.Info("the tables added to the publications are no longer published: nothing to copy", "tables", list)
		return nil
	}
	cp := ts.ConsistentPoint
	s.log.Info("tables added to the publications: copying their rows, then applying their changes", "tables", list,
		"consistent_point", cp, "slot", s.cfg.Source.Slot)
	h := copyHost{s}
	tg, err := h.Connect(ctx, 1)
	if err != nil {
		return err
	}
	defer tg.Close(context.WithoutCancel(ctx))
	c := &initcopy.Copier{Leader: s.leader, TablesTable: s.tablesTable(), Slot: s.cfg.Source.Slot, Key: s.key,
		Truncate: s.cfg.CopyTruncate, Log: s.log, Registry: s.reg, Stats: &s.stats.Counters, Host: h}
	rows, err := c.Added(ctx, tg, ts.Session, cp)
	if err != nil {
		if _, ok := errors.AsType[*target.ChangeError](err); ok {
			err = h.MappingError(err)
		}
		return fmt.Errorf("apply: copying the tables added to the publications (%s): %w", list, err)
	}
	s.tables.Copied(ts.Session.Tables(), cp)
	if err := s.cfg.hook(ctx, "added-copied", txnRef{EndLSN: cp}); err != nil {
		return err
	}
	s.log.Info("tables added to the publications copied", "tables", list, "rows", rows,
		"elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// admit is the engine's Host.Admit: a table the session does not know ends it (the next one
// copies it), or with NewTablesStream is known from now on; a transaction that commits before
// the consistent point of a table's copy is applied without that table's changes.
func (s *session) admit(t *reorderbuffer.Txn) error {
	for _, r := range t.Described() {
		if err := s.tables.Seen(r.RelationID, r.Namespace, r.Name); err != nil {
			return err
		}
	}
	if t.Part == reorderbuffer.Whole {
		if keep := s.tables.Keep(t.CommitLSN); keep != nil {
			t.Filter(keep)
		}
	}
	return nil
}

// published takes the Feed's listing of the published tables, while the session streams: a table
// the session does not know ends it (see admit).
func (s *session) published(tables []changefeed.TableRef) {
	for _, t := range tables {
		if err := s.tables.Seen(t.OID, t.Schema, t.Name); err != nil {
			s.cancel(err)
			return
		}
	}
}
