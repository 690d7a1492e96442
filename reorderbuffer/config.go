package reorderbuffer

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/vfs"
)

// DefaultWorkMem is the memory limit used when Config.WorkMem is 0: PostgreSQL's default for
// logical_decoding_work_mem, 64MB.
const DefaultWorkMem int64 = 64 << 20

// SpillEverything, as Config.WorkMem, keeps no transaction data in memory: every record is written
// to the transaction's spill log as soon as it arrives (PostgreSQL's own minimum for
// logical_decoding_work_mem is 64kB). ParseWorkMem returns it for "none".
const SpillEverything int64 = -1

// Config configures a Buffer. The zero value is ready to use: 64 MiB of memory, spill files in
// os.TempDir(), protocol details detected from the stream.
type Config struct {
	// WorkMem is the most bytes of transaction data held in memory, like PostgreSQL's
	// logical_decoding_work_mem. 0 means DefaultWorkMem; SpillEverything means none.
	// Beyond the limit the transaction with the most bytes in memory is spilled to disk.
	WorkMem int64

	// Memory, when set, is a limit the Buffer shares with its consumer (see Memory): the
	// Buffer's records and the bytes the consumer took count against it together, and the
	// Buffer spills as soon as the two exceed it. WorkMem must then be 0 (or the same limit):
	// the limit is Memory's.
	Memory *Memory

	// Dir is the directory that holds spill files; "" means os.TempDir(). New makes the buffer's
	// own subdirectory there (removing those that dead processes left behind, and nothing else);
	// Close removes it.
	Dir string

	// FS is the file system for spill files; nil means the operating system's (vfs.OS). Tests
	// inject faults with package vfs/faultfs.
	FS vfs.FS

	// SpillCompressor compresses spill files, one block of records (up to 256 KiB) at a time; nil
	// writes them uncompressed. A block below 128 bytes, or one that compressing would shrink
	// by less than an eighth, is written as it is. The core has no compressor of its own:
	// package spillcompress has them (spillcompress.Default, S2, leaves about a quarter of the bytes
	// on the benchmark workloads, for 4-13% more CPU time per change when every change spills
	// and is read back once). Stats.SpillBytes counts the records written,
	// Stats.SpillWrittenBytes what reached the files.
	SpillCompressor spill.Compressor

	// MaxOpenFiles bounds the spill files kept open at once; 0 derives it from the process's
	// file descriptor limit (see package spill). Any number of transactions can be spilled
	// whatever the bound: the least recently used files are closed and opened again.
	MaxOpenFiles int

	// Decoding describes the negotiated protocol (version, and whether Stream Abort carries the
	// protocol 4 abort LSN and time). The zero value accepts every version and detects the rest.
	Decoding decoding.Options

	// Incremental hands transactions out in parts as they arrive instead of whole at their
	// commit: a streamed transaction's changes at the end of each stream block (or every few
	// hundred kilobytes), a plain transaction's as it arrives, then what to undo (a
	// subtransaction or the whole transaction) or the commit, each as a Txn with its Part set.
	// Inside a streamed transaction every change carries the xid of the subtransaction that wrote
	// it, so that a consumer can take a savepoint before each subtransaction's first change. See
	// PartKind. Prepared transactions are handed out in parts up to their PREPARE, then held until
	// COMMIT PREPARED.
	Incremental bool

	// HandOutAdvances makes the consumer confirm idle advances itself. Without it, when nothing is
	// pending the flush position moves on to the last keepalive position by itself (so that an
	// idle slot, or one whose WAL holds nothing published, does not pin WAL), past any position
	// the consumer persisted: after a crash the slot may then be ahead of the consumer's position
	// with nothing lost, and a slot ahead of it cannot tell lost transactions from skipped WAL.
	// With it, the flush position only ever moves to what the consumer acknowledged; the position
	// moves on through Advance entries instead, which the consumer persists and acknowledges like
	// transactions: see Buffer.QueueAdvance. A slot whose confirmed position is ahead of the
	// consumer's persisted position then means lost transactions.
	HandOutAdvances bool

	// SkipThrough is the consumer's last durable position: the end LSN of the last transaction it
	// applied before a restart. Transactions that end at or before it are dropped instead of being
	// handed out again, as PostgreSQL's subscriber does with its replication origin.
	SkipThrough decoding.LSN
}

func (c *Config) validate() error {
	if c.WorkMem < 0 && c.WorkMem != SpillEverything {
		return fmt.Errorf("reorderbuffer: invalid WorkMem %d (want bytes, 0 for the default, or SpillEverything)", c.WorkMem)
	}
	if own := (Config{WorkMem: c.WorkMem}); c.Memory != nil && c.WorkMem != 0 && own.limit() != c.Memory.limit {
		return fmt.Errorf("reorderbuffer: WorkMem %d and a shared Memory of %d bytes: set one limit (WorkMem 0 takes Memory's)", c.WorkMem, c.Memory.limit)
	}
	if c.MaxOpenFiles < 0 {
		return fmt.Errorf("reorderbuffer: invalid MaxOpenFiles %d", c.MaxOpenFiles)
	}
	return nil
}

func (c *Config) limit() int64 {
	switch {
	case c.Memory != nil:
		return c.Memory.limit
	case c.WorkMem == 0:
		return DefaultWorkMem
	case c.WorkMem < 0:
		return 0
	default:
		return c.WorkMem
	}
}

// ParseWorkMem parses a memory limit written as PostgreSQL writes logical_decoding_work_mem:
// a positive number with an optional unit B, kB, MB, GB or TB (multiples of 1024, as in
// PostgreSQL; KiB, MiB, GiB and TiB are accepted too). A bare number is in kilobytes, as in
// postgresql.conf. "none" keeps nothing in memory (SpillEverything); "unlimited" never spills.
// "0" is rejected: as Config.WorkMem it would mean the default, which is not what anyone writing
// it means. The result is a valid Config.WorkMem.
func ParseWorkMem(s string) (int64, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "unlimited", "inf", "infinity":
		return math.MaxInt64, nil
	case "none":
		return SpillEverything, nil
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("reorderbuffer: invalid memory size %q (want a number with a unit such as 64kB or 1MB; a bare number is kB; \"none\" or \"unlimited\")", s)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reorderbuffer: invalid memory size %q: %w", s, err)
	}
	var mult int64
	switch strings.TrimSpace(s[i:]) {
	case "B":
		mult = 1
	case "", "kB", "KB", "KiB":
		mult = 1 << 10
	case "MB", "MiB":
		mult = 1 << 20
	case "GB", "GiB":
		mult = 1 << 30
	case "TB", "TiB":
		mult = 1 << 40
	default:
		return 0, fmt.Errorf("reorderbuffer: invalid memory unit in %q (want B, kB, MB, GB or TB)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("reorderbuffer: memory size %q too large", s)
	}
	if n == 0 {
		return 0, fmt.Errorf("reorderbuffer: memory size %q is zero: write \"none\" to keep nothing in memory, or a size such as 64MB", s)
	}
	return n * mult, nil
}
