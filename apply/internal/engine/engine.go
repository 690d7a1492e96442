package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/plan"
	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/spill"
)

// Mode is how the leader applies the stream. It is apply.Mode, whose documentation says what
// each mode does for the user.
type Mode int

const (
	// Buffered applies whole transactions, grouped, on the leader's connection.
	Buffered Mode = iota
	// Eager applies streamed transactions on workers as they arrive, and whole ones on the
	// leader's connection.
	Eager
	// Parallel applies whole transactions too on workers, in runs, with their dependencies.
	Parallel
)

var modeNames = [...]string{Buffered: "buffered", Eager: "eager", Parallel: "parallel"}

// String returns the mode's name as the command line spells it: "buffered", "eager" or
// "parallel".
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ModeNamed returns the mode whose name is s (any case), and false if none is.
func ModeNamed(s string) (Mode, bool) {
	for m, n := range modeNames {
		if strings.EqualFold(s, n) {
			return Mode(m), true
		}
	}
	return 0, false
}

// Config is what the engine needs of the Applier's configuration, resolved for one session.
type Config struct {
	Mode              Mode // Buffered for a session that skips a transaction, whatever was configured
	Workers           int  // Eager and Parallel: the workers' connections
	Relaxed           bool // Parallel's relaxed commit order
	SynchronousCommit bool // every commit waits for the target's WAL flush
	// Memory is the limit the workers' queues share with the session's reorder buffer
	// (reorderbuffer.Config.Memory): Eager and Parallel.
	Memory          *reorderbuffer.Memory
	SpillDir        string           // the queues' spill files
	SpillCompressor spill.Compressor // and their compression
	QueueFiles      int              // the spill files the queues may keep open
	UntilCaughtUp   bool             // end the session once caught up (ErrCaughtUp)
	// SwitchAt, when not 0, ends a Buffered session with ErrSwitchMode once a durable progress
	// row is at or past it, so that the next session applies in the configured mode: a session
	// runs Buffered while the stream may still hand out transactions whose changes of some tables
	// are left out (Host.Admit), up to that position.
	SwitchAt decoding.LSN
	// SkipLSN, when Skip is set, is the commit LSN of the first transaction, which is skipped
	// and recorded with SkipSQL (Buffered only).
	Skip    bool
	SkipLSN decoding.LSN
	SkipSQL string

	// AsyncDelay is how long after an unflushed commit a commit is made synchronous while the
	// stream keeps delivering.
	AsyncDelay time.Duration
	// Now is the clock of groups' and runs' ages.
	Now func() time.Time

	// Tests only.
	Hooks       bool // Host.Hook observes "record" stages (a call per queued record)
	Stepwise    bool // every transaction is applied one statement at a time
	RunTxns     int  // the most transactions a run (or a Parallel leader's group) takes; 0: no limit of its own
	WorkersOnly bool // Parallel's leader never applies whole transactions itself
}

// Ref identifies a source transaction to the hooks and in errors.
type Ref struct {
	Xid       uint32
	Streamed  bool
	CommitLSN decoding.LSN
	EndLSN    decoding.LSN
}

func refOf(t *reorderbuffer.Txn) Ref {
	return Ref{Xid: t.Xid, Streamed: t.Streamed, CommitLSN: t.CommitLSN, EndLSN: t.EndLSN}
}

// Host is what the engine calls back into the session for: the decisions that are the
// Applier's (which errors stop, what is retried alone), and the connections it sets up. Its
// methods are called from the leader's goroutine and, where noted, from the workers'.
type Host interface {
	// Hook reports a stage to the tests' hooks; an error fails the session. Any goroutine.
	Hook(ctx context.Context, stage string, x Ref) error
	// TxnError turns a change's error (a *target.ChangeError, or what the connection said)
	// into the error the session ends with for transaction x. Any goroutine.
	TxnError(x Ref, err error) error
	// Restart returns the error that starts the session over at once, applying xids alone.
	// Any goroutine.
	Restart(xids []uint32, reason error) error
	// SkipRefused returns the error for a transaction t that is not the one Config.SkipLSN
	// names (or an idle advance past it). Leader only.
	SkipRefused(t *reorderbuffer.Txn) error
	// Admit sees each transaction, or part of one, that the stream hands out, before anything of
	// it is applied (not idle advances): it may leave some of its changes out
	// (reorderbuffer.Txn.Filter), or return the error that ends the session. Leader only.
	Admit(t *reorderbuffer.Txn) error
	// NoteRelation sees each relation a change names, as the leader resolves it.
	NoteRelation(r *target.Relation)
	// ConnectWorker opens the target connection of worker i (from 1), ready to apply: fenced,
	// its statements prepared, its conflict detection attached. The engine closes it.
	ConnectWorker(ctx context.Context, i int) (*target.Conn, error)
	// Connect opens a plain target connection named after the session with suffix.
	Connect(ctx context.Context, suffix string) (*target.Conn, error)
}

// Counters are the engine's counters, which the Applier's Stats read.
type Counters struct {
	EmptyTxns, SubAborts, Aborts, Spooled, SerialTxns, QueueSpilled, QueuePeak, KeptParts atomic.Int64
	CommittedAhead, RunsOnLeader, RunsOnWorkers, ConflictWaits, Deadlocks                 atomic.Int64
	Skipped                                                                               atomic.Int64
	Handbacks                                                                             atomic.Int64 // Parallel's leader gave chained runs back to the workers (tests)
}

// Session is what the engine takes from the session that runs it. The session owns all of it
// and keeps it alive until Run returns; the engine owns what it makes (the workers, their
// connections, the queues).
type Session struct {
	Leader   *target.Conn       // the leader's target connection; the session closes it
	Key      target.ProgressKey // the progress row's key
	FlushSQL string             // the flushing transaction's progress upsert
	Stream   *replication.Stream
	Registry *target.Registry
	Log      *slog.Logger
	// Alone: every transaction is applied alone, in its own target transaction (conflicts are
	// resolved by commit time on a target with an origin).
	Alone bool
	// Applied: what was committed ahead of the prefix before the session (relaxed order).
	Applied schedule.Ahead
	// Persisted: a durable progress row is at or past it.
	Persisted decoding.LSN

	// Shared with the Applier, which reads them between sessions.
	Serial, Stepwise map[uint32]bool // transactions to apply alone (and one statement at a time); leader only
	Txns             *atomic.Int64   // transactions committed
	Stats            *Counters
	TargetStats      *target.Counters
	Commits          *Commits       // the last transaction committed on the target
	Until, Reached   *atomic.Uint64 // Config.UntilCaughtUp: the position to catch up to, and the one reached

	Host Host
}

// ErrCaughtUp ends a session that caught up (Config.UntilCaughtUp).
var ErrCaughtUp = errors.New("apply: caught up")

// ErrSwitchMode ends a Buffered session whose durable progress reached Config.SwitchAt.
// Another session cures it: it is retried.
var ErrSwitchMode = retry.Retry("apply: the session ends to apply in the configured mode")

// Engine applies one session's stream on the target.
type Engine struct {
	cfg          Config
	host         Host
	log          *slog.Logger
	stats        *Counters
	tstats       *target.Counters
	txns         *atomic.Int64
	commits      *Commits
	reg          *target.Registry
	stream       *replication.Stream
	leader       *target.Conn
	key          target.ProgressKey
	flushSQL     string
	serial       map[uint32]bool
	stepwiseXids map[uint32]bool
	until        *atomic.Uint64
	reached      *atomic.Uint64
	alone        bool
	confirming   bool // caught up, and waiting for a status update to tell the source (caughtUp)
	applied      schedule.Ahead
	skip         bool

	relBuf [1]*target.Relation
	// keptParser reads the parts the leader keeps for workers (keep): the buffer's own parser is
	// lent to the transaction it hands out next.
	keptParser decoding.Parser
	order      *schedule.Order
	acks       acks
	group      group // Buffered, and the leader's groups of Eager and Parallel
	mode       mode  // Eager and Parallel

	// Eager and Parallel.
	cancel    context.CancelCauseFunc // ends the session with the first error
	wg        sync.WaitGroup          // the workers' and the watchdog's goroutines
	jobs      map[uint32]*job         // by xid, until their commit or abort (leader only)
	workers   []*worker
	free      chan *worker
	store     *schedule.SpillStore
	budget    *schedule.Budget
	share     int64                                // the memory one queue may hold
	leaderJob atomic.Pointer[job]                  // the job the leader's connection applies, for the watchdog
	deps      *schedule.Tracker                    // Parallel
	keyForms  map[*target.Table][]schedule.KeyForm // Parallel: how each target table compares the source's columns (keyFormsOf)
	run       *job                                 // Parallel: the run the leader is filling
	chain     plan.Chain                           // Parallel: whether its runs are chained
}

// New returns the engine of a session.
func New(cfg Config, s Session) *Engine {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.AsyncDelay == 0 {
		cfg.AsyncDelay = DefaultAsyncDelay
	}
	e := &Engine{cfg: cfg, host: s.Host, log: s.Log, stats: s.Stats, tstats: s.TargetStats, txns: s.Txns, commits: s.Commits,
		reg: s.Registry, stream: s.Stream, leader: s.Leader, key: s.Key, flushSQL: s.FlushSQL, serial: s.Serial,
		stepwiseXids: s.Stepwise, until: s.Until, reached: s.Reached, alone: s.Alone, applied: s.Applied, skip: cfg.Skip}
	e.acks.Persisted = s.Persisted
	switch cfg.Mode {
	case Eager:
		e.mode = eager{e}
	case Parallel:
		e.mode = parallel{e}
	}
	return e
}

// Run applies the stream until an error, which it returns (ErrCaughtUp once caught up).
func (e *Engine) Run(ctx context.Context) error {
	if e.cfg.Mode == Buffered {
		return e.runBuffered(ctx)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	e.cancel = cancel
	err := e.startWorkers(ctx)
	if err == nil {
		err = e.runIncremental(ctx)
	}
	cancel(err)
	e.stopWorkers(ctx)
	if aerr := e.ackCommitted(context.WithoutCancel(ctx)); aerr != nil {
		e.log.Debug("acknowledging the last commits", "err", aerr)
	}
	return context.Cause(ctx)
}

// SourceCommit is what target connections take of a source transaction's commit (nil until it
// arrived).
func SourceCommit(t *reorderbuffer.Txn) *detect.SourceCommit {
	if t == nil {
		return nil
	}
	return &detect.SourceCommit{Time: t.CommitTime, Origin: t.Origin, End: t.EndLSN}
}
