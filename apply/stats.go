package apply

import (
	"sync/atomic"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/engine"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// Stats are an Applier's counters since it was made, over all its sessions.
//
// The row counts (Inserts to Truncates) are of target transactions that committed, in every
// mode: the rows of a target transaction rolled back (the session failed before its commit, a
// transaction retried alone after a deadlock, a subtransaction rolled back to its savepoint, a
// streamed transaction that aborted on the source) are not counted, and a transaction applied
// again is counted once.
type Stats struct {
	Txns      int64 // source transactions committed on the target
	EmptyTxns int64 // of which had nothing to apply (acknowledged without a target transaction)
	Inserts   int64 // rows inserted for source changes (the initial copy's are in InitialCopyRows)
	// InsertsViaCopy counts the Inserts sent with the COPY protocol: a run of inserts into one
	// table goes as one COPY (short runs go as INSERT statements).
	InsertsViaCopy int64
	Updates        int64 // rows updated
	Deletes        int64 // rows deleted
	Truncates      int64 // TRUNCATE statements

	Statements int64 // statements sent to the target, COPY included
	RoundTrips int64 // batches of statements and COPYs: the round trips the statements took

	// Conflicts by type, as PostgreSQL's pg_stat_subscription_stats counts them (confl_*): each
	// one logged and resolved (see conflict.Config), counted once its resolution committed (a
	// conflict that stops Run is counted when met). Without track_commit_timestamp on the target
	// the *_origin_differs ones are not detected; without conflict.Config.Retention,
	// update_deleted is reported as update_missing.
	InsertExists            int64
	UpdateOriginDiffers     int64
	UpdateExists            int64
	UpdateMissing           int64
	DeleteOriginDiffers     int64
	UpdateDeleted           int64
	DeleteMissing           int64
	MultipleUniqueConflicts int64

	// RetentionActive says whether tombstones are recorded for update_deleted detection: false
	// without conflict.Config.Retention, and while the apply lag exceeds it.
	RetentionActive  bool
	RetentionStops   int64 // times the lag went over conflict.Config.Retention
	Tombstones       int64 // tombstones in the tombstone table at the last purge
	TombstonesPurged int64 // tombstones removed by purges

	SubAborts    int64 // subtransactions rolled back to their savepoint on the target (Eager, Parallel)
	Aborts       int64 // streamed transactions rolled back on the target (Eager, Parallel)
	Spooled      int64 // streamed transactions spooled for lack of a free worker (Eager, Parallel)
	SerialTxns   int64 // transactions Parallel applied alone (no usable key, a key whose equality the values do not tell, TRUNCATE, triggers)
	QueueSpilled int64 // bytes of queued changes written to spill files (Eager, Parallel)
	// KeptParts counts the parts of transactions (and a run's transactions) the workers read
	// where the reorder buffer holds them, not copied into their queues (Eager, Parallel).
	KeptParts int64
	// QueuePeakBytes is the most bytes of queued changes the workers' queues held in memory at
	// once, in any session (Eager, Parallel).
	QueuePeakBytes int64
	// SharedPeakBytes is the most bytes the reorder buffer and the queues held together (Eager,
	// Parallel): within WorkMem but for what the buffer cannot spill (the part handed out, a chunk).
	SharedPeakBytes int64
	// CommittedAhead counts the target commits (of a transaction, or a run of them) made ahead of
	// an earlier source transaction not yet committed (Config.CommitOrder CommitRelaxed).
	CommittedAhead int64
	// RunsOnLeader and RunsOnWorkers count the target transactions of whole source transactions
	// Parallel committed as groups on the leader's connection (while its runs were chained: each
	// waited for the one before) and as runs on its workers.
	RunsOnLeader, RunsOnWorkers int64
	// ConflictWaits counts the conflicts of a unique index (insert_exists, update_exists,
	// multiple_unique_conflicts) a worker met before every earlier source transaction had
	// committed (Eager, Parallel): the worker waited for them and looked again, and only what was
	// still there was counted and resolved as a conflict.
	ConflictWaits int64

	// InitialCopyRows counts the rows the initial copy (Config.Copy) wrote into the target's
	// tables. A copy that failed and started over counts its rows again.
	InitialCopyRows int64

	Sessions int64 // sessions started (the first, and one per retry)
	// SerialRetries counts the transactions retried alone after failing or deadlocking in
	// parallel, and those retried one statement at a time because a conflict's resolution had to
	// come before statements its batch had sent.
	SerialRetries int64
	Deadlocks     int64 // lock waits between the Applier's own connections it broke
	Skipped       int64 // source transactions skipped as Config.SkipLSN asked

	// ColumnsAdded counts the columns added to target tables (Config.SchemaChanges; a column
	// added in a target transaction that was rolled back and added again counts twice);
	// SourceColumnsGone the columns the stream showed gone from a source relation (dropped or
	// renamed), which stay on the target.
	ColumnsAdded, SourceColumnsGone int64
	// TablesCreated counts the target tables created from the source's definition
	// (Config.SchemaChanges).
	TablesCreated int64
	SequenceSyncs int64 // sequence synchronizations done (Config.SyncSequences, Applier.SyncSequences)

	// AppliedLSN is the end LSN of the last transaction committed on the target; from a
	// session's start, at least the position the target's progress row held then.
	AppliedLSN decoding.LSN
}

type counters struct {
	target.Counters
	detect.TombstoneCounters
	eng                                      engine.Counters // the engine's: its commits, queues, runs
	txns                                     atomic.Int64
	sessions, serialRetries                  atomic.Int64
	columnsAdded, columnsGone, sequenceSyncs atomic.Int64
	tablesCreated                            atomic.Int64
	memPeak                                  atomic.Int64 // the sessions' reorderbuffer.Memory (SharedPeakBytes)
}

func (c *counters) snapshot() Stats {
	return Stats{
		Txns: c.txns.Load(), EmptyTxns: c.eng.EmptyTxns.Load(), Inserts: c.Inserts.Load(), InsertsViaCopy: c.InsertsViaCopy.Load(),
		Updates: c.Updates.Load(), Deletes: c.Deletes.Load(), Truncates: c.Truncates.Load(),
		Statements: c.Statements.Load(), RoundTrips: c.RoundTrips.Load(),
		InsertExists: c.Conflicts[conflict.InsertExists].Load(), UpdateOriginDiffers: c.Conflicts[conflict.UpdateOriginDiffers].Load(),
		UpdateExists: c.Conflicts[conflict.UpdateExists].Load(), UpdateMissing: c.Conflicts[conflict.UpdateMissing].Load(),
		DeleteOriginDiffers: c.Conflicts[conflict.DeleteOriginDiffers].Load(), UpdateDeleted: c.Conflicts[conflict.UpdateDeleted].Load(),
		DeleteMissing: c.Conflicts[conflict.DeleteMissing].Load(), MultipleUniqueConflicts: c.Conflicts[conflict.MultipleUniqueConflicts].Load(),
		RetentionActive: c.RetentionActive.Load(), RetentionStops: c.RetentionStops.Load(),
		Tombstones: c.TombstoneRows.Load(), TombstonesPurged: c.TombstonesPurged.Load(),
		SubAborts: c.eng.SubAborts.Load(), Aborts: c.eng.Aborts.Load(), Spooled: c.eng.Spooled.Load(),
		SerialTxns: c.eng.SerialTxns.Load(), QueueSpilled: c.eng.QueueSpilled.Load(), KeptParts: c.eng.KeptParts.Load(), QueuePeakBytes: c.eng.QueuePeak.Load(),
		SharedPeakBytes: c.memPeak.Load(),
		CommittedAhead:  c.eng.CommittedAhead.Load(), RunsOnLeader: c.eng.RunsOnLeader.Load(), RunsOnWorkers: c.eng.RunsOnWorkers.Load(),
		ConflictWaits:   c.eng.ConflictWaits.Load(),
		InitialCopyRows: c.InitialCopyRows.Load(),
		Sessions:        c.sessions.Load(), SerialRetries: c.serialRetries.Load(), Deadlocks: c.eng.Deadlocks.Load(),
		Skipped: c.eng.Skipped.Load(), ColumnsAdded: c.columnsAdded.Load(), SourceColumnsGone: c.columnsGone.Load(),
		TablesCreated: c.tablesCreated.Load(), SequenceSyncs: c.sequenceSyncs.Load(),
		AppliedLSN: decoding.LSN(c.AppliedLSN.Load()),
	}
}

// Conflicts returns the count of conflicts of type ct.
func (s Stats) Conflicts(ct conflict.Type) int64 {
	switch ct {
	case conflict.InsertExists:
		return s.InsertExists
	case conflict.UpdateOriginDiffers:
		return s.UpdateOriginDiffers
	case conflict.UpdateExists:
		return s.UpdateExists
	case conflict.UpdateMissing:
		return s.UpdateMissing
	case conflict.DeleteOriginDiffers:
		return s.DeleteOriginDiffers
	case conflict.UpdateDeleted:
		return s.UpdateDeleted
	case conflict.DeleteMissing:
		return s.DeleteMissing
	case conflict.MultipleUniqueConflicts:
		return s.MultipleUniqueConflicts
	}
	return 0
}

// Progress returns the source WAL positions of replication.Stream.Progress (Flushed: durable on
// the target, with the progress row) over all sessions and Runs (changefeed.Feed.Progress).
func (a *Applier) Progress() replication.Progress {
	if f := a.runFeed(); f != nil {
		return f.Progress()
	}
	return replication.Progress{}
}

// Activity returns the sessions' replication.Activity (changefeed.Feed.Activity: HandedOut and
// Acked summed; between sessions, and until a new stream catches up, behind since the last one
// ended), but LastCommitTime and LastHandedOut are the source commit time of the last transaction
// committed on the target and when it committed there; zero values before the first stream. It,
// Progress, BufferStats and Reconnects may be called at any time, from any goroutine.
func (a *Applier) Activity() (act replication.Activity) {
	if f := a.runFeed(); f != nil {
		act = f.Activity()
		act.LastCommitTime, act.LastHandedOut = a.commits.Last()
	}
	return act
}

// BufferStats returns the statistics of the sessions' reorder buffers (changefeed.Feed.Stats):
// counters summed over all sessions, gauges of the current one (0 between sessions).
func (a *Applier) BufferStats() reorderbuffer.Stats {
	if f := a.runFeed(); f != nil {
		return f.Stats()
	}
	return reorderbuffer.Stats{}
}

// Reconnects returns the sessions after the first (changefeed.Feed.Reconnects).
func (a *Applier) Reconnects() int {
	if f := a.runFeed(); f != nil {
		return f.Reconnects()
	}
	return 0
}

// runFeed returns the Feed of the Applier's last Run, nil before the first.
func (a *Applier) runFeed() *changefeed.Feed {
	if a == nil {
		return nil
	}
	return a.feed.Load()
}
