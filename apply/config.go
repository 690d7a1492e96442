package apply

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/engine"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/spill"
)

// Mode is how transactions are applied to the target. Its String method returns the name the
// command line uses ("buffered", "eager", "parallel"). It is the type the engine that applies the
// stream is configured with.
type Mode = engine.Mode

const (
	// Buffered applies each transaction whole, at its commit, on one connection, in commit
	// order; transactions already received are grouped into one target transaction (see the
	// package documentation). A streamed transaction is held by the reorder buffer (in memory up
	// to Source.Buffer.WorkMem, then on disk) until its commit arrives.
	Buffered Mode = engine.Buffered
	// Eager applies a streamed transaction as its parts arrive, on a connection of its own
	// (one of Workers), taking a savepoint before each subtransaction's first change, rolling
	// back to it when the subtransaction aborts, and committing at its commit in commit order.
	// Non-streamed transactions are applied as they arrive, one at a time. When no worker is free
	// a streamed transaction is spooled and applied at its commit.
	Eager Mode = engine.Eager
	// Parallel is Eager plus parallel apply of non-streamed transactions on Workers connections:
	// a transaction that touches a row (relation and replica identity key) an earlier transaction
	// still in flight touched waits for that one to commit; commits stay in commit order, unless
	// CommitOrder is CommitRelaxed.
	Parallel Mode = engine.Parallel
)

// ParseMode parses "buffered", "eager" or "parallel".
func ParseMode(s string) (Mode, error) {
	if m, ok := engine.ModeNamed(s); ok {
		return m, nil
	}
	return 0, fmt.Errorf("%w: mode %q (want buffered, eager or parallel)", ErrInvalidConfig, s)
}

// CommitOrder is the order in which Parallel commits independent transactions on the target.
type CommitOrder int

const (
	// CommitSource (the zero value) commits every transaction on the target in the source's
	// commit order: the target never shows a transaction without every one that committed before
	// it on the source.
	CommitSource CommitOrder = iota
	// CommitRelaxed lets Parallel commit a transaction as soon as the transactions it depends on
	// committed, ahead of earlier independent ones (see Config.CommitOrder).
	CommitRelaxed
)

var commitOrderNames = [...]string{CommitSource: "source", CommitRelaxed: "relaxed"}

func (o CommitOrder) String() string {
	if o >= 0 && int(o) < len(commitOrderNames) {
		return commitOrderNames[o]
	}
	return fmt.Sprintf("CommitOrder(%d)", int(o))
}

// ParseCommitOrder parses "source" or "relaxed".
func ParseCommitOrder(s string) (CommitOrder, error) {
	for o, n := range commitOrderNames {
		if strings.EqualFold(s, n) {
			return CommitOrder(o), nil
		}
	}
	return 0, fmt.Errorf("%w: commit order %q (want source or relaxed)", ErrInvalidConfig, s)
}

// Defaults of zero Config fields.
const (
	// DefaultProgressTable is the target table that records, per slot, the end LSN of the last
	// source transaction applied.
	DefaultProgressTable = "pgreorder_apply_progress"
	// DefaultEagerWorkers is the number of streamed transactions Eager applies at once, like
	// PostgreSQL's max_parallel_apply_workers_per_subscription.
	DefaultEagerWorkers = 2
	// DefaultParallelWorkers is the number of worker connections of Parallel.
	DefaultParallelWorkers = 4
	// MaxWorkers bounds Config.Workers: each worker is a target connection.
	MaxWorkers = 64
	// DefaultSlotWait is Config.SlotWait's default, replication.DefaultSlotWait: longer than the
	// server's default wal_sender_timeout.
	DefaultSlotWait = replication.DefaultSlotWait
	// DefaultStartTimeout is Config.StartTimeout's default: a typo in a host or port stops a
	// service within half a minute, where its manager sees it.
	DefaultStartTimeout = changefeed.DefaultStartTimeout
)

// sourceSQL returns the options of an ordinary (not replication) connection to the source with
// application name app: Source's connection settings without replication=database.
func (c *Config) sourceSQL(app string) (pgsession.Options, error) {
	pc, err := pgsession.ConnConfig(c.Source.ConnConfig, c.Source.ConnString)
	if err != nil {
		return pgsession.Options{}, sourceConnStringError(err)
	}
	pc = pc.Copy()
	delete(pc.RuntimeParams, "replication")
	return pgsession.Options{Kind: pgsession.Source, Config: pc, BeforeConnect: c.Source.BeforeConnect,
		ApplicationName: app, Logger: c.Logger}, nil
}

// startTimeout returns the effective StartTimeout; negative means no limit.
func (c *Config) startTimeout() time.Duration {
	if c.StartTimeout == 0 {
		return DefaultStartTimeout
	}
	return c.StartTimeout
}

// slotWait returns the effective SlotWait; negative means no limit.
func (c *Config) slotWait() time.Duration {
	if c.SlotWait == 0 {
		return DefaultSlotWait
	}
	return c.SlotWait
}

// Config describes one replication job from a source publication into a target database. The
// DSNs, Slot and Publications are required; every other field has a working zero value.
type Config struct {
	// Source configures the source and its stream, as it does for package changefeed: the
	// connection (ConnString, or ConnConfig with BeforeConnect for a token or a tunnel), Slot
	// and Publications (both required), CreateSlot (create the slot if it does not exist; the
	// target must then hold what the source held when the slot was created, or use Copy),
	// Binary (values in their binary send format, PostgreSQL 14+, written with COPY binary and
	// binary parameters: column types must then be the same on both sides), OriginFilter
	// (pgoutput's origin option: OriginFilterNone, PostgreSQL 16+, leaves out what another
	// replication applied there, this Applier's reverse included), StatusInterval, and
	// the reorder buffer's Buffer.WorkMem, Dir and SpillCompressor (see below). Its Logger defaults
	// to Logger. The ordinary connections to the source (SchemaChanges, SyncSequences, the
	// initial copy) use the same connection settings. Reconnect is not used: a lost connection
	// ends the session, and Run starts the next after a delay of its own (see Run); how long a
	// slot in use is waited for is SlotWait.
	//
	// Buffer.WorkMem bounds the memory of transaction data, like PostgreSQL's
	// logical_decoding_work_mem: 0 means reorderbuffer.DefaultWorkMem (64 MiB),
	// reorderbuffer.SpillEverything keeps nothing in memory. In Buffered the reorder buffer holds
	// at most WorkMem. In Eager and Parallel the reorder buffer and the changes queued for workers
	// that have not applied them yet share WorkMem (reorderbuffer.Memory): the two together stay
	// within it, each using what the other leaves, and one queue (the parts its worker reads where
	// the buffer holds them, and the changes copied into it) at most WorkMem/Workers (64 KiB at
	// least); what does not fit waits in spill files, under Buffer.Dir ("" is the system's
	// temporary directory), compressed by Buffer.SpillCompressor if set (the reorder buffer's
	// and the workers' queues'; package spillcompress has S2, LZ4 and zstd). A worker may also
	// hold, outside WorkMem, two parts the reorder buffer spilled, each read in place through a
	// file and a 256 KiB read buffer.
	//
	// The Applier sets the rest itself: Buffer.SkipThrough comes from the target's progress
	// row, Buffer.Incremental from Mode, Buffer.HandOutAdvances is on; TemporarySlot and
	// TwoPhase, which an Applier cannot use, are refused, as is Reconnect.SlotWait (SlotWait
	// covers both servers).
	Source replication.Config
	// Target is the connection string of the target database. Its connections run with
	// application_name "pgreorder apply SLOT" (workers "pgreorder apply SLOT wN", the lock
	// watchdog "pgreorder apply SLOT watchdog", those of Copy "pgreorder apply SLOT cN"),
	// client_encoding UTF8, DateStyle ISO, read committed, no statement, lock or idle timeouts,
	// synchronous_commit off (see SynchronousCommit) and, when the role may set it,
	// session_replication_role = replica, as PostgreSQL's own subscriber does: ordinary triggers
	// and foreign key checks do not fire for replicated changes. Use it or TargetConfig, not
	// both.
	Target string
	// TargetConfig is the target's connection configuration, made by pgconn.ParseConfig and then
	// adjusted as the program needs (a dialer, TLS settings), instead of Target. Each connection
	// works on a copy; the settings above are pinned on it.
	TargetConfig *pgconn.Config
	// TargetBeforeConnect, if set, is called before every connection to the target with that
	// connection's copy of the configuration: it may set a password (an IAM token) or a dialer
	// (a tunnel), as replication.Config.BeforeConnect does for the source.
	TargetBeforeConnect func(ctx context.Context, cfg *pgconn.Config) error
	// Copy makes the initial copy when the target has no progress row for the slot: Run creates
	// the slot (with or without Source.CreateSlot) with an exported snapshot, copies the published
	// tables as they were at the slot's consistent point into the target's existing, empty
	// tables, and streams from that point; a copy interrupted by a crash is discarded and made
	// again. Once the progress row exists, Copy changes nothing. See the package documentation.
	Copy bool
	// CopyTruncate lets the initial copy (Copy) and the copy of a table added to the
	// publications (NewTables) empty target tables that hold rows (TRUNCATE, without CASCADE);
	// without it such a table stops Run with ErrTargetNotEmpty before anything is copied.
	CopyTruncate bool
	// NewTables says what happens to a table added to the publications after the target was
	// copied (or first followed): changefeed.NewTablesCopy (the zero value) copies its rows from
	// a snapshot of its own, consistently with the stream, before its changes are applied;
	// changefeed.NewTablesStream applies its changes from then on only, as a PostgreSQL
	// subscription does until ALTER SUBSCRIPTION ... REFRESH PUBLICATION, and logs that its
	// earlier rows are not copied. See "Tables added to the publications" in the package
	// documentation.
	NewTables changefeed.NewTables
	// CopyWorkers is the number of tables (or parts of tables) Copy copies at once, each over a
	// connection to the source and one to the target; 0 means snapshot.DefaultWorkers. At most
	// MaxWorkers.
	CopyWorkers int

	// Mode is Buffered (the zero value), Eager or Parallel.
	Mode Mode
	// Workers is the number of worker connections to the target for Eager (streamed transactions
	// applied at once; default DefaultEagerWorkers) and Parallel (default DefaultParallelWorkers),
	// at most MaxWorkers. Buffered uses one connection and ignores it.
	Workers int
	// CommitOrder is CommitSource (the zero value) or CommitRelaxed, which only Parallel takes
	// (ErrInvalidConfig otherwise: Buffered applies on one connection, and Eager, which tracks
	// no rows, has nothing it could commit out of order). With CommitRelaxed a transaction that
	// Parallel's dependency tracker finds independent of the earlier ones still in flight commits
	// as soon as its changes are applied, without waiting for its turn; one that depends on
	// earlier ones (the same row) commits after them, as do the
	// transactions Parallel applies alone or in order (TRUNCATE, tables whose triggers fire,
	// changes without a usable key, streamed and large transactions, those the leader applies).
	// The target may then briefly show a transaction without an earlier, independent one. What
	// is acknowledged to the source is still the prefix of the source's transactions that all
	// committed on the target; transactions committed past it are recorded, in their own target
	// transactions, in the ahead table (see the package documentation), and a session that starts
	// after a crash skips them. Any mode reads that record, so a change of CommitOrder or Mode
	// after a crash is safe.
	CommitOrder CommitOrder
	// SynchronousCommit makes every target commit wait for its WAL flush (or for whatever the
	// target role's synchronous_commit says), and acknowledges it to the source at once: the
	// lowest latency per transaction. Without it (the default), target transactions commit with
	// synchronous_commit = off, as PostgreSQL's subscriber does by default, and are made durable
	// in groups while the stream keeps delivering: one commit in 64, or the first one 10ms after
	// an unflushed one, is synchronous; the target flushes its WAL through it, which makes every
	// earlier commit durable too. Once the stream has had nothing to read for a millisecond (the
	// source waits, as under synchronous replication, where its COMMIT returns only once the
	// Applier reported the commit flushed), every commit is synchronous and acknowledged as soon
	// as it returned, and a commit made just before is flushed at once by a transaction that
	// writes the progress row: the last transaction before a pause is acknowledged about as soon
	// as with SynchronousCommit. Much more throughput when WAL flushes are slow, acknowledgements a
	// few milliseconds later under a steady flow. Either way a transaction is acknowledged to the
	// source only once its commit is durable on the target, so exactly-once holds across
	// crashes of either server.
	SynchronousCommit bool
	// ProgressTable is the target table that records the progress of each slot, created if
	// missing: (slot text PRIMARY KEY, end_lsn pg_lsn, system_id text, timeline int), the last two
	// naming the source system the position belongs to (added to a table made without them).
	// "" means DefaultProgressTable; a schema-qualified name ("schema.table") is allowed. A name
	// without a schema is resolved in the target role's search_path when a connection opens: the
	// schema of an existing table of that name, or else the one CREATE TABLE would choose. With
	// CommitRelaxed, its companion table (the name with "_ahead") records what workers committed
	// past the progress row's position (see the package documentation).
	ProgressTable string
	// AcceptSlotAhead lets Run continue when the slot's confirmed position is ahead of the
	// target's progress row. Every position the slot confirms is in a durable progress row
	// first, so a slot found ahead of it means that transactions were acknowledged and then lost
	// by the target (restored from an older backup, or written by a version of the Applier that
	// did not keep this promise): they are not on the target and the source will not send them
	// again. Run stops with ErrSlotAhead instead, unless this is set: it then logs the gap, moves
	// the progress row to the slot's position and continues, without them.
	AcceptSlotAhead bool
	// SlotWait is how long a session waits, when it starts, for connections of another session of
	// the slot: on the target, those of another Applier for the slot or the backends left by one
	// that died (which end when the server notices); on the source, another walsender streaming
	// from the slot. The holder (pid, application_name, client) is logged at once; after
	// SlotWait, Run stops with a *SlotInUseError (target) or a *replication.SlotActiveError
	// (source). 0 means DefaultSlotWait; a negative value waits as long as ctx allows.
	SlotWait time.Duration
	// StartTimeout bounds how long a run that has not yet reached both servers keeps trying: its
	// first sessions' connections to the target and to the source are retried (a server still
	// starting) until StartTimeout has passed since Run began, and Run then stops with the last
	// error (which names the side), wrapped with ErrNotStarted. Once a session has connected to
	// both, a lost connection is retried for as long as Run runs. 0 means DefaultStartTimeout; a
	// negative value retries as long as ctx allows.
	StartTimeout time.Duration
	// Logger receives progress, conflicts and retries; nil logs nothing.
	Logger *slog.Logger

	// Origin, when set, names the replication origin that marks every target transaction the
	// Applier commits (pg_replication_origin_session_setup, and pg_replication_origin_xact_setup
	// with the source transaction's end LSN and commit time, which becomes its commit timestamp),
	// as PostgreSQL's subscriber does. A publication of the target read with origin = none
	// (Source.OriginFilter, PostgreSQL 16+) then leaves those transactions out: two databases can
	// replicate to each other without loops; and the target tells the Applier's rows from
	// others' (*_origin_differs conflicts, with track_commit_timestamp). Worker connections use
	// origins of their own, Origin + "_w1" and so on, and the initial copy's connections (Copy)
	// Origin + "_c1" and so on (an origin is active in one session at a time); each is created
	// if missing and takes one of the target's replication origin states
	// (max_active_replication_origins, max_replication_slots before PostgreSQL 18) for as long
	// as it exists: drop them (pg_replication_origin_drop) when the Applier is gone for good.
	// Setting up an origin takes a superuser or a role granted EXECUTE on the functions; without
	// it the Applier says so once and commits without origin. "" commits without origin.
	Origin string
	// Conflicts configures conflict detection, resolution and reporting.
	Conflicts conflict.Config

	// SkipLSN, when set, is the commit LSN of one source transaction not to apply, as ALTER
	// SUBSCRIPTION ... SKIP (lsn = ...) does: the transaction that stopped Run with an error (an
	// *ApplyError names its CommitLSN). It must be the next transaction to apply, or Run stops
	// with ErrSkipLSN naming that one's commit LSN. The skipped transaction is logged (xid,
	// relations, changes by kind), counted in Stats.Skipped, and recorded in the slot's progress
	// row (columns skipped_lsn, skipped_xid and skipped_at, added to the progress table) by the
	// target transaction that moves the row past it, so that a restart with the same SkipLSN
	// neither skips again nor applies it. The session that skips applies as Buffered does.
	SkipLSN decoding.LSN
	// SchemaChanges says which changes of the source's schema are made on the target: none (the
	// zero value, SchemaFixed), or SchemaAddColumns: a published table the target lacks is
	// created from the source's definition, and a column the source adds is added to the target
	// table (see SchemaAddColumns). Reading the source's catalog takes an ordinary connection to
	// the source (Source, without replication), which every session also uses to list the
	// published tables it checks on the target.
	SchemaChanges SchemaChanges

	// SyncSequences copies the values of the source's sequences owned by the published tables'
	// columns (serial and identity columns) to the target's sequences of the same names, moving
	// them only forward (see Applier.SyncSequences): once the first session streams (after the
	// initial copy), every SyncSequencesInterval while Run runs, and once more when Run stops
	// cleanly (ctx done, or caught up with UntilCaughtUp). A sequence missing on the target stops
	// Run with ErrMissingSequence.
	SyncSequences bool
	// SyncSequencesInterval is the time between two synchronizations of SyncSequences; 0 means
	// DefaultSyncSequencesInterval.
	SyncSequencesInterval time.Duration

	// UntilCaughtUp makes Run return nil once it has applied, and acknowledged to the source,
	// everything up to the source's WAL position when Run started (its first session): the
	// moment of a cut-over, once writes to the source have stopped (see Applier.CaughtUp).
	UntilCaughtUp bool

	addColumn   target.AddColumnFunc   // set by New for SchemaAddColumns
	createTable target.CreateTableFunc // set by New unless SchemaFixed

	hooks *hooks // tests only: fault injection
	// runTxns, tests only: the most transactions a run of Parallel, or a group its leader applies
	// (chained runs), takes (0: plan.GroupMaxTxns).
	runTxns int
	// stepwise, tests only: every transaction is applied one statement at a time
	// (target.Conn.Stepwise), the order in which conflicts are resolved that batches must match.
	stepwise bool
	// maxStatements, tests only: the most statements prepared on one target connection
	// (target.Options.MaxStatements; 0: target.DefaultMaxStatements).
	maxStatements int
}

// validate checks c and returns a copy with the defaults filled in.
func (c Config) validate() (Config, error) {
	bad := func(f configerr.Field, format string, args ...any) (Config, error) {
		return c, invalid(f, format, args...)
	}
	switch {
	case c.Source.ConnString == "" && c.Source.ConnConfig == nil:
		return bad(field("Source.ConnString"), "is required")
	case c.Source.ConnString != "" && c.Source.ConnConfig != nil:
		return bad(field("Source.ConnString"), "is set, and so is %s: set one of them", field("Source.ConnConfig"))
	case c.Target == "" && c.TargetConfig == nil:
		return bad(field("Target"), "is required")
	case c.Target != "" && c.TargetConfig != nil:
		return bad(field("Target"), "is set, and so is %s: set one of them", field("TargetConfig"))
	case c.Source.Slot == "":
		return bad(field("Source.Slot"), "is required")
	case len(c.Source.Publications) == 0:
		return bad(field("Source.Publications"), "is required")
	case c.Source.TemporarySlot:
		return bad(field("Source.TemporarySlot"), "is set: the target's progress row must outlive the connection, and a temporary slot does not")
	case c.Source.TwoPhase:
		return bad(field("Source.TwoPhase"), "is set: the Applier applies a prepared transaction at its COMMIT PREPARED, from a slot read without two-phase decoding")
	case c.Source.Reconnect.SlotWait != 0:
		return bad(field("Source.Reconnect.SlotWait"), "is set: set %s, which covers the target's connections too", field("SlotWait"))
	case c.Source.Buffer.SkipThrough != 0:
		return bad(field("Source.Buffer.SkipThrough"), "is set: the Applier resumes after the target's progress row")
	case c.Source.Buffer.Incremental:
		return bad(field("Source.Buffer.Incremental"), "is set: %s decides it", field("Mode"))
	case c.Mode < Buffered || c.Mode > Parallel:
		return bad(field("Mode"), "%d is unknown", int(c.Mode))
	case c.Workers < 0 || c.Workers > MaxWorkers:
		return bad(field("Workers"), "%d (want 0 for the default, or 1 to %d)", c.Workers, MaxWorkers)
	case c.CopyWorkers < 0 || c.CopyWorkers > MaxWorkers:
		return bad(field("CopyWorkers"), "%d (want 0 for the default, or 1 to %d)", c.CopyWorkers, MaxWorkers)
	case c.Source.Buffer.WorkMem < 0 && c.Source.Buffer.WorkMem != reorderbuffer.SpillEverything:
		return bad(field("Source.Buffer.WorkMem"), "%d (want bytes, 0 for the default, or reorderbuffer.SpillEverything)", c.Source.Buffer.WorkMem)
	case c.SyncSequencesInterval < 0:
		return bad(field("SyncSequencesInterval"), "%v (want an interval, or 0 for the default)", c.SyncSequencesInterval)
	case c.SchemaChanges < SchemaFixed || c.SchemaChanges > SchemaAddColumns:
		return bad(field("SchemaChanges"), "%d is unknown", int(c.SchemaChanges))
	case c.CommitOrder < CommitSource || c.CommitOrder > CommitRelaxed:
		return bad(field("CommitOrder"), "%d is unknown", int(c.CommitOrder))
	case c.CommitOrder == CommitRelaxed && c.Mode != Parallel:
		return bad(field("CommitOrder"), "relaxed needs %s (it is %v: it commits in the source's order only)",
			Field{Config: "apply", Path: "Mode", Value: "Parallel", Arg: "parallel"}, c.Mode)
	}
	for _, p := range c.Source.Publications {
		if p == "" {
			return bad(field("Source.Publications"), "holds an empty name")
		}
	}
	if c.Workers == 0 {
		switch c.Mode {
		case Eager:
			c.Workers = DefaultEagerWorkers
		case Parallel:
			c.Workers = DefaultParallelWorkers
		}
	}
	if c.Mode == Buffered {
		c.Workers = 0
	}
	if c.ProgressTable == "" {
		c.ProgressTable = DefaultProgressTable
	}
	if _, err := target.ParseQualified(c.ProgressTable); err != nil {
		return bad(field("ProgressTable"), "%q: %v", c.ProgressTable, err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Source.Logger == nil {
		c.Source.Logger = c.Logger
	}
	switch c.Source.OriginFilter {
	case replication.OriginFilterDefault, replication.OriginFilterAny, replication.OriginFilterNone:
	default:
		return bad(field("Source.OriginFilter"), "%d is unknown", int(c.Source.OriginFilter))
	}
	if _, err := pgsession.ConnConfig(c.Source.ConnConfig, c.Source.ConnString); err != nil {
		return c, sourceConnStringError(err)
	}
	var err error
	if c.Conflicts, err = validateConflicts(c.Conflicts); err != nil {
		return c, err
	}
	return c, nil
}

// relaxed says whether Parallel's workers may commit ahead of the committed prefix.
func (c *Config) relaxed() bool { return c.CommitOrder == CommitRelaxed && c.Mode == Parallel }

// WorkMemBytes is Source.Buffer.WorkMem in bytes, as the Applier holds memory to it:
// reorderbuffer.DefaultWorkMem for 0, 0 for reorderbuffer.SpillEverything, and math.MaxInt64
// for no limit.
func (c *Config) WorkMemBytes() int64 {
	switch w := c.Source.Buffer.WorkMem; {
	case w == 0:
		return reorderbuffer.DefaultWorkMem
	case w < 0:
		return 0
	default:
		return w
	}
}

// spillFiles returns the spill files the reorder buffer and, in Eager and Parallel
// (incremental), the workers' queues may keep open: one spill store's default budget, shared
// (a quarter for the queues) rather than taken twice.
func spillFiles(incremental bool) (buffer, queues int) {
	n := spill.DefaultOpenFiles()
	if !incremental {
		return n, 0
	}
	queues = max(n/4, 1)
	return max(n-queues, 1), queues
}

// targetOptions returns the options of the Applier's target connections.
func (c *Config) targetOptions() *target.Options {
	return &target.Options{ConnConfig: c.TargetConfig, ConnString: c.Target, BeforeConnect: c.TargetBeforeConnect,
		Logger: c.Logger, Tables: []string{c.ProgressTable, c.Conflicts.LogTable, c.Conflicts.TombstoneTable,
			conflict.DefaultTombstoneTable},
		Slot: c.Source.Slot, SynchronousCommit: c.SynchronousCommit, Binary: c.Source.Binary, Now: c.now, AddColumn: c.addColumn,
		CreateTable: c.createTable, MaxStatements: c.maxStatements}
}
