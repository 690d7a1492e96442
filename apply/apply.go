package apply

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/ddl"
	"github.com/pgreorder/pgreorder/apply/internal/engine"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/retry"
)

// retryBackoff is the delay of Run after a retryable error: from 200ms, doubling up to 30s for
// failures in a row, with ±20% jitter, back to the first after a session that committed a
// transaction or ran for resetRetryAfter. Its Min and Max are the Feed's Reconnect policy
// (runSessions), whose jitter is the same.
var retryBackoff = retry.Backoff{Min: 200 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.2}

const resetRetryAfter = time.Minute

// ErrRunning is returned by Run while another Run of the same Applier is in progress.
var ErrRunning = retry.Stop("apply: Run already in progress")

// Applier replicates a publication into a target database. Make one with New and call Run.
type Applier struct {
	cfg     Config
	stats   counters
	feed    atomic.Pointer[changefeed.Feed] // the last Run's Feed, whose readings span its sessions
	commits engine.Commits                  // the last transaction committed on the target

	mu      sync.Mutex
	running bool
	// serial holds source transactions to apply alone when they come again: they failed, or
	// had to be rolled back, while applied concurrently with others. Run's goroutine only.
	serial map[uint32]bool
	// stepwise holds the serial transactions to apply also one statement at a time: a conflict's
	// resolution had to come before statements its batch had already sent
	// (target.ErrOutOfOrder).
	stepwise map[uint32]bool
	added    string // the added table that ended the last session (initcopy.AddedError), until a copy

	said sync.Map // what was said once (see once)

	source sourceSQL   // an ordinary connection to the source (schema changes, sequences)
	ddl    *ddl.Schema // the target's tables made to follow the source's

	// Config.UntilCaughtUp: the source's WAL position at the start of the first session, and
	// the position caught up to once reached (caughtup.go).
	until, reached atomic.Uint64

	connected atomic.Bool // a session connected to both servers: connection errors are retried from then on

	streamedOnce sync.Once
	streamed     chan struct{} // closed once a session streams (see markStreaming)
}

// once runs f the first time key is given.
func (a *Applier) once(key string, f func()) {
	if _, loaded := a.said.LoadOrStore(key, true); !loaded {
		f()
	}
}

// New checks cfg and returns an Applier. It does not connect: Run does.
func New(cfg Config) (*Applier, error) {
	c, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	a := &Applier{cfg: c, serial: map[uint32]bool{}, stepwise: map[uint32]bool{}, streamed: make(chan struct{})}
	a.ddl = &ddl.Schema{Source: a.sourceQuery, Log: c.Logger, TablesCreated: &a.stats.tablesCreated,
		ColumnsAdded: &a.stats.columnsAdded, ColumnsGone: &a.stats.columnsGone,
		Connect: func(ctx context.Context, suffix string) (*target.Conn, error) {
			var c target.Counters
			return connectTarget(ctx, a.cfg.targetOptions(), "pgreorder apply "+a.cfg.Source.Slot+" "+suffix, &c)
		}}
	if c.SchemaChanges == SchemaAddColumns {
		a.cfg.addColumn = a.ddl.AddColumn
	}
	if c.SchemaChanges != SchemaFixed {
		a.cfg.createTable = a.ddl.CreateForChange
	}
	return a, nil
}

// Run replicates until ctx is done, then returns ctx's error (context.Canceled for a clean
// stop), or until an error that retrying cannot cure (see the package documentation), which it
// returns; with Config.UntilCaughtUp, it returns nil once caught up (see Applier.CaughtUp).
// Connection failures of either side, server restarts and deadlocks are retried: the session
// starts again from the target's progress row, after a delay that grows up to 30s.
//
// Everything in flight when Run returns is rolled back on the target and not acknowledged to
// the source; the next Run starts with it.
func (a *Applier) Run(ctx context.Context) error {
	if a == nil || a.serial == nil {
		return fmt.Errorf("%w: an Applier is made by New", ErrInvalidConfig)
	}
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return ErrRunning
	}
	a.running = true
	a.mu.Unlock()
	defer func() {
		a.closeSource(context.WithoutCancel(ctx))
		a.mu.Lock()
		a.running = false
		a.mu.Unlock()
	}()
	return a.runWith(ctx) // sequences.go: Config.SyncSequences around runSessions
}

// Stats returns the Applier's counters. It may be called at any time, from any goroutine.
func (a *Applier) Stats() Stats {
	if a == nil {
		return Stats{}
	}
	return a.stats.snapshot()
}

// Run makes an Applier for cfg and runs it: see Applier.Run.
func Run(ctx context.Context, cfg Config) error {
	a, err := New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// hooks let tests inject faults and observe stages. Each runs on the goroutine applying the
// transaction; an error it returns fails the session as a crash would.
type hooks struct {
	// stage is called with "before-commit" (the changes are on the target, COMMIT not yet sent),
	// "async-commit" (after "before-commit", when that COMMIT is not to wait for the target's WAL
	// flush; for each transaction it commits), "after-commit" (committed, not yet acknowledged),
	// "quiet" (the leader found nothing to read from the stream for idleProbe, and every commit
	// is synchronous until the stream hands out a transaction again; x is zero), "busy" (after
	// "quiet": the stream handed out a transaction, and commits are grouped again; x is zero)
	// and, in Eager and Parallel, "record" (before a job's queued record is applied; only Xid
	// and Streamed are set), "conflict" (a worker's connection is about to look up the local
	// rows of a conflict) and "conflict-settle" (it waits for the transactions before its own
	// first); with Copy,
	// "copy-chunk" (before a chunk is read; x is zero) and "copy-done" (every chunk committed,
	// the progress row not written; EndLSN is the consistent point); "sequence-set" (after a
	// sequence's setval of SyncSequences; x is zero).
	stage func(ctx context.Context, stage string, x txnRef) error
	// copyChunkSize, if set, is the initial copy's snapshot.Config.ChunkSize (and the copy's of
	// tables added to the publications, whose chunks call stage "added-chunk" first, and whose
	// commit is followed by "added-copied", with the copy's consistent point as EndLSN).
	copyChunkSize int64
	// publicationCheck, if set, is the Feed's changefeed.Config.PublicationCheck.
	publicationCheck time.Duration
	// workersOnly keeps Parallel's leader from applying whole transactions itself when their
	// runs are chained (see chain): every one goes to a worker.
	workersOnly bool
	// asyncDelay, if set, replaces asyncDelay: how long after an unflushed commit a commit is
	// made synchronous while the stream keeps delivering.
	asyncDelay time.Duration
	// now, if set, is the clock of the apply lag (tombstones' retention), of the group's age
	// (Buffered) and of the commit time of a transaction whose commit has not arrived yet.
	now func() time.Time
}

// txnRef identifies a source transaction to hooks.
type txnRef struct {
	Xid       uint32
	Streamed  bool
	CommitLSN decoding.LSN
	EndLSN    decoding.LSN
}

// now returns the time: time.Now, or the tests' clock.
func (c *Config) now() time.Time {
	if c.hooks != nil && c.hooks.now != nil {
		return c.hooks.now()
	}
	return time.Now()
}

// asyncDelay returns asyncDelay, or the tests' replacement.
func (c *Config) asyncDelay() time.Duration {
	if c.hooks != nil && c.hooks.asyncDelay > 0 {
		return c.hooks.asyncDelay
	}
	return asyncDelay
}

func (c *Config) hook(ctx context.Context, stage string, x txnRef) error {
	if c.hooks == nil || c.hooks.stage == nil {
		return nil
	}
	return c.hooks.stage(ctx, stage, x)
}
