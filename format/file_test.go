package format_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/reorderbuffer"
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
