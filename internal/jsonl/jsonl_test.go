package jsonl_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/jsonl"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

// TestWrapper: the wrapper writes what format's txn format writes, and counts the changes.
func TestWrapper(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 34, 56, 789012000, time.UTC)
	msgs := []decoding.Message{
		&decoding.LogicalMessage{LSN: 0x1A0, Prefix: "nontx", Content: []byte("hello")},
		&decoding.Begin{FinalLSN: 0x2F00, CommitTime: at, Xid: 700},
		&decoding.Relation{RelationID: 10, Namespace: "public", Name: "t", Columns: []decoding.RelationColumn{{Flags: 1, Name: "id"}}},
		&decoding.Insert{RelationID: 10, New: decoding.Tuple{{Kind: 't', Data: []byte("1")}}},
		&decoding.Delete{RelationID: 10, OldKind: 'K', Old: decoding.Tuple{{Kind: 't', Data: []byte("1")}}},
		&decoding.Commit{CommitLSN: 0x2F00, EndLSN: 0x2F30, CommitTime: at},
	}
	var ours, theirs bytes.Buffer
	w := jsonl.NewWriter(&ours)
	fw := format.NewWriter(&theirs, format.Config{})
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	defer b.Close()
	for _, m := range msgs {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		require.NoError(t, err)
		require.NoError(t, b.Add(0, data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			require.NoError(t, w.WriteTxn(x))
		}
	}
	b2, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	defer b2.Close()
	for _, m := range msgs {
		data, _ := decoding.Append(nil, m, false, decoding.Options{})
		require.NoError(t, b2.Add(0, data))
		for x, ok := b2.Next(); ok; x, ok = b2.Next() {
			require.NoError(t, fw.WriteTxn(x))
		}
	}
	require.Equal(t, theirs.String(), ours.String())
	require.EqualValues(t, 3, w.Changes)
	require.Equal(t, "2026-11-29T12:34:56.789012Z", jsonl.FormatTime(at))
}

func TestComparable(t *testing.T) {
	out := `{"xid":1,"commit_lsn":"0/1","end_lsn":"0/2","commit_time":"x","gid":"g","changes":[{"op":"truncate"}]}
{"xid":2,"commit_lsn":"0/3","end_lsn":"0/4","commit_time":"x","changes":[]}
{"op":"message","transactional":false,"lsn":"0/5","prefix":"p","content":""}
`
	got, err := jsonl.Comparable(out)
	require.NoError(t, err)
	require.Equal(t, []string{
		`{"changes":[{"op":"truncate"}],"commit_lsn":"0/1","commit_time":"x","end_lsn":"0/2","xid":1}`,
		`{"content":"","lsn":"0/5","op":"message","prefix":"p","transactional":false}`,
	}, got)
	_, err = jsonl.Comparable("{not json\n")
	require.Error(t, err)
}
