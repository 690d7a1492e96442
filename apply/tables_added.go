package apply

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgreorder/pgreorder/apply/internal/initcopy"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/snapshot"
)

// Tables added to the publications (Config.NewTables; the package documentation says what is
// promised): each session compares the published tables with the tables table's record and
// copies the new ones before it streams (initcopy.Tables and Copier.CopyAdded); the engine asks
// admit about each transaction, and the Feed's publication check calls published.

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
		if !pgsession.IsCode(err, pgsession.InsufficientPrivilege) {
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
	if len(added) == 0 { // a table the stream described and the source does not list yet: its COMMIT may wait for apply
		if be := initcopy.Blocked(ctx, s.a.added, s.sourceSQL); s.a.added != "" && published != nil && be != nil {
			return blockedHint(be)
		}
		return nil
	}
	s.a.added = ""
	return s.copyAdded(ctx, added)
}

// sourceSQL runs sql on the Applier's ordinary connection to the source.
func (s *session) sourceSQL(ctx context.Context, sql string) ([][][]byte, error) {
	return s.a.sourceQuery(ctx, sql)
}

// blockedHint adds to a copy of added tables that cannot start the other way out.
func blockedHint(err error) error {
	return configerr.WithHint(err, "; ", "or set %s and copy the tables' rows yourself",
		configerr.Field{Config: "apply", Path: "NewTables", Value: "changefeed.NewTablesStream", Arg: "false"})
}

// copyAdded copies the added tables from a snapshot of their own (initcopy.Copier.CopyAdded).
func (s *session) copyAdded(ctx context.Context, added []target.Published) error {
	scfg := snapshot.Config{Workers: 1, Logger: s.log}
	if s.cfg.hooks != nil {
		scfg.ChunkSize = s.cfg.hooks.copyChunkSize
	}
	rcfg := s.cfg.Source
	rcfg.Logger = s.log
	open := func(ctx context.Context, keep func(*snapshot.Table) bool) (*snapshot.Session, decoding.LSN, func(), error) {
		ts, err := changefeed.OpenTableSnapshot(ctx, rcfg, scfg, keep)
		if err != nil {
			return nil, 0, nil, err
		}
		return ts.Session, ts.ConsistentPoint, func() { ts.Close(context.WithoutCancel(ctx)) }, nil
	}
	c := &initcopy.Copier{Leader: s.leader, TablesTable: s.tablesTable(), Slot: s.cfg.Source.Slot, Key: s.key,
		Truncate: s.cfg.CopyTruncate, Log: s.log, Registry: s.reg, Stats: &s.stats.Counters, Host: copyHost{s},
		Source: s.sourceSQL}
	err := c.CopyAdded(ctx, s.tables, added, open)
	if _, ok := errors.AsType[*initcopy.BlockedError](err); ok {
		return blockedHint(err)
	}
	return err
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
