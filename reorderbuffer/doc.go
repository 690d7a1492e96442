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
//     a single record larger than the limit, which is spilled right after it arrives. With
//     Config.Memory the limit is shared with the consumer's own bytes (Memory.Take): the Buffer
//     spills as soon as the two together pass it, and passes it only by what it cannot spill at
//     that moment (the transactions it handed out and the consumer still reads or keeps, the
//     chunk it fills). A transaction handed out by Next stays counted but is no longer spilled
//     while the consumer reads it, and so does one the consumer keeps (Txn.Keep) until it
//     releases it. Bookkeeping outside the limit is small and bounded: 210 bytes per open
//     transaction, 128 more once it has a spill log, about 4 bytes per subtransaction that wrote,
//     32 bytes per relation description a transaction carries (one copy of each description is
//     shared by all), 16 bytes per transaction handed out and not yet acknowledged
//     (Stats.OverheadBytes, checked against the Go heap by the tests), the spill store's shared
//     256 KiB write buffer and, while a spilled transaction is handed out, one 256 KiB read
//     buffer and one file descriptor outside Config.MaxOpenFiles. An open streamed transaction
//     that wrote one relation therefore costs at most about 370 bytes beyond the limit: 100,000
//     of them 37 MB (bench's BenchmarkOpenTxns measures it on the Go heap). With
//     Config.SpillCompressor, a reader of a spilled transaction also holds the compressed bytes of
//     one block (at most 256 KiB).
//   - Errors: bad bytes and protocol violations give an *InputError wrapping the decoding
//     package's typed errors; a spill I/O error is returned by the call that hit it. The end or
//     the continuation of a transaction whose beginning never arrived (a COMMIT PREPARED, a
//     Stream Commit, a stream continued) is a *MissingError unless it ends at or before the skip
//     position: its changes were lost upstream. A Begin for a transaction whose streamed part is
//     open (a new session fed without Restart) is rejected at that Begin with ErrProtocol,
//     unless the transaction commits before the skip position. After any error the Buffer
//     refuses input (ErrFailed) rather than hand out a transaction with holes.
//   - Schema: Relation and Type messages take effect in stream order, whatever the consumer
//     does between Add and Next: a transaction's descriptions take effect for the others when it
//     commits (a prepared transaction's at its PREPARE, as pgoutput assumes; an aborted one's
//     never), including transactions dropped by the skip position. Each change a transaction
//     yields comes with its relation and a schema (decoding.Change) as of its own position: the
//     schema in effect before the transaction, then the transaction's own descriptions up to the
//     change.
//   - No goroutines, no clock, no network: the Buffer is driven by calls, so it is deterministic
//     under test. It is not safe for concurrent use: call its methods from one goroutine, or
//     under one lock. A transaction it handed out is not part of it: the Txn owns its records,
//     its spill log's reader (opened by Next, with a file and a read buffer of its own) and the
//     schema it resolves against, so its Changes may be read on another goroutine while the
//     Buffer is used (Add, Ack, Stats, FlushPosition...), until the Next or Close that releases
//     it. A replication client thus keeps sending status updates, and monitoring reads Stats,
//     while its consumer works. A transaction in memory can also be kept past the next Next
//     (Txn.Keep): it is then read, and let go of (Txn.Release), on any goroutine while the
//     Buffer hands out more, and the Buffer frees what it held at its next Add or Next. Workers
//     thus read the transactions, or parts, they apply where the Buffer holds them.
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
//     update. It never passes a transaction that is not acknowledged (the server skips
//     transactions that commit before the confirmed position when it resumes, so they would be
//     lost), a prepared transaction held or handed out and not acknowledged (its PREPARE, which
//     the server would not send again), or what was received.
//
// # Resuming
//
// The position a consumer persists is AckedThrough, the acknowledged prefix: with out-of-order
// acknowledgements the highest end LSN acknowledged would skip earlier transactions for good.
//
// After a crash, start replication at the slot's own confirmed position (START_REPLICATION with
// 0/0), never at the consumer's position: the server then sends again the PREPAREs the buffer
// pinned. Pass the consumer's last durable position as Config.SkipThrough: it is a filter, and
// the transactions the server sends again that end at or before it are dropped (their schema
// still takes effect). Starting replication past a PREPARE whose COMMIT PREPARED comes later
// loses that transaction; the buffer reports it with a MissingError instead of handing out an
// empty transaction.
//
// # Idle advances
//
// When nothing is pending, the flush position follows the keepalives, so that a slot whose WAL
// holds nothing published does not pin WAL on the server. The consumer never sees those
// positions, so after a crash the slot's confirmed position may be ahead of the last position the
// consumer persisted, harmlessly, and a slot ahead of it tells nothing: transactions may have been
// acknowledged and lost (the consumer did not have them durably), or not. Config.HandOutAdvances
// makes that distinction possible: the flush position then moves only to what the consumer
// acknowledged, and QueueAdvance (called by the driver of the buffer, as often as it finds an
// idle position worth persisting) queues an Advance to the keepalive position when nothing is
// pending. The consumer persists an Advance's EndLSN like a transaction's and acknowledges it.
// Its persisted position then never falls behind the confirmed position, and a slot found ahead
// of it after a restart means that something acknowledged was lost.
//
// After a lost connection, keep the Buffer and call Restart before feeding the new session:
// transactions already complete stay (queued, handed out, held prepared), those still being
// received are dropped, and what the server sends again is not handed out twice.
//
// Stats reports what a consumer that never acknowledges costs: UnackedTxns (16 bytes each until
// acknowledged, and WAL the server keeps), OldestUnackedLSN and FlushLagBytes.
//
// # Handing out transactions in parts
//
// With Config.Incremental the buffer hands a transaction out as it arrives instead of whole at its
// commit, for consumers that apply changes early (PostgreSQL's parallel apply of streamed
// transactions): Next returns parts, each a Txn whose Part says what it is. PartChanges carries
// the changes received since the transaction's previous part (at the end of each stream block,
// or every few hundred kilobytes); PartSubAbort names a subtransaction to undo, from its first
// change on, when some of its changes were already handed out; PartAbort says to undo everything
// handed out (an abort, a ROLLBACK PREPARED, the server sending the transaction again after a
// restart, or a commit at or before the skip position); PartCommit carries the last changes and
// the commit, in commit order, and is the one acknowledged. Inside a streamed transaction each
// change carries the xid of the subtransaction that wrote it, so a consumer takes a savepoint
// before each subtransaction's first change and rolls back to it on PartSubAbort. Parts waiting
// to be handed out are counted and spilled like whole transactions. A plain transaction arrives
// as one PartCommit unless it is large.
//
// # Buffer ownership
//
// Add copies what it keeps: the caller may reuse data when Add returns (pgconn reuses its
// receive buffer).
//
// Txn.Heads yields the same messages with each Insert, Update and Delete read only as far as its
// relation, for a consumer that routes the records and parses each where it applies it.
//
// Messages yielded by Txn.Changes (and Txn.Heads), and every byte slice and tuple inside them, alias the
// buffer's memory, its read buffer or a reused message struct, and are valid ONLY until the next
// iteration step, like bufio.Scanner.Bytes (so is the Change's Schema; the relations and types
// it resolves to, and Change.Relation, stay valid). Keep one longer with its Clone method. A Txn's
// changes can be read until the next Next or Close releases it; afterwards (also from inside the
// loop) reading yields ErrReleased. A Txn's exported fields are plain values and stay valid for
// good.
package reorderbuffer
