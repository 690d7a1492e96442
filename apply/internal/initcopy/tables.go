package initcopy

import (
	"context"
	"log/slog"
	"sync"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/snapshot"
)

// Tables is what a session knows of the published tables: the tables table's record of those
// the target holds whole (target.KnownTable), the tables it copies because they were added to the
// publications since (Added), and the consistent points of those copies, before which the
// stream leaves out their changes (Keep). Start runs before the session streams; Seen and Keep
// run while it streams, Seen from the leader and from the publication check at once.
type Tables struct {
	Leader *target.Conn
	Table  string             // the tables table, quoted
	Key    target.ProgressKey // its rows' slot and source system
	Own    map[string]bool    // the Applier's own tables, quoted (target.Conn.OwnTables): never copied
	// StreamOnly: tables added are not copied, their changes applied from then on
	// (changefeed.NewTablesStream); StreamOnlyOption names the option in the log line that says so.
	StreamOnly       bool
	StreamOnlyOption string
	Log              *slog.Logger

	syncs  map[uint32]decoding.LSN // tables copied after they were added, with a consistent point past the session's start
	syncTo decoding.LSN            // the latest of syncs

	mu     sync.Mutex
	known  map[uint32]bool // the tables the target holds whole; nil: not followed this session
	warned map[uint32]bool // StreamOnly: the tables the log named already
}

// AddedError ends a session that met a table added to the publications after it started (in
// the stream, or listed by the publication check): the next session copies it at once.
type AddedError struct{ Table string }

func (e *AddedError) Error() string {
	return "apply: table " + e.Table + " was added to the publications: starting the session over to copy it"
}

// Retryable reports true: the next session copies the table.
func (e *AddedError) Retryable() bool { return true }

// Start reads the tables table and compares it with published, the publications' tables as the
// session found them (nil when they could not be listed): a slot with no record records them
// all; tables no longer published are forgotten, with a log line; tables added are returned, to
// copy (see Added and Copied), or, with StreamOnly (and the Applier's own tables), recorded. The
// tables copied earlier whose consistent point is past resume are left out of the stream's
// transactions before it (Keep).
func (ts *Tables) Start(ctx context.Context, published []target.Published, resume decoding.LSN) ([]target.Published, error) {
	rows, recorded, err := ts.Leader.ReadTables(ctx, ts.Table, ts.Key)
	if err != nil {
		return nil, err
	}
	if !recorded {
		if published == nil {
			return nil, nil // recorded by a later session
		}
		all := make([]target.KnownTable, len(published))
		for i, p := range published {
			all[i] = knownTable(p)
		}
		if err := ts.Leader.WithTxn(ctx, true, func() error {
			return ts.Leader.RecordTables(ctx, ts.Table, ts.Key, all, true)
		}); err != nil {
			return nil, err
		}
		ts.Log.Info("recorded the published tables as whole on the target: a table added to the publications from now on "+
			"is copied before its changes are applied", "slot", ts.Key.Slot, "tables", len(all), "table", ts.Table)
		ts.Known(all)
		return nil, nil
	}
	ts.Known(rows)
	for _, k := range rows {
		if k.Synced > resume {
			ts.sync(k.OID, k.Synced)
		}
	}
	if published == nil {
		return nil, nil
	}
	if err := ts.forget(ctx, rows, published); err != nil {
		return nil, err
	}
	var added []target.Published
	var stream []target.KnownTable
	for _, p := range published {
		switch own := ts.Own[p.Name.Quoted()]; {
		case ts.known[p.OID]:
		case own || ts.StreamOnly:
			k := knownTable(p)
			stream = append(stream, k)
			ts.known[p.OID] = true
			if !own {
				ts.streamOnly(p.OID, k.Name)
			}
		default:
			added = append(added, p)
		}
	}
	if len(stream) > 0 {
		if err := ts.Leader.RecordTables(ctx, ts.Table, ts.Key, stream, false); err != nil {
			return nil, err
		}
	}
	return added, nil
}

// forget deletes the rows of the recorded tables that are no longer published: their changes
// stop coming; added again, they are copied again.
func (ts *Tables) forget(ctx context.Context, rows []target.KnownTable, published []target.Published) error {
	now := make(map[uint32]bool, len(published))
	for _, p := range published {
		now[p.OID] = true
	}
	var gone []uint32
	for _, k := range rows {
		if !now[k.OID] {
			gone = append(gone, k.OID)
			ts.Log.Info("table no longer published: its changes stop arriving, its rows stay on the target", "table", k.Name,
				"slot", ts.Key.Slot)
			delete(ts.known, k.OID)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	return ts.Leader.ForgetTables(ctx, ts.Table, ts.Key.Slot, gone)
}

// Known takes tables as those the session knows (the initial copy's, once it is done).
func (ts *Tables) Known(tables []target.KnownTable) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.known = make(map[uint32]bool, len(tables))
	for _, k := range tables {
		ts.known[k.OID] = true
	}
}

// Copied notes tables copied (Added) at consistent point cp.
func (ts *Tables) Copied(tables []*snapshot.Table, cp decoding.LSN) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, t := range tables {
		ts.known[t.OID] = true
		ts.sync(t.OID, cp)
	}
}

// sync notes that the stream leaves out table oid's changes of the transactions that commit
// before cp.
func (ts *Tables) sync(oid uint32, cp decoding.LSN) {
	if ts.syncs == nil {
		ts.syncs = map[uint32]decoding.LSN{}
	}
	ts.syncs[oid] = cp
	ts.syncTo = max(ts.syncTo, cp)
}

// SyncTo is the latest consistent point of the copies the stream must leave changes out before
// (0 if none): past the session's start, it applies as Buffered, whose transactions come whole.
func (ts *Tables) SyncTo() decoding.LSN { return ts.syncTo }

// Keep returns the relations to keep of a whole transaction that commits at commit (for
// reorderbuffer.Txn.Filter): all but the tables whose copy's consistent point is past commit;
// nil when it keeps all. The tables of the copies are set before the session streams.
func (ts *Tables) Keep(commit decoding.LSN) func(relationID uint32) bool {
	if ts.syncTo == 0 || commit >= ts.syncTo {
		return nil
	}
	return func(id uint32) bool {
		cp, ok := ts.syncs[id]
		return !ok || commit >= cp
	}
}

// Seen takes up a published table (schema.name, OID oid) that the stream describes or the
// publication check lists: nothing if the session knows it or follows no tables; with
// StreamOnly, or one of the Applier's own tables, it is known from now on; otherwise an
// *AddedError, which ends the session.
func (ts *Tables) Seen(oid uint32, schema, name string) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.known == nil || ts.known[oid] {
		return nil
	}
	display := pgsession.DisplayIdent(schema) + "." + pgsession.DisplayIdent(name)
	own := ts.Own[pgsession.QuoteQualified(schema, name)]
	if ts.StreamOnly || own {
		ts.known[oid] = true
		if !own {
			ts.streamOnly(oid, display)
		}
		return nil
	}
	return &AddedError{Table: display}
}

// streamOnly logs, once per session, that a table added to the publications is not copied.
func (ts *Tables) streamOnly(oid uint32, name string) {
	if ts.warned[oid] {
		return
	}
	if ts.warned == nil {
		ts.warned = map[uint32]bool{}
	}
	ts.warned[oid] = true
	ts.Log.Warn("table added to the publications: its changes are applied from now on, its rows from before are not copied "+
		"("+ts.StreamOnlyOption+")", "table", name, "slot", ts.Key.Slot)
}

// knownTable returns the tables table's row of p, not copied after it was added.
func knownTable(p target.Published) target.KnownTable {
	return target.KnownTable{OID: p.OID, Name: Display(p.Name)}
}

// Display is a table's name as the log and the tables table show it.
func Display(n target.TableName) string {
	return pgsession.DisplayIdent(n.Schema) + "." + pgsession.DisplayIdent(n.Name)
}
