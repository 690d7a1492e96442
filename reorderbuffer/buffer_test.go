package reorderbuffer_test

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
	"github.com/stretchr/testify/require"
)

// enc encodes a message for the tests below.
func enc(t testing.TB, m decoding.Message, inStream bool) []byte {
	t.Helper()
	b, err := decoding.Append(nil, m, inStream, decoding.Options{})
	require.NoError(t, err)
	return b
}

// feed adds messages in order, failing the test on the first error.
func feed(t testing.TB, b *reorderbuffer.Buffer, msgs ...[]byte) {
	t.Helper()
	for i, m := range msgs {
		require.NoError(t, b.Add(decoding.LSN(0x100+i), m), "message %d", i)
	}
}

func streamTxn(t testing.TB, xid uint32, first bool, vals ...string) [][]byte {
	out := [][]byte{enc(t, &decoding.StreamStart{Xid: xid, FirstSegment: first}, false)}
	if first {
		out = append(out, enc(t, relation(1, xid), true))
	}
	for _, v := range vals {
		out = append(out, enc(t, insert(1, xid, v), true))
	}
	return append(out, enc(t, &decoding.StreamStop{}, true))
}

func streamCommit(t testing.TB, xid uint32, end decoding.LSN) []byte {
	return enc(t, &decoding.StreamCommit{Xid: xid, CommitLSN: end - 8, EndLSN: end, CommitTime: epoch}, false)
}

func plainTxn(t testing.TB, xid uint32, end decoding.LSN, vals ...string) [][]byte {
	out := [][]byte{enc(t, &decoding.Begin{FinalLSN: end - 8, CommitTime: epoch, Xid: xid}, false), enc(t, relation(1, 0), false)}
	for _, v := range vals {
		out = append(out, enc(t, insert(1, 0, v), false))
	}
	return append(out, enc(t, &decoding.Commit{CommitLSN: end - 8, EndLSN: end, CommitTime: epoch}, false))
}

func flat(parts ...[][]byte) [][]byte {
	var out [][]byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func newBuffer(t testing.TB, cfg reorderbuffer.Config) *reorderbuffer.Buffer {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	b, err := reorderbuffer.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

func values(t testing.TB, x *reorderbuffer.Txn) []string {
	t.Helper()
	var v []string
	for c, err := range x.Changes() {
		m := c.Msg
		require.NoError(t, err)
		if ins, ok := m.(*decoding.Insert); ok {
			v = append(v, string(ins.New[0].Data))
		}
	}
	return v
}

func TestFlushPosition(t *testing.T) {
	t.Run("idle slot follows keepalives", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		require.Zero(t, b.FlushPosition())
		b.Keepalive(0x5000)
		require.Equal(t, decoding.LSN(0x5000), b.FlushPosition())
	})
	t.Run("an unacknowledged transaction holds the position back", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		feed(t, b, plainTxn(t, 11, 0x3000, "b")...)
		b.Keepalive(0x9000)
		x1, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"a"}, values(t, x1))
		x2, ok := b.Next()
		require.True(t, ok)
		require.Zero(t, b.FlushPosition(), "nothing acknowledged yet")
		b.Ack(x2) // out of order: x1 still pending
		require.Zero(t, b.FlushPosition())
		b.Ack(x1)
		require.Equal(t, decoding.LSN(0x9000), b.FlushPosition(), "all acknowledged: keepalive position")
	})
	t.Run("a transaction being received holds keepalives back", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		x, _ := b.Next()
		b.Ack(x)
		feed(t, b, enc(t, &decoding.Begin{FinalLSN: 0x3000, CommitTime: epoch, Xid: 11}, false))
		b.Keepalive(0x9000)
		require.Equal(t, decoding.LSN(0x2000), b.FlushPosition())
	})
	t.Run("an open streamed transaction does not hold keepalives back", func(t *testing.T) {
		// The server sends a streamed transaction again from its start when it commits after
		// the confirmed position, as PostgreSQL's subscriber relies on.
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, streamTxn(t, 10, true, "a")...)
		b.Keepalive(0x9000)
		require.Equal(t, decoding.LSN(0x9000), b.FlushPosition())
	})
	t.Run("a held prepared transaction pins the position before its PREPARE", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, enc(t, &decoding.BeginPrepare{PrepareLSN: 0x4000, EndLSN: 0x4008, PrepareTime: epoch, Xid: 12, GID: "g"}, false),
			enc(t, relation(1, 0), false), enc(t, insert(1, 0, "p"), false),
			enc(t, &decoding.Prepare{PrepareLSN: 0x4000, EndLSN: 0x4008, PrepareTime: epoch, Xid: 12, GID: "g"}, false))
		feed(t, b, plainTxn(t, 13, 0x5000, "after")...)
		x, _ := b.Next()
		b.Ack(x)
		b.Keepalive(0x9000)
		require.Equal(t, decoding.LSN(0x4000), b.FlushPosition())
		feed(t, b, enc(t, &decoding.CommitPrepared{CommitLSN: 0x9100, EndLSN: 0x9108, CommitTime: epoch, Xid: 12, GID: "g"}, false))
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, "g", x.GID)
		require.Equal(t, []string{"p"}, values(t, x))
		require.Equal(t, decoding.LSN(0x4000), b.FlushPosition())
		b.Ack(x)
		require.Equal(t, decoding.LSN(0x9108), b.FlushPosition())
	})
	t.Run("SkipThrough drops what the consumer already applied", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0x3000})
		feed(t, b, plainTxn(t, 10, 0x2000, "old")...)
		feed(t, b, flat(streamTxn(t, 11, true, "old too"), [][]byte{streamCommit(t, 11, 0x3000)})...)
		feed(t, b, plainTxn(t, 12, 0x4000, "new")...)
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"new"}, values(t, x))
		_, ok = b.Next()
		require.False(t, ok)
		require.Equal(t, decoding.LSN(0x3000), b.FlushPosition())
		require.EqualValues(t, 2, b.Stats().SkippedTxns)
	})
}

func TestStreamEdgeCases(t *testing.T) {
	t.Run("first segment again discards the old state", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, streamTxn(t, 10, true, "a", "b")...)
		feed(t, b, streamTxn(t, 10, true, "a")...)
		feed(t, b, streamTxn(t, 10, false, "c")...)
		feed(t, b, streamCommit(t, 10, 0x2000))
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"a", "c"}, values(t, x))
		require.EqualValues(t, 1, b.Stats().RestartedTxns)
	})
	t.Run("stray aborts are no-ops", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, enc(t, &decoding.StreamAbort{Xid: 77, SubXid: 77}, false)) // never streamed (PostgreSQL 18)
		feed(t, b, streamTxn(t, 10, true, "a")...)
		feed(t, b, enc(t, &decoding.StreamStart{Xid: 10}, false), enc(t, &decoding.StreamStop{}, true))
		feed(t, b, enc(t, &decoding.StreamAbort{Xid: 10, SubXid: 99}, false)) // concurrent abort of an unseen subxact
		feed(t, b, streamCommit(t, 10, 0x2000))
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"a"}, values(t, x))
	})
	t.Run("a fully rolled back streamed transaction is handed out empty", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, enc(t, &decoding.StreamStart{Xid: 10, FirstSegment: true}, false),
			enc(t, relation(1, 11), true), enc(t, insert(1, 11, "gone"), true), enc(t, &decoding.StreamStop{}, true),
			enc(t, &decoding.StreamAbort{Xid: 10, SubXid: 11}, false), streamCommit(t, 10, 0x2000))
		x, ok := b.Next()
		require.True(t, ok)
		require.Empty(t, values(t, x))
		require.Equal(t, decoding.LSN(0x2000), x.EndLSN)
	})
	t.Run("a released transaction cannot be read", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		x, _ := b.Next()
		_, ok := b.Next()
		require.False(t, ok)
		for _, err := range x.Changes() {
			require.ErrorIs(t, err, reorderbuffer.ErrReleased)
		}
	})
	t.Run("schema of a skipped transaction still reaches later ones", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		// The second transaction relies on the relation described by the first.
		feed(t, b, enc(t, &decoding.Begin{FinalLSN: 0x2ff8, CommitTime: epoch, Xid: 11}, false),
			enc(t, insert(1, 0, "b"), false), enc(t, &decoding.Commit{CommitLSN: 0x2ff8, EndLSN: 0x3000, CommitTime: epoch}, false))
		_, _ = b.Next() // not read
		x, ok := b.Next()
		require.True(t, ok)
		for c, err := range x.Changes() {
			m := c.Msg
			require.NoError(t, err)
			found := c.Relation != nil && c.Relation.RelationID == m.(*decoding.Insert).RelationID
			require.True(t, found)
		}
	})
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs func(t *testing.T) [][]byte
		is   error
	}{
		{"empty message", func(t *testing.T) [][]byte { return [][]byte{{}} }, decoding.ErrTruncated},
		{"truncated insert", func(t *testing.T) [][]byte {
			m := plainTxn(t, 10, 0x2000, "a")
			m[2] = m[2][:7]
			return m
		}, decoding.ErrTruncated},
		{"unknown type", func(t *testing.T) [][]byte { return [][]byte{{'Z', 0, 0}} }, decoding.ErrUnknownMessage},
		{"change outside a transaction", func(t *testing.T) [][]byte {
			return [][]byte{enc(t, insert(1, 0, "a"), false)}
		}, decoding.ErrChangeOutsideTransaction},
		{"stream start inside a block", func(t *testing.T) [][]byte {
			s := streamTxn(t, 10, true, "a")
			return append(s[:len(s)-1], enc(t, &decoding.StreamStart{Xid: 11, FirstSegment: true}, false))
		}, decoding.ErrStreamStartInBlock},
		{"stream commit inside a block", func(t *testing.T) [][]byte {
			s := streamTxn(t, 10, true, "a")
			return append(s[:len(s)-1], streamCommit(t, 10, 0x2000))
		}, decoding.ErrFinishInBlock},
		{"continued stream never started", func(t *testing.T) [][]byte {
			return streamTxn(t, 10, false, "a")
		}, reorderbuffer.ErrProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuffer(t, reorderbuffer.Config{})
			var err error
			for i, m := range tc.msgs(t) {
				if err = b.Add(decoding.LSN(i), m); err != nil {
					break
				}
			}
			require.ErrorIs(t, err, tc.is)
			var ie *reorderbuffer.InputError
			require.ErrorAs(t, err, &ie)
			// Sticky: the buffer refuses further input.
			err = b.Add(0, enc(t, &decoding.StreamAbort{Xid: 1, SubXid: 1}, false))
			require.ErrorIs(t, err, reorderbuffer.ErrFailed)
			require.ErrorIs(t, err, tc.is)
		})
	}
}

func TestSpillFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule faultfs.Rule
	}{
		{"disk full", faultfs.Rule{Op: faultfs.OpWrite, Err: syscall.ENOSPC}},
		{"disk full mid-write", faultfs.Rule{Op: faultfs.OpWrite, Err: syscall.ENOSPC, Partial: true}},
		{"short write", faultfs.Rule{Op: faultfs.OpWrite, Partial: true}},
		{"cannot create", faultfs.Rule{Op: faultfs.OpOpen, Err: fs.ErrPermission}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ffs := faultfs.New(vfs.OS())
			ffs.Add(tc.rule)
			b, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: reorderbuffer.SpillEverything, Dir: dir, FS: ffs})
			require.NoError(t, err)
			var addErr error
			var vals []string
			for i := range 2000 {
				vals = append(vals, string(rune('a'+i%26)))
			}
			for _, m := range flat(streamTxn(t, 10, true, vals...), [][]byte{streamCommit(t, 10, 0x9000)}) {
				if addErr = b.Add(1, m); addErr != nil {
					break
				}
			}
			var readErr error
			if addErr == nil { // the fault may surface only when the log is read back
				x, ok := b.Next()
				require.True(t, ok)
				n := 0
				for _, err := range x.Changes() {
					if err != nil {
						readErr = err
						break
					}
					n++
				}
				require.Error(t, readErr, "a transaction with holes was handed out whole (%d records)", n)
			} else {
				require.ErrorIs(t, b.Add(1, streamCommit(t, 10, 0x9000)), reorderbuffer.ErrFailed)
			}
			require.NoError(t, b.Close())
			left, _ := filepath.Glob(filepath.Join(dir, "*", "*.spill"))
			require.Empty(t, left, "spill logs left after Close")
		})
	}
}

func TestManyOpenTransactions(t *testing.T) {
	// 20k open streamed transactions under a small limit: memory stays within it, every
	// transaction comes out whole, and the bookkeeping overhead is what the doc says.
	n := 20000
	if testing.Short() {
		n = 2000
	}
	const limit = 256 << 10
	b := newBuffer(t, reorderbuffer.Config{WorkMem: limit})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for x := range n {
		feed(t, b, streamTxn(t, uint32(1000+x), true, "a")...)
	}
	for x := range n {
		feed(t, b, streamTxn(t, uint32(1000+x), false, "b")...)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := b.Stats()
	require.LessOrEqual(t, st.MemoryBytes, int64(limit))
	require.Equal(t, n, st.OpenTxns)
	require.LessOrEqual(t, st.OverheadBytes/int64(n), int64(400), "overhead per open transaction (spilled), as documented")
	// The accounting is what the Go heap says, within a quarter: the heap grew by the records
	// in memory, the spill store's buffers and the bookkeeping.
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc) - st.MemoryBytes - 2*spill.DefaultBufferSize
	t.Logf("heap per open transaction %d bytes, accounted %d", heap/int64(n), st.OverheadBytes/int64(n))
	if !testing.Short() {
		// With 2,000 transactions the heap's growth is dominated by what does not scale with
		// them (map buckets grown in powers of two, the spill store's files), so the comparison
		// is made at the full size only.
		require.InEpsilon(t, heap, st.OverheadBytes, 0.25, "overhead accounted (%d) against the heap (%d)", st.OverheadBytes, heap)
	}
	require.Positive(t, st.SpillTxns)
	for x := range n {
		feed(t, b, streamCommit(t, uint32(1000+x), decoding.LSN(0x10000+16*x)))
		got, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"a", "b"}, values(t, got))
		b.Ack(got)
	}
	require.Zero(t, b.Stats().OpenTxns)
}

func TestParseWorkMem(t *testing.T) {
	for in, want := range map[string]int64{
		"64kB": 64 << 10, "64": 64 << 10, "1MB": 1 << 20, "1MiB": 1 << 20, "4GB": 4 << 30, "512B": 512,
		"none": reorderbuffer.SpillEverything, "unlimited": math.MaxInt64, " 2 MB ": 2 << 20,
	} {
		got, err := reorderbuffer.ParseWorkMem(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	// "0" is rejected: Config.WorkMem 0 means the default, so "0" would mean two things.
	for _, in := range []string{"", "kB", "-1", "1XB", "99999999999TB", "1.5MB", "0", "0kB"} {
		_, err := reorderbuffer.ParseWorkMem(in)
		require.Error(t, err, in)
	}
}

func TestInvalidConfig(t *testing.T) {
	_, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: -2})
	require.Error(t, err)
	file := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = reorderbuffer.New(reorderbuffer.Config{Dir: file})
	require.Error(t, err, "a spill directory that cannot be used is reported by New")
}

func TestStaleSpillFilesRemovedAtStart(t *testing.T) {
	// What a crashed process leaves: its store directory with a log, no lock held; beside it a
	// file that is not ours.
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "foreign.txt"), []byte("not ours"), 0o644))
	stale := filepath.Join(dir, "pgreorder-spill-999999-0123456789abcdef")
	require.NoError(t, os.MkdirAll(stale, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(stale, "log-1.spill"), []byte("PGRS"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(stale, "lock"), nil, 0o600)) // nobody holds it
	b2, err := reorderbuffer.New(reorderbuffer.Config{Dir: dir})
	require.NoError(t, err)
	defer b2.Close()
	_, err = os.Stat(stale)
	require.True(t, os.IsNotExist(err), "stale spill directory of a dead process left in place")
	_, err = os.Stat(filepath.Join(dir, "foreign.txt"))
	require.NoError(t, err, "a foreign file was removed")
}

func TestCloseRemovesEverything(t *testing.T) {
	dir := t.TempDir()
	b, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: reorderbuffer.SpillEverything, Dir: dir})
	require.NoError(t, err)
	feed(t, b, streamTxn(t, 10, true, "a", "b", "c")...)
	feed(t, b, plainTxn(t, 11, 0x2000, "d")...)
	ents, _ := os.ReadDir(dir)
	require.NotEmpty(t, ents, "spilling made no files")
	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	ents, _ = os.ReadDir(dir)
	require.Empty(t, ents)
	require.ErrorIs(t, b.Add(0, streamCommit(t, 10, 0x3000)), reorderbuffer.ErrClosed)
	_, ok := b.Next()
	require.False(t, ok)
	require.ErrorIs(t, b.Restart(), reorderbuffer.ErrClosed)
}

// TestPartCutAtPartSize: in parts, a transaction's changes are handed out as soon as the bytes
// it received since its last part reach the part size (an eighth of the work mem, at least 64kB:
// 128kB at 1MB), on the change that reaches it, whichever path recorded the change.
func TestPartCutAtPartSize(t *testing.T) {
	const partSize = 128 << 10
	for _, streamed := range []bool{false, true} {
		t.Run(fmt.Sprintf("streamed=%v", streamed), func(t *testing.T) {
			b := newBuffer(t, reorderbuffer.Config{Incremental: true, WorkMem: 1 << 20})
			xid := uint32(7)
			var msgs [][]byte
			if streamed {
				msgs = [][]byte{enc(t, &decoding.StreamStart{Xid: xid, FirstSegment: true}, false), enc(t, relation(1, xid), true)}
			} else {
				msgs = [][]byte{enc(t, &decoding.Begin{FinalLSN: 0x9000, CommitTime: epoch, Xid: xid}, false), enc(t, relation(1, 0), false)}
			}
			feed(t, b, msgs...)
			received := int64(len(msgs[1]))
			ins := enc(t, insert(1, xid, strings.Repeat("v", 100)), streamed)
			for i := 0; ; i++ {
				require.NoError(t, b.Add(decoding.LSN(0x200+i), ins))
				received += int64(len(ins))
				x, ok := b.Next()
				if received < partSize {
					require.False(t, ok, "a part after %d bytes, before the part size", received)
					continue
				}
				require.True(t, ok, "no part after %d bytes", received)
				require.Equal(t, reorderbuffer.PartChanges, x.Part)
				require.Len(t, values(t, x), i+1)
				return
			}
		})
	}
}
