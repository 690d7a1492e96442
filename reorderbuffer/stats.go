package reorderbuffer

import (
	"unsafe"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/spill"
)

// Stats are the buffer's counters. The first eight are named and counted like the columns of
// PostgreSQL's pg_stat_replication_slots, for the client side of the stream.
type Stats struct {
	SpillTxns   int64 // transactions spilled to disk at least once
	SpillCount  int64 // times a transaction was spilled (one transaction may be spilled many times)
	SpillBytes  int64 // bytes of records written to spill logs, with their framing, before compression
	StreamTxns  int64 // streamed transactions received (first segments)
	StreamCount int64 // stream blocks received (Stream Start messages)
	StreamBytes int64 // bytes of messages received inside stream blocks
	TotalTxns   int64 // committed transactions handed to the queue
	TotalBytes  int64 // pgoutput bytes of those transactions

	TotalChanges  int64 // changes (and transactional messages) of those transactions
	SpillBytesNow int64 // bytes in spill logs now, of transactions held, queued or handed out (before compression)
	// SpillWrittenBytes is what was written to spill files: SpillBytes after compression
	// (Config.SpillCompressor), with file and block headers, and the parts of blocks a
	// subtransaction abort cut into written again.
	SpillWrittenBytes int64

	MemoryBytes     int64 // bytes of transaction records in memory now
	PeakMemoryBytes int64 // highest MemoryBytes so far
	OverheadBytes   int64 // bookkeeping outside the limit: per-transaction state and subtransaction lists
	OpenTxns        int   // transactions received but not yet committed or aborted (prepared ones included)
	QueuedTxns      int   // committed transactions not yet handed out by Next

	// UnackedTxns counts transactions queued or handed out and not yet part of the acknowledged
	// prefix (acknowledged out of order ones included). Each costs 16 bytes until then: a
	// consumer that never acknowledges grows it without bound and holds the slot's WAL.
	UnackedTxns int
	// OldestUnackedLSN is the end LSN of the oldest transaction not acknowledged (0 if none).
	OldestUnackedLSN decoding.LSN
	// AckedThrough is the acknowledged prefix (see Buffer.AckedThrough).
	AckedThrough decoding.LSN
	// ReceivedLSN is the highest position known to be received in full.
	ReceivedLSN decoding.LSN
	// FlushLagBytes is ReceivedLSN minus the last flush position returned: WAL the server keeps
	// for the consumer.
	FlushLagBytes int64

	AbortedTxns     int64 // transactions dropped by Stream Abort or ROLLBACK PREPARED
	AbortedSubxacts int64 // subtransaction aborts that cut a transaction back
	RestartedTxns   int64 // transactions dropped because the server sent them again from the start
	SkippedTxns     int64 // transactions dropped because they end at or before the skip position
}

// xactOverhead is what one open transaction costs outside its records, subtransaction list and
// schema entries: the struct itself and its entry in the map of open transactions (measured on
// the Go heap by TestManyOpenTransactions and bench's BenchmarkOpenTxns).
const xactOverhead = int64(unsafe.Sizeof(xact{})) + 32

// logOverhead is what a spill log costs in memory while it exists: the spill package's Log
// (measured likewise). The descriptor budget bounds the open files whatever the number of logs.
const logOverhead = int64(unsafe.Sizeof(spill.Log{}))

// Stats returns the current counters. It walks the open transactions, so it costs O(open
// transactions): call it for monitoring, not per message. Like the other methods it may run
// while a handed-out transaction is read on another goroutine.
func (b *Buffer) Stats() Stats {
	s := b.stats
	s.MemoryBytes = b.pool.mem
	if b.store != nil {
		s.SpillWrittenBytes = b.store.WrittenBytes()
	}
	s.PeakMemoryBytes = b.pool.peak
	s.OpenTxns = len(b.xacts)
	s.QueuedTxns = len(b.queue)
	s.UnackedTxns = len(b.prog.pending) - b.prog.head
	s.OldestUnackedLSN = b.prog.oldestUnacked()
	s.AckedThrough = b.prog.acked
	s.ReceivedLSN = b.prog.received
	s.FlushLagBytes = int64(b.prog.received) - int64(b.prog.reported)
	s.OverheadBytes = int64(cap(b.prog.pending)) * int64(unsafe.Sizeof(ackEntry{}))
	onDisk := func(t *xact) {
		for ; t != nil; t = t.replaced() {
			if t.log != nil {
				s.SpillBytesNow += t.log.Size()
			}
		}
	}
	for _, x := range b.queue {
		onDisk(x.data)
	}
	if b.lent != nil && !b.lent.released {
		onDisk(b.lent.data)
	}
	for _, t := range b.xacts {
		onDisk(t)
		s.OverheadBytes += xactOverhead
		if t.subs != nil {
			s.OverheadBytes += t.subs.overhead()
		}
		if t.log != nil {
			s.OverheadBytes += logOverhead
		}
		if t.meta != nil {
			s.OverheadBytes += int64(unsafe.Sizeof(xactMeta{}))
		}
		if t.inc != nil {
			s.OverheadBytes += int64(unsafe.Sizeof(xactParts{}))
			if t.inc.handed != nil {
				s.OverheadBytes += t.inc.handed.overhead()
			}
		}
		s.OverheadBytes += int64(cap(t.schema)) * int64(unsafe.Sizeof(schemaEntry{}))
	}
	return s
}

// Plus returns s with the counters of o added (spills, streams, transactions, changes and bytes
// handed out, aborts, restarts, skips, bytes written to spill files) and PeakMemoryBytes the
// higher of both: the figures of a consumer that read one buffer after another, such as the
// streams of successive connections. The gauges (memory and spill bytes now, overhead,
// transactions open, queued and unacknowledged, positions, lag) are s's.
func (s Stats) Plus(o Stats) Stats {
	s.SpillTxns += o.SpillTxns
	s.SpillCount += o.SpillCount
	s.SpillBytes += o.SpillBytes
	s.SpillWrittenBytes += o.SpillWrittenBytes
	s.StreamTxns += o.StreamTxns
	s.StreamCount += o.StreamCount
	s.StreamBytes += o.StreamBytes
	s.TotalTxns += o.TotalTxns
	s.TotalBytes += o.TotalBytes
	s.TotalChanges += o.TotalChanges
	s.AbortedTxns += o.AbortedTxns
	s.AbortedSubxacts += o.AbortedSubxacts
	s.RestartedTxns += o.RestartedTxns
	s.SkippedTxns += o.SkippedTxns
	s.PeakMemoryBytes = max(s.PeakMemoryBytes, o.PeakMemoryBytes)
	return s
}
