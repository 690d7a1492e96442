package reorderbuffer

import "unsafe"

// Stats are the buffer's counters. The first eight are named and counted like the columns of
// PostgreSQL's pg_stat_replication_slots, for the client side of the stream.
type Stats struct {
	SpillTxns   int64 // transactions spilled to disk at least once
	SpillCount  int64 // times a transaction was spilled (one transaction may be spilled many times)
	SpillBytes  int64 // bytes written to spill logs
	StreamTxns  int64 // streamed transactions received (first segments)
	StreamCount int64 // stream blocks received (Stream Start messages)
	StreamBytes int64 // bytes of messages received inside stream blocks
	TotalTxns   int64 // committed transactions handed to the queue
	TotalBytes  int64 // pgoutput bytes of those transactions

	MemoryBytes     int64 // bytes of transaction records in memory now
	PeakMemoryBytes int64 // highest MemoryBytes so far
	OverheadBytes   int64 // bookkeeping outside the limit: per-transaction state and subtransaction lists
	OpenTxns        int   // transactions received but not yet committed or aborted (prepared ones included)
	QueuedTxns      int   // committed transactions not yet handed out by Next

	AbortedTxns     int64 // transactions dropped by Stream Abort or ROLLBACK PREPARED
	AbortedSubxacts int64 // subtransaction aborts that cut a transaction back
	RestartedTxns   int64 // streamed transactions dropped because the server sent them again from the start
	SkippedTxns     int64 // transactions dropped because they end at or before Config.SkipThrough
	UnknownPrepared int64 // COMMIT PREPARED for a transaction the buffer did not hold
}

// txnOverhead is what one open transaction costs outside its records and subtransaction list:
// the struct itself and its map entry.
const txnOverhead = int64(unsafe.Sizeof(txn{})) + 16

// logOverhead approximates what a spill log costs in memory while it exists: the spill
// package's Log and its file name. The descriptor budget keeps at most 256 files open whatever
// the number of logs.
const logOverhead = 160

// Stats returns the current counters. It walks the open transactions, so it costs O(open
// transactions): call it for monitoring, not per message.
func (b *Buffer) Stats() Stats {
	s := b.stats
	s.MemoryBytes = b.mem
	s.OpenTxns = len(b.txns)
	s.QueuedTxns = len(b.queue)
	for _, t := range b.txns {
		s.OverheadBytes += txnOverhead
		if t.subs != nil {
			s.OverheadBytes += t.subs.overhead()
		}
		if t.log != nil {
			s.OverheadBytes += logOverhead
		}
		if t.meta != nil {
			s.OverheadBytes += int64(unsafe.Sizeof(txnMeta{}))
		}
	}
	return s
}
