package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
// position is known), then starts over in the configured mode. A Relation message for a table
// the session does not know (added while it streams) ends the session, and the next one copies
// it at once. A crash in the copy rolls its transaction back: the next session copies again.

// tablesTable returns the quoted, qualified name of the tables table.
func (s *session) tablesTable() string {
	return target.CompanionTable(s.leader.Table(s.cfg.ProgressTable), "_tables")
}

// addedTables is what a session knows of the published tables.
type addedTables struct {
	syncs  map[uint32]decoding.LSN // tables copied after they were added, whose copy's consistent point is past resume
	syncTo decoding.LSN            // the latest of syncs
	own    map[string]bool         // the Applier's own tables (target.Conn.OwnTables): never copied

	// The leader's and the publication watch's (published).
	mu     sync.Mutex
	known  map[uint32]bool // the tables the target holds whole; nil: not followed this session
	warned map[uint32]bool // NewTablesStream: tables the log named already
}

// tablesAddedError ends a session whose stream describes a table that was added to the
// publications after the session started: the next session copies it at once.
type tablesAddedError struct{ table string }

func (e *tablesAddedError) Error() string {
	return "apply: table " + e.table + " was added to the publications: starting the session over to copy it"
}

// Retryable reports true: the next session copies the table.
func (e *tablesAddedError) Retryable() bool { return true }

// followTables reads the tables table and compares it with published, the publications' tables
// as the session found them (nil when they could not be listed): a slot with no record records
// them all; tables no longer published are forgotten; tables added are copied, or, with
// NewTablesStream, recorded. It sets what the stream leaves out of the transactions before the
// copies' consistent points.
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
	rows, recorded, err := s.leader.ReadTables(ctx, tt, s.key)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	at := &s.tables
	at.own = s.leader.OwnTables(s.leader.Table(s.cfg.ProgressTable), s.cfg.Conflicts.LogTable, s.cfg.Conflicts.TombstoneTable)
	if !recorded {
		if published == nil {
			return nil // recorded by a later session
		}
		all := make([]target.KnownTable, len(published))
		for i, p := range published {
			all[i] = knownTable(p, 0)
		}
		if err := s.leader.WithTxn(ctx, true, func() error {
			return s.leader.RecordTables(ctx, tt, s.key, all, true)
		}); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		s.log.Info("recorded the published tables as whole on the target: a table added to the publications from now on "+
			"is copied before its changes are applied", "slot", s.cfg.Source.Slot, "tables", len(all), "table", tt)
		at.known = make(map[uint32]bool, len(all))
		for _, k := range all {
			at.known[k.OID] = true
		}
		return nil
	}
	at.known = make(map[uint32]bool, len(rows))
	for _, k := range rows {
		at.known[k.OID] = true
		if k.Synced > resume {
			at.sync(k.OID, k.Synced)
		}
	}
	if published == nil {
		return nil
	}
	if err := s.forgetUnpublished(ctx, tt, rows, published); err != nil {
		return err
	}
	own := at.own
	var added, stream []target.Published
	for _, p := range published {
		switch {
		case at.known[p.OID]:
		case own[p.Name.Quoted()] || s.cfg.NewTables == changefeed.NewTablesStream:
			stream = append(stream, p)
		default:
			added = append(added, p)
		}
	}
	if len(stream) > 0 {
		ks := make([]target.KnownTable, len(stream))
		for i, p := range stream {
			ks[i] = knownTable(p, 0)
			at.known[p.OID] = true
			if !own[p.Name.Quoted()] {
				s.streamOnly(p.OID, ks[i].Name)
			}
		}
		if err := s.leader.RecordTables(ctx, tt, s.key, ks, false); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
	}
	if len(added) == 0 {
		return nil
	}
	return s.copyAdded(ctx, tt, added)
}

// copiedTables takes the tables of the initial copy as the ones the session knows: a table added
// to the publications while it streams ends it, and the next session copies it.
func (s *session) copiedTables(tables []target.KnownTable) {
	at := &s.tables
	at.mu.Lock()
	defer at.mu.Unlock()
	at.own = s.leader.OwnTables(s.leader.Table(s.cfg.ProgressTable), s.cfg.Conflicts.LogTable, s.cfg.Conflicts.TombstoneTable)
	at.known = make(map[uint32]bool, len(tables))
	for _, k := range tables {
		at.known[k.OID] = true
	}
}

// forgetUnpublished deletes the rows of the recorded tables that are no longer published: their
// changes stop coming; added again, they are copied again.
func (s *session) forgetUnpublished(ctx context.Context, tt string, rows []target.KnownTable, published []target.Published) error {
	now := make(map[uint32]bool, len(published))
	for _, p := range published {
		now[p.OID] = true
	}
	var gone []uint32
	for _, k := range rows {
		if !now[k.OID] {
			gone = append(gone, k.OID)
			s.log.Info("table no longer published: its changes stop arriving, its rows stay on the target", "table", k.Name,
				"slot", s.cfg.Source.Slot)
			delete(s.tables.known, k.OID)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	if err := s.leader.ForgetTables(ctx, tt, s.cfg.Source.Slot, gone); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return nil
}

// streamOnly logs, once per session, that a table added to the publications is not copied.
func (s *session) streamOnly(oid uint32, name string) {
	at := &s.tables
	if at.warned[oid] {
		return
	}
	if at.warned == nil {
		at.warned = map[uint32]bool{}
	}
	at.warned[oid] = true
	s.log.Warn("table added to the publications: its changes are applied from now on, its rows from before are not copied "+
		"("+field("NewTables").String()+" is NewTablesStream)", "table", name, "slot", s.cfg.Source.Slot)
}

// sync notes that the stream leaves out table oid's changes of the transactions that commit
// before cp.
func (at *addedTables) sync(oid uint32, cp decoding.LSN) {
	if at.syncs == nil {
		at.syncs = map[uint32]decoding.LSN{}
	}
	at.syncs[oid] = cp
	at.syncTo = max(at.syncTo, cp)
}

// knownTable returns the tables table's row of p.
func knownTable(p target.Published, synced decoding.LSN) target.KnownTable {
	return target.KnownTable{OID: p.OID, Name: pgsession.DisplayIdent(p.Name.Schema) + "." + pgsession.DisplayIdent(p.Name.Name),
		Synced: synced}
}

// copyAdded copies the added tables from a snapshot of their own (see initcopy.Copier.Added).
func (s *session) copyAdded(ctx context.Context, tt string, added []target.Published) error {
	oids := make(map[uint32]bool, len(added))
	names := make([]string, len(added))
	for i, p := range added {
		oids[p.OID] = true
		names[i] = knownTable(p, 0).Name
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
	c := &initcopy.Copier{Leader: s.leader, TablesTable: tt, Slot: s.cfg.Source.Slot, Key: s.key, Truncate: s.cfg.CopyTruncate,
		Log: s.log, Registry: s.reg, Stats: &s.stats.Counters, Host: h}
	rows, err := c.Added(ctx, tg, ts.Session, cp)
	if err != nil {
		if _, ok := errors.AsType[*target.ChangeError](err); ok {
			err = h.MappingError(err)
		}
		return fmt.Errorf("apply: copying the tables added to the publications (%s): %w", list, err)
	}
	for _, t := range ts.Session.Tables() {
		s.tables.known[t.OID] = true
		s.tables.sync(t.OID, cp)
	}
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
	if rels := t.Described(); len(rels) > 0 {
		for _, r := range rels {
			if err := s.tables.seen(s, r.RelationID, r.Namespace, r.Name); err != nil {
				return err
			}
		}
	}
	at := &s.tables
	if at.syncTo == 0 || t.Part != reorderbuffer.Whole || t.CommitLSN >= at.syncTo {
		return nil
	}
	commit := t.CommitLSN
	t.Filter(func(id uint32) bool {
		cp, ok := at.syncs[id]
		return !ok || commit >= cp
	})
	return nil
}

// published takes the Feed's listing of the published tables, while the session streams: a table
// the session does not know ends it (see admit).
func (s *session) published(tables []changefeed.TableRef) {
	for _, t := range tables {
		if err := s.tables.seen(s, t.OID, t.Schema, t.Name); err != nil {
			s.cancel(err)
			return
		}
	}
}

// seen takes up a published table (schema.name, OID oid) that the stream describes or a listing
// shows: nothing if the session knows it, or follows no tables; with NewTablesStream, or one of
// the Applier's own tables, it is known from now on; otherwise the error that ends the session.
func (at *addedTables) seen(s *session, oid uint32, schema, name string) error {
	at.mu.Lock()
	defer at.mu.Unlock()
	if at.known == nil || at.known[oid] {
		return nil
	}
	display := pgsession.DisplayIdent(schema) + "." + pgsession.DisplayIdent(name)
	own := at.own[pgsession.QuoteQualified(schema, name)]
	if s.cfg.NewTables == changefeed.NewTablesStream || own {
		at.known[oid] = true
		if !own {
			s.streamOnly(oid, display)
		}
		return nil
	}
	return &tablesAddedError{table: display}
}
