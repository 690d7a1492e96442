// Package spill stores per-transaction logs of opaque records on disk, with checksummed framing,
// truncation to an earlier record boundary, bounded-memory reading and a file-descriptor budget.
//
// It is the disk layer of the reorder buffer: one [Log] per spilled transaction, records appended
// in arrival order, cut back with [Log.Truncate] when a subtransaction rolls back, read back in
// order with a [Reader] at commit, and removed afterwards. It knows nothing about pgoutput.
//
// # Contract
//
//   - [Open] creates a private directory for the [Store] under [Options].Dir and removes what
//     earlier, dead processes of the same user left there (only names spill itself makes; never
//     foreign files). Two live stores may share a directory, and so may hostile users: see
//     "Sharing the directory".
//   - [Log.Append] copies the record into a write buffer shared by all logs of the store, or writes
//     it straight through when it does not fit; [Log.AppendFramed] copies many records, already
//     framed, at once. [Log.Size] is the logical end of the log including
//     buffered bytes; it is always a record boundary, and [Log.Truncate] accepts any value Size
//     returned earlier for that log (as long as the log has not been truncated below it since).
//   - [Log.NewReader] flushes the log and returns a [Reader] over the records [0, Size()). Reading
//     uses one fixed buffer of [Options].BufferSize plus, for records larger than it, one buffer of
//     the largest record; with [Options].Compressor, also the compressed bytes of one block. The slice
//     returned by [Reader.Next] is valid until the next call to Next or Close.
//   - Files are opened lazily and at most [Options].MaxOpenFiles stay open (by default a quarter of
//     the soft RLIMIT_NOFILE, at most [DefaultMaxOpenFiles]). The least recently used is closed
//     when the budget is reached, and when opening a file fails with EMFILE or ENFILE, so any
//     number of logs work under a low descriptor limit. Besides its logs' files a store holds
//     three descriptors: [Options].Dir, its own directory and its lock file.
//   - Errors stick: after a write, flush, sync, truncate or close of a log's file fails, every later
//     call on that log (and a reader of it) returns that error, and a record that was not completely
//     written is never returned. The call that runs into an I/O error returns it, even when the
//     error is another log's: writing the records another log has in the shared write buffer, or
//     closing its file to free a descriptor. Such an error comes as a [*LogError] naming that log;
//     it sticks to that log, and the call has no effect on its own. Corrupt or torn data gives a
//     [*CorruptError] (errors.Is(err, [ErrCorrupt])).
//   - [Store.Close] removes every file the store made and is safe to call twice. Spill files are not
//     fsynced unless [Options].Sync is set: they die with the process, so durability buys nothing.
//   - A Store, its Logs and Readers must not be used from several goroutines at once, with one
//     exception: a Reader of [Log.OpenReader] holds the log's file and a read buffer of its own and
//     reads nothing else, so it may be read on another goroutine while the store goes on, until its
//     Close (which hands them back, on the store's goroutine). Its file stays open outside
//     [Options].MaxOpenFiles meanwhile.
//
// # File format
//
// Each log is one file, read only by the process that wrote it, so the format is an internal
// detail that may change from one build to the next. All integers are little-endian.
//
//	file:    +--------------+-------------------+---------+---------+-----
//	         | magic (4B)   | format version 4B | block   | block   | ...
//	         | "PGRS"       | uint32 = 3        |         |         |
//	         +--------------+-------------------+---------+---------+-----
//	         '----------- header: 8 bytes ------'
//
//	block:   +--------------+-------------------+------------------+------------------------+
//	         | CRC-32C (4B) | stored length 4B  | raw length (4B)  | stored bytes           |
//	         | uint32       | uint32            | uint32           | (stored length bytes)  |
//	         +--------------+-------------------+------------------+------------------------+
//	                        '------------------- covered by the CRC ---------------------'
//
//	raw:     +----------------+---------+----------------+---------+-----
//	         | length uvarint | payload | length uvarint | payload | ...
//	         +----------------+---------+----------------+---------+-----
//
// Each flush of the write buffer becomes one block, and a record larger than the buffer is a
// block of its own. The stored bytes are the raw bytes as they are, or, with [Options].Compressor,
// compressed. A stored length equal to the raw length is the flag of a block stored as it is
// (a compressed block is always shorter), covered by the CRC like the rest of the header, so it
// takes no byte of its own and needed no new format version. With a codec a block is stored as
// it is when it has fewer than 128 raw bytes (the codec is not tried on so few), or when
// compressing fails or saves less than an eighth of its bytes (not worth a decompression on
// reading). A record's length is an
// unsigned varint (encoding/binary's AppendUvarint: 1 byte below 128, 2 below 16384), the framing
// of [Log.AppendFramed], which lets a caller that keeps its records framed that way (the reorder
// buffer does) hand over many at once, written with one copy into the write buffer.
//
// One CRC-32C (Castagnoli) covers a block: its lengths and what is stored, so a torn or
// overwritten length is detected as well as damaged bytes, and the records inside carry only
// their length. It is computed once per block on write and checked once per block on read,
// before any of the block's records is returned. A damaged block (CRC, lengths, stored bytes that
// do not decompress to the raw length, or records that do not end at the block's end) gives a
// [*CorruptError] at the block's file offset, and none of its records is returned.
// [CorruptError].Offset is a file offset, for use with a hex dump.
//
// Offsets given to and returned by [Log.Size] and [Log.Truncate] are logical: they count raw
// bytes (a record takes its uvarint length plus its payload), so an empty log has Size 0.
// Truncation works at any record boundary, inside a block too. [Log.Truncate] to an offset still
// in the write buffer just shortens the buffer; to the start of a written block it cuts the file
// there. To an offset inside a written block, it reads that block, checks its CRC, decompresses
// it, cuts the file at the block's start and writes the records before the offset again, as a new
// block (compressed again) in its place; an offset that is not a record boundary is refused with
// [ErrInvalidOffset], without effect. The block is found from the last block's position, which
// the log keeps, or else by reading the block headers from the start of the file (a cut into an
// earlier block is a rare event: a subtransaction that rolled back after more than a buffer of
// later records was spilled). A damaged block met there, or an I/O error while writing the new
// block (ENOSPC), sticks to the log like any other, so a torn block is never read.
//
// # Compression
//
// The codec is an interface because this package imports only the standard library: package
// spillcompress has LZ4, S2 and zstd. A block that does not compress well enough is stored as it
// is (see "File format"). Compression changes nothing else: the blocks, their CRC,
// truncation, the files, their descriptor budget and their names are the same with and without
// it. What the store wrote, after compression, is [Store.WrittenBytes]. A reader of a log with a
// codec holds, besides its read buffer, the compressed bytes of one block.
//
// # File names
//
// A store lives in <Dir>/pgreorder-spill-<pid>-<16 hex digits>/ (mode 0700). Inside it are its
// logs, log-<decimal sequence>.spill, and the file lock, on which the store holds an exclusive
// flock(2) while open. The lock file is made as lock.new and renamed to lock once locked, so that
// a cleanup never finds the lock of a live store free. A store directory whose lock can be taken is
// stale; one without a lock file is being made (or died while being made, with no logs) and is
// left alone. Where the system has no flock(2) (other than Linux, the BSDs, macOS and illumos) no
// store is ever taken for stale, and stale stores are not removed.
//
// # Sharing the directory
//
// The default [Options].Dir, os.TempDir(), is shared with every local user, and any of them may
// put anything there under any name, a store's names included. A store does not let such a
// co-tenant make it open, create, write or remove anything but its own files, even when it runs as
// root:
//
//   - Only the path given as [Options].Dir is followed through symbolic links. Every name below it
//     is a single path element opened relative to an open directory (openat(2) and its relatives)
//     without following a symbolic link, so a link planted under a store's name leads nowhere.
//   - In the shared directory a store makes one entry, its directory, and checks on the opened
//     descriptor that it is the one it made: a directory of the effective user's, closed to group
//     and others. The lock file and logs live inside it, where nobody else can add, rename or
//     remove a name.
//   - The cleanup at Open takes an entry with a store's name for a stale store only if, opened,
//     it is a directory of the effective user's that is not writable by group or others, and its
//     lock file is a regular file of the same user's that nobody holds locked. From it, it removes
//     the logs and the lock file, then the directory if that left it empty. A symbolic link, FIFO,
//     device, file or other user's directory under a store's name is left alone (a FIFO is never
//     opened in a way that could block), and so is every name a store does not make.
//   - Close removes the store's directory by name only if the name still is the directory it made.
//
// What a co-tenant can still do is fill the file system and, in a directory that others may write
// without the sticky bit (which /tmp has), rename a store's directory away or remove it while
// still empty: a denial of service, never access to the store's files. The logs are protected by
// their directory's permissions, not encrypted: root and the same user can read them.
//
// A store reaches its files through [Options].FS, a file system of package
// [github.com/pgreorder/pgreorder/vfs] (the operating system's by default). On Linux all of this
// works on directory descriptors. Elsewhere vfs.OS uses os.Root, which keeps every name inside
// its directory but follows a symbolic link that stays inside it: there, a
// co-tenant who replaces a name in the instant between a check and an open can make a store open
// another entry of the same directory, which the ownership checks still refuse unless it is the
// user's own.
package spill
