package changefeed

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

var discardLogger = slog.New(slog.DiscardHandler)

// Config describes a consumer. Replication's connection, Slot and Publications are required;
// every other field has a working zero value.
type Config struct {
	// Replication configures the stream: the connection, Slot, Publications, Binary,
	// TwoPhase, the reorder buffer's WorkMem... Reconnect is the policy of Run's attempts (see
	// Run): the streams Run starts do not reconnect by themselves (Reconnect.Disabled is set on
	// their copy), Run starts a new attempt instead. Buffer.HandOutAdvances is set by Run, and
	// Buffer.SkipThrough from the store when it holds a position. With StartCopy, Run also makes
	// the slot itself (CreateSlot and TemporarySlot are not used); with StartStream they say
	// whether a missing slot is created, and SkipThrough where a run with no stored position
	// starts.
	Replication replication.Config
	// Copy configures the initial copy: Workers, ChunkSize, Tables. Its connection,
	// Publications, Binary and Logger default to Replication's.
	Copy snapshot.Config
	// Logger receives what Run does (the copy, resumption) and is Replication's and Copy's
	// Logger where they have none; nil logs nothing.
	Logger *slog.Logger
	// Start says how a run with no position stored begins: with the initial copy (the zero
	// value), or with the stream alone.
	Start Start
	// Follower, if set, reads the stream in place of Run's loop of one transaction at a time
	// (see Follower). Replication.Buffer.Incremental is allowed only with a Follower.
	Follower Follower
	// PublicationCheck is how often Run lists the publications' tables while it streams, to log
	// the tables added to a publication (the stream delivers their changes from then on; the rows
	// they held before are not copied) and those removed from it (their changes stop); 0 means
	// DefaultPublicationCheck, a negative value does not check. Each check is one query on the
	// connection of the Feed's catalog reader (Batch.Catalog).
	PublicationCheck time.Duration
	// Copier, if set, makes the initial copy in place of the Handler's Snapshot batches (see
	// Copier and InitialCopy). It records the copy's beginning and end itself, where Store.Load
	// reads them: a copy it began and did not finish as a Position with CopyDone false, a
	// finished one as CopyDone with the consistent point as EndLSN. A copy that fails is
	// discarded (its slot dropped and Copier.Discard called) and, when another attempt can cure
	// the failure, started over by Run's next attempt, as the Handler's copy is.
	Copier Copier
	// NewTables says what a Feed that copies (StartCopy) does with a table added to its
	// publications while it streams: copy its rows, then stream its changes (NewTablesCopy, the
	// zero value), or stream its changes only (NewTablesStream). See "Tables added to the
	// publication" in the package documentation. A Follower takes up added tables itself.
	NewTables NewTables
	// StartTimeout bounds how long a run that has not yet reached both the store and the source
	// keeps trying: its first attempts are retried (a server still starting) until StartTimeout
	// has passed since Run began, and Run then stops with a *NotStartedError that names the side
	// and the last error. Once an attempt reached both, a failure that another attempt can cure is
	// retried for as long as ctx allows. 0 means DefaultStartTimeout; a negative value retries as
	// long as ctx allows.
	StartTimeout time.Duration
}

// Follower is a consumer that reads the stream itself, for what a Handler that gets one whole
// transaction at a time cannot do: take a streamed transaction part by part as it arrives
// (replication.Config.Buffer.Incremental), apply several at once, acknowledge on a schedule of
// its own. Run hands it the stream once it has started (after the copy, or resumed after the
// stored position, when the Handler has handled the Reset or Resume batch) in place of its own
// loop; from then on the Follower stores what it handled where its Store's Load finds it, and
// acknowledges it (replication.Stream.Ack) only once that is durable. Idle advances
// (replication.Config.Buffer.HandOutAdvances, which Run sets) are the Follower's to store
// before it acknowledges them. Run closes the stream when Follow returns: nil ends Run with nil,
// an error ends the attempt, and Run decides on it as on any other (see Run). A Follower that
// must prepare each attempt, or hear how one ended, is a Restarter.
type Follower interface {
	Follow(ctx context.Context, s *replication.Stream) error
}

// Start says how a run with no position stored for the slot begins.
type Start int

const (
	// StartCopy copies the published tables, then streams from the copy's consistent point.
	StartCopy Start = iota
	// StartStream streams the slot from where it is, with no copy: from the slot's confirmed
	// position, or after Replication.Buffer.SkipThrough when it is set; Replication.CreateSlot
	// creates the slot if it does not exist (TemporarySlot, a temporary one). What the source
	// committed before the slot's position is not delivered. The handler gets a Reset batch
	// first, and Run stores the position it starts from (with CopyDone, there being no copy to
	// do); a later run resumes after the stored position as after a copy.
	StartStream
)

func (s Start) String() string {
	switch s {
	case StartCopy:
		return "copy"
	case StartStream:
		return "stream"
	}
	return fmt.Sprintf("Start(%d)", int(s))
}

// Kind says what a Batch holds.
type Kind int

const (
	// Reset is the first batch of a run that starts an initial copy: nothing the handler
	// delivered before for the slot counts any more (an earlier copy was cut short, or this is
	// the first run). It has no changes; its State is nil.
	Reset Kind = iota + 1
	// Resume is the first batch of a run that resumes after a complete copy: the handler's
	// durable output must be brought back to what it was when the stored position was committed,
	// described by State (what the handler set with SetState). It has no changes.
	Resume
	// Snapshot is a chunk of the initial copy: rows of one table as of the slot's consistent
	// point, as inserts (pgvalue.Change.Op is decoding.MsgInsert). Chunks are handled
	// concurrently, one per copy worker.
	Snapshot
	// Transaction is a streamed transaction, whole, committed after the consistent point.
	// Transactions are handled one at a time, in commit order.
	Transaction
	// TableReset says that the rows of Batch.Table the handler delivered since the stored
	// position's copy of that table began (Position.Sync) do not count: a copy of a table added
	// to the publications was cut short, and the table is copied again. The handler removes that
	// table's rows (or cuts its output back to State, which is the State stored when the copy
	// began). It has no changes.
	TableReset
)

func (k Kind) String() string {
	switch k {
	case Reset:
		return "reset"
	case Resume:
		return "resume"
	case Snapshot:
		return "snapshot"
	case Transaction:
		return "transaction"
	case TableReset:
		return "table-reset"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Batch is what the handler is given: a chunk of copied rows, a streamed transaction, or the
// Reset or Resume that starts a run. It is a pgvalue.Source: pgvalue.Decoder.Changes resolves
// copied and streamed rows alike.
type Batch struct {
	Kind Kind
	// Txn is the streamed transaction (Transaction only): CommitLSN, EndLSN, CommitTime, Xid...
	Txn *reorderbuffer.Txn
	// Chunk is the copied chunk (Snapshot only): its Table, its rows.
	Chunk *snapshot.Chunk
	// Worker is the copy worker that handles a Snapshot batch (0, 1, ...), StreamWorker for the
	// others: per-worker state (a decoder, a connection) can be kept by it.
	Worker int
	// Unit is the store's unit of work the batch commits with: the handler writes through it
	// where the store offers a way to (TableStore: Tx(b)).
	Unit Unit
	// State is the handler's state stored with the position (Resume only; SetState sets it),
	// to read, not to modify.
	State []byte
	// Table is the table added to the publications that the batch is about: set on its
	// TableReset, on the Snapshot batches of its copy, and on the Transaction batches that carry
	// its changes from the copy's consistent point to where the stream stood (which hold that
	// table's changes only); nil on every other batch.
	Table *TableRef

	f *Feed
}

// Changes yields the batch's messages, once, each with its relation and the schema at its
// position: inserts for a Snapshot batch (which must be read to the end), the transaction's
// messages for a Transaction, nothing for the others. A message and what it holds are valid
// until the next iteration step.
func (b *Batch) Changes() iter.Seq2[decoding.Change, error] {
	switch {
	case b.Txn != nil:
		return b.Txn.Changes()
	case b.Chunk != nil:
		return b.Chunk.Changes()
	}
	return func(func(decoding.Change, error) bool) {}
}

// SetState sets the handler's state that is stored with the next position (copied; at most
// MaxState bytes), for the Resume batch of a later run. Copy workers may call it concurrently;
// the last call wins.
func (b *Batch) SetState(p []byte) error {
	if len(p) > MaxState {
		return fmt.Errorf("%w: State of %d bytes, at most %d", ErrInvalidConfig, len(p), MaxState)
	}
	b.f.mu.Lock()
	b.f.state = append([]byte(nil), p...)
	b.f.mu.Unlock()
	return nil
}

// Catalog returns a reader of the source's catalog (the tables' keys, NOT NULL columns,
// defaults, enum labels: what Debezium-style events need beyond the stream), on the stream's
// connection settings. The Feed makes it on first use, shares it between batches, and closes it
// when Run returns.
func (b *Batch) Catalog() (*catalog.Reader, error) { return b.f.catalog() }

// ConsistentPoint returns, for a Snapshot batch, the LSN of the snapshot the rows were read in
// (the slot's consistent point), and 0 for the others.
func (b *Batch) ConsistentPoint() decoding.LSN {
	if b.Chunk == nil {
		return 0
	}
	return b.Chunk.ConsistentPoint()
}

// Handler handles one batch. A Snapshot batch must read every row. The position is stored (and
// the source acknowledged) only after the handler returned nil: an error stops Run, which returns
// it, and the batch is handled again by a later run (a chunk as part of a new copy).
type Handler func(ctx context.Context, b *Batch) error

// Feed is a consumer: Run copies, then streams, and makes another attempt after a failure that
// another attempt can cure. Progress, Stats and Activity read the current attempt's stream over
// what the streams of earlier attempts reported (counters that never go back; zero values before
// the first), and Reconnects counts the streams started again, from any goroutine: package
// metrics reads a Feed as it reads a replication.Stream.
type Feed struct {
	cfg   Config
	store Store
	h     Handler
	log   *slog.Logger

	mu      sync.Mutex
	stream  *replication.Stream // the current attempt's; nil between attempts
	state   []byte
	sysID   string
	running bool
	cat     *catalog.Reader
	ts      tableSync // tables added to the publications (tablesync.go)

	past      ended        // what the streams of ended attempts reported (readings.go)
	try       *attempt     // the attempt in progress (loop.go)
	streams   int          // streams started by Run's attempts
	restarts  int          // streams started after the first
	acked     decoding.LSN // the highest position a stream of this run acknowledged
	connected bool         // a connection reached the source (connectSource)
}

// catalog returns the Feed's catalog reader, made on first use.
func (f *Feed) catalog() (*catalog.Reader, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cat != nil {
		return f.cat, nil
	}
	rc := f.cfg.Replication
	cat, err := catalog.New(catalog.Config{ConnString: rc.ConnString, ConnConfig: rc.ConnConfig, BeforeConnect: rc.BeforeConnect, Logger: f.log})
	if err != nil {
		return nil, fmt.Errorf("changefeed: %w", err)
	}
	f.cat = cat
	return cat, nil
}

// checkTables hands the published tables to a store that vets them (TableChecker).
func (f *Feed) checkTables(ctx context.Context) error {
	tc, ok := f.store.(TableChecker)
	if !ok {
		return nil
	}
	cat, err := f.catalog()
	if err != nil {
		return err
	}
	f.side(SideSource)
	tables, err := cat.Published(ctx, f.cfg.Replication.Publications)
	if err != nil {
		return fmt.Errorf("changefeed: listing the published tables on the source: %w", err)
	}
	f.side(SideStore)
	return tc.CheckTables(ctx, tables)
}

// New returns a Feed that runs the consumer cfg describes over store, handing batches to h.
func New(cfg Config, store Store, h Handler) (*Feed, error) {
	switch {
	case store == nil:
		return nil, fmt.Errorf("%w: no Store", ErrInvalidConfig)
	case h == nil:
		return nil, fmt.Errorf("%w: no Handler", ErrInvalidConfig)
	case cfg.Replication.Slot == "":
		return nil, configerr.New(ErrInvalidConfig, field("Replication.Slot"), "is required")
	case cfg.Start != StartCopy && cfg.Start != StartStream:
		return nil, configerr.New(ErrInvalidConfig, field("Start"), fmt.Sprintf("%d is not valid: StartCopy or StartStream", int(cfg.Start)))
	case cfg.Replication.TemporarySlot && cfg.Start != StartStream:
		return nil, configerr.New(ErrInvalidConfig, field("Replication.TemporarySlot"), "is set: the copy's slot must outlive the connection (a temporary slot needs Start: StartStream)")
	case cfg.Replication.TemporarySlot && !isSlotStore(store):
		return nil, configerr.New(ErrInvalidConfig, field("Replication.TemporarySlot"), "is set: a stored position needs a slot that outlives the connection (a temporary slot goes with SlotStore)")
	case isSlotStore(store) && cfg.Start != StartStream:
		return nil, configerr.New(ErrInvalidConfig, field("Start"), "is StartCopy with a SlotStore, which keeps no position, so every run would copy again: use StartStream")
	case cfg.Replication.Buffer.Incremental && cfg.Follower == nil:
		return nil, configerr.New(ErrInvalidConfig, field("Replication.Buffer.Incremental"), "is set: the handler gets whole transactions (a Follower reads parts)")
	case cfg.NewTables != NewTablesCopy && cfg.NewTables != NewTablesStream:
		return nil, configerr.New(ErrInvalidConfig, field("NewTables"), fmt.Sprintf("%d is not valid: NewTablesCopy or NewTablesStream", int(cfg.NewTables)))
	case cfg.Copier != nil && cfg.Start != StartCopy:
		return nil, configerr.New(ErrInvalidConfig, field("Copier"), "is set with Start: StartStream, which makes no copy")
	}
	log := cfg.Logger
	if log == nil {
		log = discardLogger
	}
	if cfg.Replication.Logger == nil {
		cfg.Replication.Logger = cfg.Logger
	}
	if cfg.Copy.Logger == nil {
		cfg.Copy.Logger = cfg.Logger
	}
	// Idle advances come to follow, which stores them before they are confirmed.
	cfg.Replication.Buffer.HandOutAdvances = true
	return &Feed{cfg: cfg, store: store, h: h, log: log}, nil
}

// Run is New followed by Feed.Run.
func Run(ctx context.Context, cfg Config, store Store, h Handler) error {
	f, err := New(cfg, store, h)
	if err != nil {
		return err
	}
	return f.Run(ctx)
}

// lostConnection reports whether a handler's error is a lost connection rather than the
// handler's own decision: what reading a chunk's rows returns when the copy's connection is
// lost, and what a handler that writes to a database gets when its connection is (the one
// definition, retry.Lost).
func lostConnection(err error) bool { return retry.Lost(err) }

// stopError is a handler's error: it stops Run, which returns it as it is, unless it is a lost
// connection (see its Retryable).
type stopError struct{ err error }

func (e *stopError) Error() string { return e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// unwrapStop returns the handler's own error for a stopError, err otherwise. A chunk's error
// stays in the snapshot.ChunkError that names the chunk, which wraps it.
func unwrapStop(err error) error {
	if s, ok := err.(*stopError); ok {
		return s.err
	}
	return err
}

// follow hands the stream's transactions to the handler, one at a time, storing the end of
// each unit's last transaction after the handler returned, and acknowledging the unit's
// transactions once stored. A unit covers one transaction, or, for a Grouper store, the
// consecutive transactions the stream already holds, within the store's Grouping.
func (f *Feed) follow(ctx context.Context, s *replication.Stream) (err error) {
	var g Grouping
	if gr, ok := f.store.(Grouper); ok {
		g = gr.Grouping()
	}
	var (
		u     Unit                 // the open unit, nil when none is
		txns  []*reorderbuffer.Txn // its transactions, handled, to acknowledge once it commits
		from  decoding.LSN         // the end before its first transaction
		since time.Time            // when its first transaction was handled
		cost  time.Duration        // how long a unit's commit takes: a moving average, 0 before the first
	)
	defer func() {
		if u != nil {
			f.rollback(ctx, u)
		}
	}()
	defer f.closeSync(ctx)
	if err := f.syncStart(ctx); err != nil {
		return err
	}
	commit := func() error {
		pos := f.position(true, txns[len(txns)-1].EndLSN)
		start := time.Now()
		if err := u.Commit(ctx, &pos); err != nil {
			return err
		}
		cost = commitCost(cost, time.Since(start))
		u = nil
		for i, t := range txns {
			txns[i] = nil
			if err := s.Ack(t); err != nil {
				return err
			}
		}
		txns = txns[:0]
		return nil
	}
	flush := func() error {
		if u == nil {
			return nil
		}
		return commit()
	}
	tracks := f.tracksTables()
	last := f.Progress().Acked
	for {
		nctx := ctx
		if tracks {
			// Between units: the tables added to the publications (tablesync.go).
			if err := f.syncTables(ctx, s, flush); err != nil {
				return err
			}
			nctx = f.ts.nextCtx(ctx)
		}
		txn, err := s.Next(nctx)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if nctx.Err() != nil {
				continue // woken for the tables
			}
			return err
		}
		// An idle advance (the server's position moved with nothing for the handler: see
		// reorderbuffer.Config.HandOutAdvances) is stored without a batch, then acknowledged:
		// the slot never confirms a position the store does not have. So is a transaction
		// whose changes are all of tables being copied.
		skip := txn.Part == reorderbuffer.Advance
		if !skip && tracks {
			keep, err := f.admit(ctx, txn)
			if err != nil {
				return err
			}
			skip = !keep
		}
		if skip {
			if u != nil {
				if err := commit(); err != nil {
					return err
				}
			}
			if err := f.advance(ctx, txn.EndLSN); err != nil {
				return err
			}
			if err := s.Ack(txn); err != nil {
				return err
			}
			last = txn.EndLSN
			continue
		}
		if u == nil {
			if u, err = f.store.Begin(ctx, StreamWorker); err != nil {
				return err
			}
			from, since = last, time.Now()
		}
		if err := f.h(ctx, &Batch{Kind: Transaction, Txn: txn, Worker: StreamWorker, Unit: u, f: f}); err != nil {
			return &stopError{err}
		}
		txns = append(txns, txn)
		last = txn.EndLSN
		idle := false // the stream was found to hold nothing more
		if len(txns) < g.MaxTransactions &&
			(g.MaxBytes <= 0 || int64(last-from) < g.MaxBytes) &&
			g.open(time.Since(since), cost) {
			if s.Ready() {
				continue // the next transaction is there: it joins the unit
			}
			idle = true
		}
		if err := commit(); err != nil {
			return err
		}
		// With nothing more to handle, the server hears of what was just stored at once, not at
		// the next status update: a source commit that waits for this consumer (synchronous
		// replication) waits for the handler and the store's commit, no longer. Under a steady
		// flow the next transaction is already there, and no status is sent.
		if idle || !s.Ready() {
			if err := s.SendStatus(ctx, false); err != nil && !errors.Is(err, replication.ErrNotConnected) {
				return err // a lost connection, when the stream does not reconnect by itself
			}
		}
	}
}

// open reports whether a unit open for d may take another transaction, when a commit takes cost
// (0 before the first): within MaxDelay, and, with CommitMultiple, within that multiple of cost
// but at least MinDelay.
func (g Grouping) open(d, cost time.Duration) bool {
	if g.MaxDelay > 0 && d >= g.MaxDelay {
		return false
	}
	return g.CommitMultiple <= 0 || d < g.MinDelay || float64(d) < g.CommitMultiple*float64(cost)
}

// commitCost returns the moving average of the commits' durations, avg before the last one,
// which took d (avg is 0 before the first).
func commitCost(avg, d time.Duration) time.Duration {
	if avg == 0 {
		return d
	}
	return avg + (d-avg)/4
}

// handle runs the handler on b in a unit of the store and commits it, with the position end
// (CopyDone) when end is not nil.
func (f *Feed) handle(ctx context.Context, b *Batch, end *decoding.LSN) error {
	u, err := f.store.Begin(ctx, b.Worker)
	if err != nil {
		return err
	}
	b.Unit = u
	if err := f.h(ctx, b); err != nil {
		f.rollback(ctx, u)
		return &stopError{err}
	}
	var pos *Position
	if end != nil {
		p := f.position(true, *end)
		pos = &p
	}
	if err := u.Commit(ctx, pos); err != nil {
		f.rollback(ctx, u)
		return err
	}
	return nil
}

func (f *Feed) rollback(ctx context.Context, u Unit) {
	if err := u.Rollback(context.WithoutCancel(ctx)); err != nil {
		f.log.Debug("rolling back the store's unit", "err", err)
	}
}

// position returns the position to store.
func (f *Feed) position(copyDone bool, end decoding.LSN) Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	if copyDone {
		f.ts.stored = end
	}
	return Position{Slot: f.cfg.Replication.Slot, SystemID: f.sysID, CopyDone: copyDone, EndLSN: end, State: f.state,
		Tables: f.ts.knownList(), Sync: f.ts.syncing}
}

// resume starts the stream after the stored position, once the handler has handled Resume.
func (f *Feed) resume(ctx context.Context, rcfg replication.Config, pos Position) (*replication.Stream, error) {
	rcfg.CreateSlot, rcfg.TemporarySlot = false, false
	rcfg.Buffer.SkipThrough = pos.EndLSN
	f.mu.Lock()
	f.sysID, f.state = pos.SystemID, pos.State
	f.ts.load(pos)
	f.mu.Unlock()
	return f.open(ctx, rcfg, func(conn *replication.Conn) error {
		if id := conn.System().ID; pos.SystemID == "" {
			// A position stored without the server's identity (by an earlier release's output
			// file): this server's is stored with the next position.
			f.mu.Lock()
			f.sysID = id
			f.mu.Unlock()
		} else if id != pos.SystemID {
			return fmt.Errorf("%w: the position of slot %q was stored for the server with system identifier %s, this one is %s; "+
				"remove the stored position (and the consumer's output) to start again with a copy", ErrSystemMismatch, rcfg.Slot, pos.SystemID, id)
		}
		if _, ok := conn.Slot(); !ok {
			err := fmt.Errorf("changefeed: the store has a position for slot %q, but the slot does not exist: "+
				"the changes since are lost; remove the stored position (and the consumer's output) to start again with a copy: %w",
				rcfg.Slot, replication.ErrSlotNotFound)
			if tl := conn.System().Timeline; tl > 1 && !rcfg.Failover {
				// A promoted standby keeps only the slots created for failover.
				return configerr.WithHint(err, "; ", "the server is on timeline %d: if it is a promoted standby, the slot was not "+
					"created for failover (%s), and the standby kept no copy of it", tl, field("Replication.Failover"))
			}
			return err
		}
		return f.handle(ctx, &Batch{Kind: Resume, Worker: StreamWorker, State: pos.State, f: f}, nil)
	}, func() { f.log.Info("resuming", "slot", rcfg.Slot, "after", pos.EndLSN) })
}

// start starts the stream from the slot's position, with no copy (StartStream), once the handler
// has handled Reset and the starting position is stored.
func (f *Feed) start(ctx context.Context, rcfg replication.Config) (*replication.Stream, error) {
	if isSlotStore(f.store) {
		// An attempt after another: what that one acknowledged is not handed out again.
		f.mu.Lock()
		rcfg.Buffer.SkipThrough = max(rcfg.Buffer.SkipThrough, f.acked)
		f.mu.Unlock()
	}
	from := rcfg.Buffer.SkipThrough
	return f.open(ctx, rcfg, func(conn *replication.Conn) error {
		if _, ok := conn.Slot(); !ok {
			if !rcfg.CreateSlot {
				// Starting says what is missing and how to make it (replication's error for a
				// missing slot, ErrSlotNotFound).
				s, err := conn.StartStreaming(ctx)
				if err == nil { // another consumer made the slot meanwhile: not this run's to take
					s.Close(ctx)
					err = fmt.Errorf("changefeed: slot %q was created by someone else while this run started: %w", rcfg.Slot, replication.ErrSlotActive)
				}
				return err
			}
			if _, err := conn.CreateSlot(ctx, replication.NoSnapshot); err != nil {
				return err
			}
		}
		f.mu.Lock()
		f.sysID, f.state = conn.System().ID, nil
		f.mu.Unlock()
		return f.handle(ctx, &Batch{Kind: Reset, Worker: StreamWorker, f: f}, &from)
	}, func() { f.log.Info("streaming", "slot", rcfg.Slot, "after", from) })
}

// open connects, runs first once (the checks and the first batch, on the first connection
// only), and starts streaming, connecting again while another connection holds the slot (the
// walsender of a consumer that just died holds it for a moment) within Reconnect.SlotWait, as
// replication.Start does.
func (f *Feed) open(ctx context.Context, rcfg replication.Config, first func(*replication.Conn) error, started func()) (*replication.Stream, error) {
	done := false
	var since time.Time // the first refusal of the slot
	for attempt := 1; ; attempt++ {
		conn, err := f.connect(ctx, rcfg, attempt)
		if errors.Is(err, replication.ErrResumeAhead) {
			return nil, fmt.Errorf("changefeed: the stored position %s of slot %q is beyond the server's WAL: "+
				"the store belongs to another server, or the server was restored from a backup; "+
				"remove the stored position (and the consumer's output) to start again with a copy: %w", rcfg.Buffer.SkipThrough, rcfg.Slot, err)
		}
		if err != nil {
			return nil, err
		}
		f.reachedSource()
		if !done {
			if err := first(conn); err != nil {
				conn.Close(ctx)
				return nil, err
			}
			done = true
		}
		s, err := conn.StartStreaming(ctx)
		if err == nil {
			started()
			return s, nil
		}
		if !errors.Is(err, replication.ErrSlotActive) {
			return nil, err
		}
		if since.IsZero() {
			since = time.Now()
		}
		if err := replication.WaitForSlot(ctx, rcfg, err, attempt, since); err != nil {
			return nil, err
		}
	}
}

// connect makes the replication connection of open's attempt n: on the first, the one the
// Restarter's Prepare made (Source.Identify), with the settings Prepare left in rcfg, if it made
// one.
func (f *Feed) connect(ctx context.Context, rcfg replication.Config, n int) (*replication.Conn, error) {
	rcfg = streamConfig(rcfg)
	if n == 1 && f.try != nil { // f.try is written on this goroutine
		if conn := f.try.src.take(); conn != nil {
			if err := conn.SetBuffer(rcfg.Buffer); err != nil {
				conn.Close(ctx)
				return nil, err
			}
			return conn, nil
		}
	}
	return f.connectSource(ctx, rcfg)
}

// feedCopier is the Feed's side of InitialCopy.
type feedCopier Feed

func (c *feedCopier) Begin(ctx context.Context, systemID string) error {
	f := (*Feed)(c)
	f.reachedSource()
	f.mu.Lock()
	f.sysID, f.state = systemID, nil
	f.ts.known, f.ts.syncing, f.ts.loaded = nil, nil, nil
	f.mu.Unlock()
	u, err := f.store.Begin(ctx, StreamWorker)
	if err != nil {
		return err
	}
	if err := f.h(ctx, &Batch{Kind: Reset, Worker: StreamWorker, Unit: u, f: f}); err != nil {
		f.rollback(ctx, u)
		return &stopError{err}
	}
	pos := f.position(false, 0)
	if err := u.Commit(ctx, &pos); err != nil {
		f.rollback(ctx, u)
		return err
	}
	return nil
}

func (c *feedCopier) Plan(_ context.Context, sess *snapshot.Session) error {
	f := (*Feed)(c)
	f.mu.Lock()
	f.ts.copied(sess.Tables())
	f.mu.Unlock()
	return nil
}

func (c *feedCopier) Chunk(ctx context.Context, ch *snapshot.Chunk) error {
	f := (*Feed)(c)
	return f.handle(ctx, &Batch{Kind: Snapshot, Chunk: ch, Worker: ch.Worker, f: f}, nil)
}

func (c *feedCopier) Done(ctx context.Context, cp decoding.LSN) error {
	f := (*Feed)(c)
	if err := f.advance(ctx, cp); err != nil {
		return err
	}
	f.copied()
	return nil
}

// advance stores the position end with no batch: the end of the copy, or an idle advance.
func (f *Feed) advance(ctx context.Context, end decoding.LSN) error {
	u, err := f.store.Begin(ctx, StreamWorker)
	if err != nil {
		return err
	}
	pos := f.position(true, end)
	if err := u.Commit(ctx, &pos); err != nil {
		f.rollback(ctx, u)
		return err
	}
	return nil
}

func (c *feedCopier) Discard(context.Context, bool) {
	// The store still records a copy that began: the next run drops the slot if it is left,
	// and starts with a Reset.
}

// current returns the current attempt's stream (nil between attempts) and what the ended ones
// reported.
func (f *Feed) current() (*replication.Stream, ended) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stream, f.past
}

// Progress returns the stream's positions (replication.Stream.Progress), none below what the
// streams of earlier attempts reported; between attempts, theirs.
func (f *Feed) Progress() replication.Progress {
	s, past := f.current()
	if s == nil {
		return past.pos
	}
	return past.progress(s.Progress())
}

// Stats returns the reorder buffer's statistics (replication.Stream.Stats): the counters summed
// over the attempts' streams, the gauges the current stream's (zero between attempts).
func (f *Feed) Stats() reorderbuffer.Stats {
	s, past := f.current()
	var st reorderbuffer.Stats
	if s != nil {
		st = s.Stats()
	}
	return past.statsOf(st)
}

// Activity returns the stream's activity (replication.Stream.Activity), over the attempts'
// streams: HandedOut and Acked summed, Started the first stream's; between attempts, behind
// since the last stream ended (or fell behind).
func (f *Feed) Activity() replication.Activity {
	s, past := f.current()
	var act replication.Activity
	if s != nil {
		act = s.Activity()
	}
	return past.activity(act, s != nil)
}

// Reconnects returns how many times Run started a stream again after an earlier one of the same
// run ended (its streams do not reconnect by themselves).
func (f *Feed) Reconnects() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restarts
}
