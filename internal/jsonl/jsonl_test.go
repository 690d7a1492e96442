package jsonl_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/jsonl"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.jsonl")

// TestGolden pins the replay format, which tools parse: every op, every kind of value, a
// two-phase transaction and a non-transactional message, byte for byte.
func TestGolden(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 34, 56, 789012000, time.UTC)
	txt := func(s string) decoding.Column { return decoding.Column{Kind: 't', Data: []byte(s)} }
	rel := &decoding.Relation{RelationID: 10, Namespace: "public", Name: "t", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "id"}, {Name: "v"}, {Name: "big"}, {Name: "raw"}}}
	other := &decoding.Relation{RelationID: 11, Namespace: "", Name: "pg_thing",
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "k \"quoted\""}}}
	msgs := []decoding.Message{
		&decoding.LogicalMessage{Flags: 0, LSN: 0x1A0, Prefix: "nontx", Content: []byte("hello")},
		&decoding.Begin{FinalLSN: 0x2F00, CommitTime: at, Xid: 700},
		rel, other,
		&decoding.Insert{RelationID: 10, New: decoding.Tuple{txt("1"), txt("a\n<b>"), {Kind: 'n'}, {Kind: 'b', Data: []byte{0, 1, 2}}}},
		&decoding.Update{RelationID: 10, New: decoding.Tuple{txt("1"), txt("b"), {Kind: 'u'}, {Kind: 'n'}}},
		&decoding.Update{RelationID: 10, OldKind: 'K', Old: decoding.Tuple{txt("1"), {Kind: 'n'}, {Kind: 'n'}, {Kind: 'n'}},
			New: decoding.Tuple{txt("2"), txt("b"), {Kind: 'u'}, {Kind: 'n'}}},
		&decoding.Delete{RelationID: 11, OldKind: 'O', Old: decoding.Tuple{txt("x")}},
		&decoding.Truncate{Options: decoding.TruncateCascade | decoding.TruncateRestartIdentity, RelationIDs: []uint32{10, 11}},
		&decoding.LogicalMessage{Flags: 1, LSN: 0x2E00, Prefix: "tx", Content: []byte{0xff}},
		&decoding.Commit{CommitLSN: 0x2F00, EndLSN: 0x2F30, CommitTime: at},
		&decoding.BeginPrepare{PrepareLSN: 0x3F00, EndLSN: 0x3F30, PrepareTime: at, Xid: 701, GID: "g1"},
		&decoding.Truncate{RelationIDs: []uint32{10}},
		&decoding.Prepare{PrepareLSN: 0x3F00, EndLSN: 0x3F30, PrepareTime: at, Xid: 701, GID: "g1"},
		&decoding.CommitPrepared{CommitLSN: 0x4F00, EndLSN: 0x4F30, CommitTime: at, Xid: 701, GID: "g1"},
	}
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	defer b.Close()
	var out bytes.Buffer
	w := jsonl.NewWriter(&out)
	for _, m := range msgs {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		require.NoError(t, err)
		require.NoError(t, b.Add(0, data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			require.NoError(t, w.WriteTxn(x))
		}
	}
	for line := range bytes.Lines(out.Bytes()) {
		require.True(t, json.Valid(line), "%s", line)
	}
	if *update {
		require.NoError(t, os.WriteFile("testdata/golden.jsonl", out.Bytes(), 0o644))
	}
	want, err := os.ReadFile("testdata/golden.jsonl")
	require.NoError(t, err)
	require.Equal(t, string(want), out.String())
	require.EqualValues(t, 7, w.Changes)
}

func TestUnknownRelation(t *testing.T) {
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	defer b.Close()
	for _, m := range []decoding.Message{
		&decoding.Begin{FinalLSN: 0x10, Xid: 5},
		&decoding.Insert{RelationID: 99, New: decoding.Tuple{{Kind: 'n'}}},
		&decoding.Commit{CommitLSN: 0x10, EndLSN: 0x18},
	} {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		require.NoError(t, err)
		require.NoError(t, b.Add(0, data))
	}
	x, ok := b.Next()
	require.True(t, ok)
	require.ErrorIs(t, jsonl.NewWriter(&bytes.Buffer{}).WriteTxn(x), jsonl.ErrUnknownRelation)
}

// FuzzAppendString: our JSON strings decode to what encoding/json's do, for any input.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "a\"b\\c", "\x00\x1f\n\r\t", "<>&", "\u2028\u2029", "é€😀", "\xff\xfe", "a\xc3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ours := jsonl.AppendString(nil, s)
		require.True(t, json.Valid(ours), "%q -> %s", s, ours)
		theirs, err := json.Marshal(s)
		require.NoError(t, err)
		var a, b string
		require.NoError(t, json.Unmarshal(ours, &a))
		require.NoError(t, json.Unmarshal(theirs, &b))
		require.Equal(t, b, a)
	})
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
