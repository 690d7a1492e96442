package changefeed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// NewTables says what a Feed that copies (Start: StartCopy) does with a table added to its
// publications while it streams.
type NewTables int

const (
	// NewTablesCopy copies the table's rows, in a snapshot of their own, before its changes:
	// the consumer holds the table whole, each row once.
	NewTablesCopy NewTables = iota
	// NewTablesStream streams the table's changes from where the stream is, as PostgreSQL's
	// subscriptions do without REFRESH PUBLICATION: the rows it held before are not delivered.
	NewTablesStream
)

func (n NewTables) String() string {
	switch n {
	case NewTablesCopy:
		return "copy"
	case NewTablesStream:
		return "stream"
	}
	return fmt.Sprintf("NewTables(%d)", int(n))
}

// tableSync is what a Feed knows of the published tables while it streams.
type tableSync struct {
	// Under Feed.mu: stored with every position.
	known   map[uint32]bool // the tables the consumer knows; nil when not yet known
	syncing *TableSync      // the table whose copy began, until it is complete
	stored  decoding.LSN    // the last EndLSN stored with CopyDone
	loaded  *TableSync      // the loaded position's Sync: reset, then copied again

	// follow's own.
	dropping map[uint32]TableRef // tables whose changes the stream drops: waiting for a copy, or in one
	queue    []TableRef          // those waiting, in order; the first is the one being prepared
	job      *syncJob

	// Between follow and the watch or a job's goroutine.
	mu       sync.Mutex
	notified bool                     // a listing or a prepared job waits for follow
	listing  []catalog.PublishedTable // the watch's last listing, nil once taken
	wctx     context.Context          // Next's context while follow tracks tables: notify ends it
	wcancel  context.CancelFunc
}

// knownList returns the known tables, sorted; nil when unknown. Feed.mu is held.
func (ts *tableSync) knownList() []uint32 {
	if ts.known == nil {
		return nil
	}
	out := make([]uint32, 0, len(ts.known))
	for oid := range ts.known {
		out = append(out, oid)
	}
	slices.Sort(out)
	return out
}

// load takes the tables of a loaded position. Feed.mu is held.
func (ts *tableSync) load(pos Position) {
	ts.known = nil
	if pos.Tables != nil {
		ts.known = make(map[uint32]bool, len(pos.Tables))
		for _, oid := range pos.Tables {
			ts.known[oid] = true
		}
	}
	ts.syncing, ts.loaded, ts.stored = nil, pos.Sync, pos.EndLSN
}

// copied takes the tables of an initial copy. Feed.mu is held.
func (ts *tableSync) copied(tables []*snapshot.Table) {
	ts.known = make(map[uint32]bool, len(tables))
	for _, t := range tables {
		ts.known[t.OID] = true
	}
	ts.syncing, ts.loaded = nil, nil
}

// notify wakes follow: a listing or a prepared copy waits.
func (ts *tableSync) notify() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.notified = true
	if ts.wcancel != nil {
		ts.wcancel()
	}
}

// offer hands follow the watch's listing of the published tables.
func (ts *tableSync) offer(tables []catalog.PublishedTable) {
	ts.mu.Lock()
	ts.listing = tables
	ts.mu.Unlock()
	ts.notify()
}

// take returns the listing the watch offered, if any, and clears the notification.
func (ts *tableSync) take() []catalog.PublishedTable {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	l := ts.listing
	ts.listing, ts.notified = nil, false
	return l
}

// nextCtx returns the context follow waits for the next transaction with: one that notify
// ends, so that follow turns to a prepared copy or a listing at once.
func (ts *tableSync) nextCtx(ctx context.Context) context.Context {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.wctx == nil || ts.wctx.Err() != nil {
		ts.wctx, ts.wcancel = context.WithCancel(ctx)
	}
	if ts.notified {
		ts.wcancel()
	}
	return ts.wctx
}

// stop ends the wait context.
func (ts *tableSync) stop() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.wcancel != nil {
		ts.wcancel()
	}
	ts.wctx, ts.wcancel = nil, nil
}

// tracksTables reports whether follow tracks the published tables: a Feed that copies and
// reads the stream itself. (A Follower tracks them itself, and a stream with no copy has no
// rows of its tables to begin with.)
func (f *Feed) tracksTables() bool { return f.cfg.Follower == nil && f.cfg.Start == StartCopy }

// copiesNewTables reports whether follow copies the tables added to the publications.
func (f *Feed) copiesNewTables() bool { return f.tracksTables() && f.cfg.NewTables == NewTablesCopy }

// tableListTimeout bounds the listing of the published tables before the stream is read.
const tableListTimeout = 30 * time.Second

// syncStart prepares follow's tracking of the tables: the known ones (the publications' tables
// when the position had none), the reset and the new copy of a table whose copy was cut short,
// and the copy of the published tables the consumer does not know.
func (f *Feed) syncStart(ctx context.Context) error {
	if !f.tracksTables() {
		return nil
	}
	// What an earlier attempt of this Run queued is taken up again from the stored position
	// and the listing below: queued twice, a table would be copied twice.
	f.ts.dropping, f.ts.queue = map[uint32]TableRef{}, nil
	lctx, cancel := context.WithTimeout(ctx, tableListTimeout)
	tables, lerr := f.publishedOIDs(lctx)
	cancel()
	f.mu.Lock()
	unknown := f.ts.known == nil
	if unknown && lerr == nil {
		f.ts.known = map[uint32]bool{}
		for _, t := range tables {
			f.ts.known[t.OID] = true
		}
	}
	loaded, state := f.ts.loaded, f.state
	f.ts.loaded = nil
	f.mu.Unlock()
	if unknown && lerr != nil {
		return fmt.Errorf("changefeed: listing the published tables (the stored position has none): %w", lerr)
	}
	if unknown {
		f.log.Info("the stored position lists no tables: taking the publications' tables as known", "tables", len(tables),
			"slot", f.cfg.Replication.Slot)
	}
	if loaded != nil {
		t := loaded.Table
		f.log.Warn("the copy of a table added to the publications did not finish: resetting it and copying it again",
			"table", t.String(), "began_at", loaded.From, "slot", f.cfg.Replication.Slot)
		if err := f.handle(ctx, &Batch{Kind: TableReset, Worker: StreamWorker, State: state, Table: &t, f: f}, nil); err != nil {
			return err
		}
		f.queueCopy(t)
	}
	if lerr != nil {
		f.log.Debug("listing the published tables", "err", lerr)
		return nil
	}
	return f.newTables(ctx, tables)
}

// publishedOIDs lists the tables of the Feed's publications with their OIDs.
func (f *Feed) publishedOIDs(ctx context.Context) ([]catalog.PublishedTable, error) {
	cat, err := f.catalog()
	if err != nil {
		return nil, err
	}
	return cat.PublishedOIDs(ctx, f.cfg.Replication.Publications)
}

// newTables takes up the listed tables that the consumer does not know.
func (f *Feed) newTables(ctx context.Context, tables []catalog.PublishedTable) error {
	for _, t := range tables {
		f.mu.Lock()
		known := f.ts.known[t.OID]
		f.mu.Unlock()
		if _, ok := f.ts.dropping[t.OID]; !known && !ok {
			if err := f.detected(ctx, TableRef{OID: t.OID, Schema: t.Schema, Name: t.Name}); err != nil {
				return err
			}
		}
	}
	return nil
}

// detected takes up a table the consumer does not know: it is copied, or, with
// NewTablesStream, known from now on. A table to copy goes to the store's TableChecker first,
// before anything of the transaction that shows it is handled: its changes in that transaction
// reach the handler through the copy.
func (f *Feed) detected(ctx context.Context, t TableRef) error {
	if !f.copiesNewTables() {
		f.mu.Lock()
		f.ts.known[t.OID] = true
		f.mu.Unlock()
		f.log.Warn("table added to the publications: its changes are delivered from now on, its rows from before are not "+
			"copied (NewTables is NewTablesStream: -copy-new-tables=false)", "table", t.String(), "slot", f.cfg.Replication.Slot)
		return nil
	}
	if tc, ok := f.store.(TableChecker); ok {
		if err := tc.CheckTables(ctx, []catalog.TableName{{Schema: t.Schema, Name: t.Name}}); err != nil {
			return err
		}
	}
	f.log.Info("table added to the publications: copying its rows, then streaming its changes", "table", t.String(),
		"slot", f.cfg.Replication.Slot)
	f.queueCopy(t)
	return nil
}

// queueCopy queues the copy of t; its changes are dropped from the stream from now on.
func (f *Feed) queueCopy(t TableRef) {
	f.ts.dropping[t.OID] = t
	f.ts.queue = append(f.ts.queue, t)
}

// admit takes up the relations txn describes that the consumer does not know, and filters out
// the changes of the tables being copied. It reports whether anything is left for the handler.
func (f *Feed) admit(ctx context.Context, txn *reorderbuffer.Txn) (bool, error) {
	for _, r := range txn.Described() {
		f.mu.Lock()
		known := f.ts.known[r.RelationID]
		f.mu.Unlock()
		if _, ok := f.ts.dropping[r.RelationID]; !known && !ok {
			if err := f.detected(ctx, TableRef{OID: r.RelationID, Schema: r.Namespace, Name: r.Name}); err != nil {
				return false, err
			}
		}
	}
	if len(f.ts.dropping) == 0 {
		txn.Filter(nil)
		return true, nil
	}
	drop := f.ts.dropping
	txn.Filter(func(id uint32) bool { _, ok := drop[id]; return !ok })
	return hasContent(txn), nil
}

// hasContent reports whether txn yields a change or a message (or an error, for the handler to
// see).
func hasContent(txn *reorderbuffer.Txn) bool {
	for ch, err := range txn.Changes() {
		if err != nil {
			return true
		}
		switch ch.Msg.(type) {
		case *decoding.Relation, *decoding.DataType:
		default:
			return true
		}
	}
	return false
}

// syncTables is follow's turn, between two units, to take up the tables: those a listing
// shows, the start of the next copy's preparation, and the copy that is prepared, once the
// stored position is at or past its consistent point. flush commits the open unit, if any.
func (f *Feed) syncTables(ctx context.Context, s *replication.Stream, flush func() error) error {
	if !f.tracksTables() {
		return nil
	}
	if l := f.ts.take(); l != nil {
		if err := f.newTables(ctx, l); err != nil {
			return err
		}
	}
	if f.ts.job == nil && len(f.ts.queue) > 0 {
		f.ts.job = f.prepareSync(ctx, f.ts.queue[0])
	}
	j := f.ts.job
	if j == nil {
		return nil
	}
	select {
	case <-j.done:
	default:
		return nil
	}
	if j.err != nil {
		f.ts.job = nil
		return fmt.Errorf("changefeed: preparing the copy of the added table %s: %w", j.table, j.err)
	}
	if !j.empty {
		if err := flush(); err != nil {
			return err
		}
		f.mu.Lock()
		h := f.ts.stored
		f.mu.Unlock()
		if h < j.cp {
			// The stream has not reached the copy's consistent point yet: what it delivers of
			// the table up to there is the copy's.
			s.AdvanceSoon()
			return nil
		}
		if err := f.runSync(ctx, j, h); err != nil {
			return err
		}
	} else {
		f.log.Info("the added table is not copied (no longer published, or not selected by Copy.Tables)", "table", j.table.String())
		f.mu.Lock()
		f.ts.known[j.table.OID] = true
		f.mu.Unlock()
	}
	delete(f.ts.dropping, j.table.OID)
	f.ts.queue = f.ts.queue[1:]
	f.ts.job = nil
	return nil
}

// syncJob is the preparation of a table's copy, made on a goroutine of its own while follow
// goes on streaming: a temporary slot with an exported snapshot, the copy's connections in it,
// and the slot's stream from its consistent point.
type syncJob struct {
	table  TableRef
	done   chan struct{} // closed when prepared or failed
	cancel context.CancelFunc
	err    error

	empty  bool // nothing to copy: the table is not published (any more), or not selected
	cp     decoding.LSN
	sess   *snapshot.Session
	stream *replication.Stream
}

// close releases what the job holds: the copy's connections and the temporary slot's stream
// (which drops the slot).
func (j *syncJob) close(ctx context.Context) {
	j.cancel()
	<-j.done
	if j.sess != nil {
		j.sess.Close(ctx)
		j.sess = nil
	}
	if j.stream != nil {
		j.stream.Close(ctx)
		j.stream = nil
	}
}

// prepareSync starts preparing the copy of t. A failure ends follow's attempt (syncTables
// returns it), and Run's next attempt, if another can cure it, takes the table up again: the
// one restart loop (loop.go) is the only one.
func (f *Feed) prepareSync(ctx context.Context, t TableRef) *syncJob {
	jctx, cancel := context.WithCancel(ctx)
	j := &syncJob{table: t, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer f.ts.notify()
		defer close(j.done)
		j.err = f.prepare(jctx, j)
	}()
	return j
}

// prepare takes the table's snapshot on a temporary slot of its own, and starts the slot's
// stream from its consistent point.
func (f *Feed) prepare(ctx context.Context, j *syncJob) error {
	oid := j.table.OID
	ts, err := OpenTableSnapshot(ctx, f.cfg.Replication, f.cfg.Copy, func(t *snapshot.Table) bool { return t.OID == oid })
	if err != nil {
		return err
	}
	if len(ts.Session.Tables()) == 0 {
		ts.Close(ctx)
		j.empty = true
		return nil
	}
	stream, err := ts.Stream(ctx)
	if err != nil {
		ts.Close(context.WithoutCancel(ctx))
		return err
	}
	j.sess, j.stream, j.cp = ts.Session, stream, ts.ConsistentPoint
	return nil
}

// TableSnapshot is a snapshot of some published tables taken on a temporary slot of its own:
// the way to copy tables that join a stream already running. Its rows are those of the
// transactions whose commit record begins before ConsistentPoint; every later commit is the
// stream's. A stream already past ConsistentPoint holds the table's changes after the copy; one
// behind it must leave out the table's changes of the transactions that commit before it.
type TableSnapshot struct {
	// Session reads the tables; its connections are in the slot's exported snapshot.
	Session *snapshot.Session
	// ConsistentPoint is the temporary slot's: the snapshot holds every transaction whose
	// commit record begins before it, and none after.
	ConsistentPoint decoding.LSN

	conn *replication.Conn // the temporary slot's: closing it drops the slot
}

// OpenTableSnapshot creates a temporary slot with an exported snapshot on a replication
// connection of rcfg (its slot name followed by "_sync_" and a random suffix, its
// application_name "pgreorder-tablesync", so that a synchronous source never takes it for its
// standby), and opens a snapshot.Session of scfg in it for the published tables keep selects
// (and scfg.Tables, when set). scfg's connection, publications and binary values default to
// rcfg's, as a Feed's copy does. Session.Tables is empty when no published table is selected.
// The connection is a consumer's side connection (replication.Reconnect): it logs neither the
// published tables nor the failover settings. The caller closes it.
func OpenTableSnapshot(ctx context.Context, rcfg replication.Config, scfg snapshot.Config, keep func(*snapshot.Table) bool) (_ *TableSnapshot, err error) {
	base := rcfg
	rcfg.Slot = syncSlotName(rcfg.Slot)
	rcfg.TemporarySlot, rcfg.CreateSlot, rcfg.TwoPhase, rcfg.Failover = true, false, false, false
	rcfg.Buffer.SkipThrough = 0
	rcfg.Buffer.HandOutAdvances = true
	rcfg.Reconnect.Disabled = true // the slot goes with its connection
	before := rcfg.BeforeConnect
	rcfg.BeforeConnect = func(ctx context.Context, pc *pgconn.Config) error {
		if before != nil {
			if err := before(ctx, pc); err != nil {
				return err
			}
		}
		if pc.RuntimeParams == nil {
			pc.RuntimeParams = map[string]string{}
		}
		pc.RuntimeParams["application_name"] = "pgreorder-tablesync"
		return nil
	}
	conn, err := replication.Reconnect(ctx, rcfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
	if err != nil {
		return nil, err
	}
	if scfg.ConnString == "" && scfg.ConnConfig == nil {
		scfg.ConnString, scfg.ConnConfig = base.ConnString, base.ConnConfig
		if scfg.BeforeConnect == nil {
			scfg.BeforeConnect = base.BeforeConnect
		}
	}
	if len(scfg.Publications) == 0 {
		scfg.Publications = base.Publications
	}
	if base.Binary {
		scfg.Binary = true
	}
	if scfg.Logger == nil {
		scfg.Logger = base.Logger
	}
	if scfg.Name == "" {
		scfg.Name = "added tables copy"
	}
	pick := scfg.Tables
	scfg.Tables = func(t *snapshot.Table) bool { return keep(t) && (pick == nil || pick(t)) }
	sess, err := snapshot.Open(ctx, scfg, snap)
	if err != nil {
		return nil, fmt.Errorf("changefeed: copying an added table: %w", err)
	}
	return &TableSnapshot{Session: sess, ConsistentPoint: snap.ConsistentPoint, conn: conn}, nil
}

// Stream starts the temporary slot's stream from its consistent point; the stream owns the
// slot from then on (closing it drops the slot).
func (t *TableSnapshot) Stream(ctx context.Context) (*replication.Stream, error) {
	if t.conn == nil {
		return nil, errors.New("changefeed: the table snapshot's slot is closed or streaming already")
	}
	conn := t.conn
	t.conn = nil
	return conn.StartStreaming(ctx)
}

// Close closes the snapshot's connections and drops the temporary slot (unless Stream handed
// it to a stream). It is safe to call twice.
func (t *TableSnapshot) Close(ctx context.Context) {
	if t.Session != nil {
		t.Session.Close(ctx)
		t.Session = nil
	}
	if t.conn != nil {
		t.conn.Close(ctx)
		t.conn = nil
	}
}

// syncSlotName names the temporary slot of a table's copy: unique, so that the slot of a
// process that just died is never in the way.
func syncSlotName(slot string) string {
	var rnd [6]byte
	rand.Read(rnd[:])
	if len(slot) > 40 {
		slot = slot[:40]
	}
	return slot + "_sync_" + hex.EncodeToString(rnd[:])
}

// catchUpPoll is how long the catch-up waits for the temporary slot's stream before it asks
// the server where it is.
const catchUpPoll = 200 * time.Millisecond

// runSync copies the prepared table while the stream waits at h, the position stored last (at
// or past the copy's consistent point): it stores that the copy began at h, hands the handler
// the table's rows, then its changes of the transactions the temporary slot's stream holds up
// to h, and stores that the table is known.
func (f *Feed) runSync(ctx context.Context, j *syncJob, h decoding.LSN) error {
	defer j.close(context.WithoutCancel(ctx))
	t := j.table
	f.mu.Lock()
	f.ts.syncing = &TableSync{Table: t, From: h}
	f.mu.Unlock()
	if err := f.advance(ctx, h); err != nil {
		return err
	}
	start := time.Now()
	f.log.Info("copying an added table", "table", t.String(), "consistent_point", j.cp, "stream_at", h)
	res, err := j.sess.Run(ctx, func(ctx context.Context, ch *snapshot.Chunk) error {
		return f.handle(ctx, &Batch{Kind: Snapshot, Chunk: ch, Worker: ch.Worker, Table: &t, f: f}, nil)
	})
	if err != nil {
		return fmt.Errorf("changefeed: copying the added table %s: %w", t, err)
	}
	if err := j.sess.Close(ctx); err != nil {
		f.log.Warn("closing the copy's connections", "err", err)
	}
	j.sess = nil
	// The changes up to h and the end of the copy commit in one unit: a store whose units are
	// transactions (Kafka's) shows the table's copy whole or not at all.
	u, err := f.store.Begin(ctx, StreamWorker)
	if err != nil {
		return err
	}
	n, err := f.catchUp(ctx, j, h, u)
	if err != nil {
		f.rollback(ctx, u)
		return fmt.Errorf("changefeed: the changes of the added table %s up to %s: %w", t, h, err)
	}
	f.mu.Lock()
	f.ts.known[t.OID] = true
	f.ts.syncing = nil
	f.mu.Unlock()
	pos := f.position(true, h)
	if err := u.Commit(ctx, &pos); err != nil {
		f.rollback(ctx, u)
		return err
	}
	f.log.Info("added table copied; streaming its changes", "table", t.String(), "rows", res.Rows, "transactions", n,
		"elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// catchUp hands the handler, in the unit u, the table's changes of the transactions that the
// temporary slot's stream holds and that end at or before h, and returns how many it handed. It ends at the first
// transaction ending after h, or once the stream has received the WAL past h with nothing
// pending.
func (f *Feed) catchUp(ctx context.Context, j *syncJob, h decoding.LSN, u Unit) (int, error) {
	if h <= j.cp {
		return 0, nil // nothing ends between the consistent point and h
	}
	s, t, n := j.stream, j.table, 0
	s.AdvanceSoon()
	for {
		txn, err := s.NextBefore(ctx, time.Now().Add(catchUpPoll))
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			if s.Progress().Received >= h && !s.Ready() {
				return n, nil
			}
			s.AdvanceSoon()
			continue
		}
		if err != nil {
			return n, err
		}
		if txn.EndLSN > h || (txn.Part == reorderbuffer.Advance && txn.EndLSN >= h) {
			return n, nil
		}
		if txn.Part != reorderbuffer.Advance && !txn.NonTransactional {
			txn.Filter(func(id uint32) bool { return id == t.OID })
			if hasContent(txn) {
				if err := f.h(ctx, &Batch{Kind: Transaction, Txn: txn, Worker: StreamWorker, Unit: u, Table: &t, f: f}); err != nil {
					return n, &stopError{err}
				}
				n++
			}
		}
		if err := s.Ack(txn); err != nil {
			return n, err
		}
	}
}

// closeSync releases a copy's preparation that follow leaves behind.
func (f *Feed) closeSync(ctx context.Context) {
	f.ts.stop()
	if j := f.ts.job; j != nil {
		j.close(context.WithoutCancel(ctx))
		f.ts.job = nil
	}
}
