package format_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
	"github.com/stretchr/testify/require"
)

// smallTxn is one committed transaction of one insert, ending at end.
func smallTxn(xid uint32, end decoding.LSN) []decoding.Message {
	return []decoding.Message{
		&decoding.Begin{FinalLSN: end - 8, Xid: xid},
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}}},
		&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("1")}}},
		&decoding.Commit{CommitLSN: end - 8, EndLSN: end},
	}
}

func TestFile(t *testing.T) {
	for _, kind := range format.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.jsonl")
			f, err := format.OpenFile(path, format.Config{Kind: kind, Now: fixedNow})
			require.NoError(t, err)
			require.Zero(t, f.Resume())
			require.FileExists(t, path+format.PositionSuffix, "a new file records its empty state at once")
			feed(t, smallTxn(10, 0x100), f.WriteTxn)
			feed(t, smallTxn(11, 0x200), f.WriteTxn)
			require.Equal(t, decoding.LSN(0x200), f.Resume())
			size := f.Offset()
			require.NoError(t, f.Close())
			require.NoError(t, f.Close())
			require.ErrorIs(t, f.WriteTxn(nil), format.ErrClosed)
			whole, err := os.ReadFile(path)
			require.NoError(t, err)
			require.EqualValues(t, size, len(whole))
			checkLines(t, whole)

			// The process died while writing a third transaction: a torn line at the end.
			fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			fh.Write([]byte(`{"xid":12,"commit_lsn":"0/2F8","end_l`))
			fh.Close()
			f, err = format.OpenFile(path, format.Config{Kind: kind, Now: fixedNow})
			require.NoError(t, err)
			require.Equal(t, decoding.LSN(0x200), f.Resume())
			got, _ := os.ReadFile(path)
			require.Equal(t, string(whole), string(got), "the torn line is cut")

			// A transaction that fails leaves the file as it was.
			feed(t, bigTxn(50, 10<<10, true), func(x *reorderbuffer.Txn) error {
				require.ErrorIs(t, f.WriteTxn(x), format.ErrUnknownRelation)
				return nil
			})
			got, _ = os.ReadFile(path)
			require.Equal(t, string(whole), string(got))
			feed(t, smallTxn(12, 0x300), f.WriteTxn)
			require.Equal(t, decoding.LSN(0x300), f.Resume())
			require.NoError(t, f.Close())
			got, _ = os.ReadFile(path)
			require.True(t, bytes.HasPrefix(got, whole))
			checkLines(t, got)
			require.Equal(t, bytes.Count(whole, []byte{'\n'})+1, bytes.Count(got, []byte{'\n'}))
		})
	}
}

func TestFilePositionErrors(t *testing.T) {
	dir := t.TempDir()
	// Data but no position file: someone else's file.
	foreign := filepath.Join(dir, "foreign.jsonl")
	require.NoError(t, os.WriteFile(foreign, []byte("{}\n"), 0o644))
	_, err := format.OpenFile(foreign, format.Config{})
	require.ErrorIs(t, err, format.ErrPosition)
	got, _ := os.ReadFile(foreign)
	require.Equal(t, "{}\n", string(got), "left alone")

	// A position past the end of the file: data was lost.
	path := filepath.Join(dir, "out.jsonl")
	f, err := format.OpenFile(path, format.Config{})
	require.NoError(t, err)
	feed(t, smallTxn(10, 0x100), f.WriteTxn)
	require.NoError(t, f.Close())
	require.NoError(t, os.Truncate(path, 3))
	_, err = format.OpenFile(path, format.Config{})
	require.ErrorIs(t, err, format.ErrPosition)

	// A damaged position file.
	require.NoError(t, os.WriteFile(path+format.PositionSuffix, []byte("offset 3\n"), 0o644))
	_, err = format.OpenFile(path, format.Config{})
	require.ErrorIs(t, err, format.ErrPosition)

	_, err = format.OpenFile(path, format.Config{Kind: "csv"})
	require.ErrorIs(t, err, format.ErrUnknownKind)
	_, err = format.OpenFile(filepath.Join(dir, "missing", "out.jsonl"), format.Config{})
	require.Error(t, err)
}

// writeTxn writes one small transaction to f and returns WriteTxn's error.
func writeTxn(t *testing.T, f *format.File, xid uint32, end decoding.LSN) error {
	t.Helper()
	var err error
	feed(t, smallTxn(xid, end), func(x *reorderbuffer.Txn) error { err = f.WriteTxn(x); return nil })
	return err
}

// TestFileFaults: a fault while a transaction is made durable (ENOSPC writing the output or the
// position file, EIO on their fsync, a rename of the position file that fails, EIO on the
// directory's fsync) fails WriteTxn with that error. The File claims no position it did not make
// durable (Resume and Offset stay where they were); after a fault in the output it cuts the
// transaction off again and takes the next, after one in the position file (which may hold the
// old position or the new) it takes no more. Opened again, its output and position agree: the
// last transaction whose position file was renamed into place is the last in the output.
func TestFileFaults(t *testing.T) {
	const name = "out.jsonl"
	is := func(base string) func(string) bool { return func(p string) bool { return filepath.Base(p) == base } }
	tmp := name + format.PositionSuffix + vfs.TempSuffix
	for _, tc := range []struct {
		name    string
		rule    func(dir string) faultfs.Rule
		goesOn  bool // the File takes further transactions once the fault is gone
		renamed bool // the failed transaction's position is in place all the same
	}{
		{"output disk full", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpWrite, Match: is(name), Err: syscall.ENOSPC, Partial: true}
		}, true, false},
		{"output fsync", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: is(name), Err: syscall.EIO}
		}, true, false},
		{"position disk full", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpWrite, Match: is(tmp), Err: syscall.ENOSPC, Partial: true}
		}, false, false},
		{"position fsync", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: is(tmp), Err: syscall.EIO}
		}, false, false},
		{"position rename", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpRename, Match: is(tmp), Err: syscall.EIO}
		}, false, false},
		{"directory fsync", func(dir string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: func(p string) bool { return p == dir }, Err: syscall.EIO}
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, name)
			ffs := faultfs.New(vfs.OS())
			f, err := format.OpenFile(path, format.Config{Now: fixedNow, FS: ffs})
			require.NoError(t, err)
			require.NoError(t, writeTxn(t, f, 10, 0x100))
			before, err := os.ReadFile(path)
			require.NoError(t, err)
			off := f.Offset()

			rule := tc.rule(dir)
			ffs.Add(rule)
			err = writeTxn(t, f, 11, 0x200)
			require.ErrorIs(t, err, rule.Err)
			require.Equal(t, 1, ffs.Fired())
			require.Equal(t, off, f.Offset(), "a position not made durable is not claimed")
			require.Equal(t, decoding.LSN(0x100), f.Resume(), "a position not made durable is not claimed")
			ffs.Reset()
			want, lines := decoding.LSN(0x100), 1
			if tc.goesOn {
				got, err := os.ReadFile(path)
				require.NoError(t, err)
				require.Equal(t, string(before), string(got), "the failed transaction is cut off")
				require.NoError(t, writeTxn(t, f, 12, 0x300))
				require.Equal(t, decoding.LSN(0x300), f.Resume())
				want, lines = 0x300, 2
			} else {
				require.ErrorContains(t, writeTxn(t, f, 12, 0x300), "refusing to write after an earlier error")
				if tc.renamed {
					want, lines = 0x200, 2
				}
			}
			require.NoError(t, f.Close())

			f, err = format.OpenFile(path, format.Config{Now: fixedNow})
			require.NoError(t, err)
			defer f.Close()
			require.Equal(t, want, f.Resume())
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			require.EqualValues(t, f.Offset(), len(got))
			require.True(t, bytes.HasPrefix(got, before))
			require.Equal(t, lines, bytes.Count(got, []byte{'\n'}))
			checkLines(t, got)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Len(t, entries, 2, "the output and its position file, no temporary file")
		})
	}
}

// TestFileCrash: the process dies at each step of WriteTxn in turn (every operation from there on
// fails, nothing more reaches the disk): between the output's write and its fsync, between the
// position file's write and its rename, after the rename... Opened again, the File resumes after
// the previous transaction, with the output as it was, or after the new one, with it whole;
// after a WriteTxn that returned nil, always the new one.
func TestFileCrash(t *testing.T) {
	// open opens a File through a new faultfs.FS and writes a first transaction.
	open := func() (string, *faultfs.FS, *format.File) {
		path := filepath.Join(t.TempDir(), "out.jsonl")
		ffs := faultfs.New(vfs.OS())
		f, err := format.OpenFile(path, format.Config{Now: fixedNow, FS: ffs})
		require.NoError(t, err)
		require.NoError(t, writeTxn(t, f, 10, 0x100))
		return path, ffs, f
	}
	path, ffs, f := open()
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	seen := 0
	ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Match: func(string) bool { seen++; return false }})
	require.NoError(t, writeTxn(t, f, 11, 0x200))
	ops := seen
	require.NoError(t, f.Close())
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, ops, 9, "the output's write and fsync, then the position file's remove, create, write, sync, close, rename, and the directory's sync")

	outcomes := map[decoding.LSN]int{}
	for crash := range ops + 1 {
		path, ffs, f := open()
		ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Skip: crash, Err: syscall.EIO})
		err := writeTxn(t, f, 11, 0x200)
		f.Close() // the process dies: its descriptors are closed, nothing more is written
		require.Equal(t, crash == ops, err == nil, "crash after %d of %d operations: %v", crash, ops, err)

		f, err = format.OpenFile(path, format.Config{Now: fixedNow})
		require.NoError(t, err, "crash after %d operations", crash)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		switch f.Resume() {
		case 0x100:
			require.Equal(t, string(before), string(got), "crash after %d operations", crash)
			require.Less(t, crash, ops)
		case 0x200:
			require.Equal(t, string(after), string(got), "crash after %d operations", crash)
		default:
			t.Fatalf("crash after %d operations: resumes after %s", crash, f.Resume())
		}
		outcomes[f.Resume()]++
		require.NoError(t, f.Close())
	}
	require.Equal(t, map[decoding.LSN]int{0x100: ops - 1, 0x200: 2}, outcomes,
		"the new position is there once the rename was made, before the directory's fsync")
}
