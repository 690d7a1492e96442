// Package spill stores per-transaction logs of opaque records on disk, with checksummed framing,
// truncation to an earlier record boundary, bounded-memory reading and a file-descriptor budget.
//
// It is the disk layer of the reorder buffer: one [Log] per spilled transaction, records appended
// in arrival order, cut back with [Log.Truncate] when a subtransaction rolls back, read back in
// order with a [Reader] at commit, and removed afterwards. It knows nothing about pgoutput.
//
// # Contract
//
//   - [Open] creates a private directory for the [Store] under [Options].Dir and removes what earlier,
//     dead processes left there (only names spill itself makes; never foreign files). Two live stores
//     may share a directory.
//   - [Log.Append] copies the record into a write buffer shared by all logs of the store, or writes
//     it straight through when it does not fit. [Log.Size] is the logical end of the log including
//     buffered bytes; it is always a record boundary, and [Log.Truncate] accepts any value Size
//     returned earlier for that log (as long as the log has not been truncated below it since).
//   - [Log.NewReader] flushes the log and returns a [Reader] over the records [0, Size()). Reading
//     uses one fixed buffer of [Options].BufferSize plus, for records larger than it, one buffer of
//     the largest record. The slice returned by [Reader.Next] is valid until the next call to Next
//     or Close.
//   - Files are opened lazily and at most [Options].MaxOpenFiles stay open; the least recently used
//     is closed when the budget is reached, so any number of logs work under a low fd limit.
//   - Errors stick: after a write, flush, sync, truncate or close of a log's file fails, every later
//     call on that log (and a reader of it) returns that error, and a record that was not completely
//     written is never returned. The call that runs into an I/O error returns it, even when the
//     error is another log's: writing the records another log has in the shared write buffer, or
//     closing its file to free a descriptor. Such an error comes as a [*LogError] naming that log;
//     it sticks to that log, and the call has no effect on its own. Corrupt or torn data gives a
//     [*CorruptError] (errors.Is(err, [ErrCorrupt])).
//   - [Store.Close] removes every file the store made and is safe to call twice. Spill files are not
//     fsynced unless [Options].Sync is set: they die with the process, so durability buys nothing.
//   - A Store, its Logs and Readers must not be used from several goroutines at once.
//
// # File format
//
// Each log is one file, read only by the process that wrote it, so the format is an internal
// detail that may change from one build to the next. All integers are little-endian.
//
//	file:    +--------------+-------------------+---------+---------+-----
//	         | magic (4B)   | format version 4B | record  | record  | ...
//	         | "PGRS"       | uint32 = 1        |         |         |
//	         +--------------+-------------------+---------+---------+-----
//	         '----------- header: 8 bytes ------'
//
//	record:  +--------------+-------------------+---------------------------+
//	         | CRC-32C (4B) | length (4B)       | payload (length bytes)    |
//	         | uint32       | uint32            |                           |
//	         +--------------+-------------------+---------------------------+
//	         '-- frame header: 8 bytes ---------'
//	                        '------------- covered by the CRC --------------'
//
// The CRC-32C (Castagnoli) covers the 4 length bytes and the payload, so a torn or overwritten
// length is detected as well as a damaged payload. Offsets given to and returned by
// [Log.Size] and [Log.Truncate] are logical: they count record bytes only, so an empty log has
// Size 0 and the record at logical offset o starts at file offset 8+o.
// [CorruptError].Offset is a file offset, for use with a hex dump.
//
// # File names
//
// A store lives in <Dir>/pgreorder-spill-<pid>-<16 hex digits>/ and holds an exclusive flock(2)
// on <Dir>/pgreorder-spill-<pid>-<16 hex digits>.lock while open. Its logs are named
// log-<decimal sequence>.spill. A store directory or lock file whose lock can be taken is stale.
package spill
