package apply

import (
	"sync/atomic"

	"github.com/pgreorder/pgreorder/decoding"
)

// LSN is a WAL position of the source.
type LSN = decoding.LSN

// Stats are an Applier's counters since it was made, over all its sessions.
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

	// Conflicts, as PostgreSQL's subscriber counts them: the row an UPDATE or DELETE names does
	// not exist on the target. The change is skipped and logged.
	UpdateMissing int64
	DeleteMissing int64

	SubAborts    int64 // subtransactions rolled back to their savepoint on the target (Eager, Parallel)
	Aborts       int64 // streamed transactions rolled back on the target (Eager, Parallel)
	Spooled      int64 // streamed transactions spooled for lack of a free worker (Eager, Parallel)
	SerialTxns   int64 // transactions Parallel applied alone (no usable key, TRUNCATE, triggers)
	QueueSpilled int64 // bytes of queued changes written to spill files (Eager, Parallel)

	Sessions      int64 // sessions started (the first, and one per retry)
	SerialRetries int64 // transactions retried alone after failing or deadlocking in parallel
	Deadlocks     int64 // lock waits between the Applier's own connections it broke

	AppliedLSN LSN // end LSN of the last transaction committed on the target
}

type counters struct {
	txns, emptyTxns, inserts, copyRows, updates, deletes, truncates atomic.Int64
	statements, roundTrips, updateMissing, deleteMissing            atomic.Int64
	subAborts, aborts, spooled, serialTxns, queueSpilled            atomic.Int64
	sessions, serialRetries, deadlocks                              atomic.Int64
	appliedLSN                                                      atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Txns: c.txns.Load(), EmptyTxns: c.emptyTxns.Load(), Inserts: c.inserts.Load(), CopyRows: c.copyRows.Load(),
		Updates: c.updates.Load(), Deletes: c.deletes.Load(), Truncates: c.truncates.Load(),
		Statements: c.statements.Load(), RoundTrips: c.roundTrips.Load(),
		UpdateMissing: c.updateMissing.Load(), DeleteMissing: c.deleteMissing.Load(),
		SubAborts: c.subAborts.Load(), Aborts: c.aborts.Load(), Spooled: c.spooled.Load(),
		SerialTxns: c.serialTxns.Load(), QueueSpilled: c.queueSpilled.Load(),
		Sessions: c.sessions.Load(), SerialRetries: c.serialRetries.Load(), Deadlocks: c.deadlocks.Load(),
		AppliedLSN: LSN(c.appliedLSN.Load()),
	}
}

// applied records that a transaction ending at end committed on the target.
func (c *counters) applied(end LSN) {
	for {
		old := c.appliedLSN.Load()
		if uint64(end) <= old || c.appliedLSN.CompareAndSwap(old, uint64(end)) {
			return
		}
	}
}
