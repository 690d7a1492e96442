// Package reorderbuffer reassembles PostgreSQL's streamed logical replication transactions and
// hands back committed transactions, whole and in commit order, while holding at most
// logical_decoding_work_mem bytes of transaction data in memory.
//
// It is the client-side counterpart of the server's reorderbuffer.c: with streaming on, the
// server sends large transactions while they run, interleaved with each other and with small
// transactions, including subtransactions that later roll back and transactions that later
// abort. A Buffer keeps, per top-level transaction, an append-only log of the raw pgoutput
// records and the position where each subtransaction first wrote (as PostgreSQL's own
// subscriber does in worker.c); a subtransaction's Stream Abort cuts the log back to that
// position, a top-level Stream Abort drops the transaction, and Stream Commit (or Commit, or
// COMMIT PREPARED) hands it out. When the records in memory exceed the limit, the transaction
// with the most bytes in memory, chosen with a pairing heap as in PostgreSQL 17+, is appended
// to its spill log on disk (package spill) and its memory freed.
//
// # The contract
//
//   - Nothing lost, nothing invented: the transactions handed out are exactly those the server
//     would have sent with streaming off, with the same changes in the same order, in commit
//     order. Transactions whose changes were all rolled back are handed out empty: they still
//     carry an end LSN to acknowledge.
//   - Memory: the record bytes in memory (Stats.MemoryBytes: the capacity of the chunks that
//     hold records, plus free chunks kept for reuse, at most min(WorkMem, 64 MiB)) never exceed
//     Config.WorkMem: room is made, by spilling, before a chunk is allocated. The only excess is
//     a single record larger than the limit, which is spilled right after it arrives. A
//     transaction handed out by Next stays counted but is no longer spilled while the consumer
//     reads it. Bookkeeping outside the limit is small and bounded: about 200 bytes per open
//     transaction (350 once it has a spill log), about 4 bytes per subtransaction that wrote
//     (Stats.OverheadBytes), the spill store's shared 256 KiB write buffer and, while a spilled
//     transaction is read, one 256 KiB read buffer.
//   - Errors: bad bytes and protocol violations give an *InputError wrapping the decoding
//     package's typed errors; a spill I/O error is returned by the call that hit it. After any
//     error the Buffer refuses input (ErrFailed) rather than hand out a transaction with holes.
//   - No goroutines, no clock, no network: the Buffer is driven by calls, so it is deterministic
//     under test. It is not safe for concurrent use.
//
// # Usage
//
// The loop of a consumer (package replication runs it on a live connection):
//
//  1. For each XLogData message, call Add with its LSN and payload; for each primary keepalive,
//     call Keepalive with its walEnd.
//  2. Call Next until it returns false; for each transaction, read its Changes and apply them.
//     A transaction's changes can be read until the next call to Next or Close.
//  3. Once a transaction is durably applied, call Ack. Transactions may be acknowledged out of
//     order, and later than Next.
//  4. Periodically send FlushPosition to the server as the flush position of a standby status
//     update. Never report a position past a transaction that is not acknowledged: the server
//     skips transactions that commit before the confirmed position when it resumes, so they
//     would be lost. After a restart, start replication at the last durable position and pass
//     it as Config.SkipThrough, so that transactions the server sends again are not handed out
//     twice.
//
// # Buffer ownership
//
// Add copies what it keeps: the caller may reuse data when Add returns (pgconn reuses its
// receive buffer). Messages yielded by Txn.Changes, and the byte slices inside them, alias the
// buffer's memory or read buffer and are valid only until the next iteration step. A Txn's
// fields are plain values and stay valid for good.
package reorderbuffer
