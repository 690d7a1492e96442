package apply

import (
	"sync/atomic"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/decoding"
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
	Inserts   int64 // rows inserted
	CopyRows  int64 // of which through COPY
	Updates   int64 // rows updated
	Deletes   int64 // rows deleted
	Truncates int64 // TRUNCATE statements

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
	SerialTxns   int64 // transactions Parallel applied alone (no usable key, TRUNCATE, triggers)
	QueueSpilled int64 // bytes of queued changes written to spill files (Eager, Parallel)

	Sessions      int64 // sessions started (the first, and one per retry)
	SerialRetries int64 // transactions retried alone after failing or deadlocking in parallel
	Deadlocks     int64 // lock waits between the Applier's own connections it broke

	AppliedLSN decoding.LSN // end LSN of the last transaction committed on the target
}

type counters struct {
	txns, emptyTxns, inserts, copyRows, updates, deletes, truncates atomic.Int64
	statements, roundTrips                                          atomic.Int64
	conflicts                                                       [numConflictTypes]atomic.Int64
	retentionStops, tombstones, tombstonesPurged                    atomic.Int64
	retentionActive                                                 atomic.Bool
	subAborts, aborts, spooled, serialTxns, queueSpilled            atomic.Int64
	sessions, serialRetries, deadlocks                              atomic.Int64
	appliedLSN                                                      atomic.Uint64

	// Statements prepared on the target connections: the most one connection held at once,
	// and how many times one was prepared.
	preparedMost, prepares atomic.Int64
}

// preparedPeak records n statements prepared on one connection.
func (c *counters) preparedPeak(n int64) {
	for {
		old := c.preparedMost.Load()
		if n <= old || c.preparedMost.CompareAndSwap(old, n) {
			return
		}
	}
}

func (c *counters) snapshot() Stats {
	return Stats{
		Txns: c.txns.Load(), EmptyTxns: c.emptyTxns.Load(), Inserts: c.inserts.Load(), CopyRows: c.copyRows.Load(),
		Updates: c.updates.Load(), Deletes: c.deletes.Load(), Truncates: c.truncates.Load(),
		Statements: c.statements.Load(), RoundTrips: c.roundTrips.Load(),
		InsertExists: c.conflicts[conflict.InsertExists].Load(), UpdateOriginDiffers: c.conflicts[conflict.UpdateOriginDiffers].Load(),
		UpdateExists: c.conflicts[conflict.UpdateExists].Load(), UpdateMissing: c.conflicts[conflict.UpdateMissing].Load(),
		DeleteOriginDiffers: c.conflicts[conflict.DeleteOriginDiffers].Load(), UpdateDeleted: c.conflicts[conflict.UpdateDeleted].Load(),
		DeleteMissing: c.conflicts[conflict.DeleteMissing].Load(), MultipleUniqueConflicts: c.conflicts[conflict.MultipleUniqueConflicts].Load(),
		RetentionActive: c.retentionActive.Load(), RetentionStops: c.retentionStops.Load(),
		Tombstones: c.tombstones.Load(), TombstonesPurged: c.tombstonesPurged.Load(),
		SubAborts: c.subAborts.Load(), Aborts: c.aborts.Load(), Spooled: c.spooled.Load(),
		SerialTxns: c.serialTxns.Load(), QueueSpilled: c.queueSpilled.Load(),
		Sessions: c.sessions.Load(), SerialRetries: c.serialRetries.Load(), Deadlocks: c.deadlocks.Load(),
		AppliedLSN: decoding.LSN(c.appliedLSN.Load()),
	}
}

// rowCounts are the counters of rows and statements applied in one target transaction, added
// to the counters once it commits.
type rowCounts struct{ inserts, copyRows, updates, deletes, truncates int64 }

// count adds the rows of a target transaction that committed.
func (c *counters) count(r rowCounts) {
	c.inserts.Add(r.inserts)
	c.copyRows.Add(r.copyRows)
	c.updates.Add(r.updates)
	c.deletes.Add(r.deletes)
	c.truncates.Add(r.truncates)
}

// applied records that a transaction ending at end committed on the target.
func (c *counters) applied(end decoding.LSN) {
	for {
		old := c.appliedLSN.Load()
		if uint64(end) <= old || c.appliedLSN.CompareAndSwap(old, uint64(end)) {
			return
		}
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
