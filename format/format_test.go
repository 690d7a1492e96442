package format_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var fixedNow = func() time.Time { return time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC) }

// writeCapture reorders a capture file and writes its transactions with w.
func writeCapture(t *testing.T, file string, write func(*reorderbuffer.Txn) error) {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir(), WorkMem: 64 << 10})
	require.NoError(t, err)
	defer b.Close()
	r := capture.NewReader(f)
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.NoError(t, b.Add(rec.LSN, rec.Data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			require.NoError(t, write(x))
			require.NoError(t, b.Ack(x))
		}
	}
}

// checkLines checks that every line is one JSON object without duplicate keys.
func checkLines(t *testing.T, out []byte) {
	t.Helper()
	require.True(t, len(out) == 0 || out[len(out)-1] == '\n', "output ends with a newline")
	for line := range bytes.Lines(out) {
		require.NoError(t, noDuplicateKeys(line), "%s", line)
	}
}

// noDuplicateKeys parses one JSON value and reports an error for invalid JSON or an object with
// a key twice.
func noDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			keys := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				if keys[k.(string)] {
					return errors.New("duplicate key " + k.(string))
				}
				keys[k.(string)] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	if err := walk(); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one JSON value")
	}
	return nil
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "%s (go test ./format -update rewrites it)", path)
}

// TestGoldenCaptures pins both formats on captures of real servers: every op, text and binary
// values, TOAST, an enum and a domain, truncates, origins, logical messages, two-phase and
// streamed transactions.
func TestGoldenCaptures(t *testing.T) {
	for _, c := range []string{"pg15-proto2-binary", "pg18-proto4-parallel"} {
		for _, kind := range format.Kinds {
			t.Run(c+"/"+string(kind), func(t *testing.T) {
				var out bytes.Buffer
				w := format.NewWriter(&out, format.Config{Kind: kind, Now: fixedNow, Server: "test", Database: "postgres"})
				defer w.Close()
				writeCapture(t, "../decoding/testdata/captures/"+c+".txt", w.WriteTxn)
				checkLines(t, out.Bytes())
				golden(t, c+"."+string(kind)+".jsonl", out.Bytes())
			})
		}
	}
}

// TestGoldenSynthetic pins the txn format, which tools parse, on every op and kind of value,
// names that need escaping, a two-phase transaction and a non-transactional message.
func TestGoldenSynthetic(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 34, 56, 789012000, time.UTC)
	txt := func(s string) decoding.Column { return decoding.Column{Kind: 't', Data: []byte(s)} }
	rel := &decoding.Relation{RelationID: 10, Namespace: "public", Name: "t", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}, {Name: "v", TypeOID: 25},
			{Name: "big", TypeOID: 25}, {Name: "raw", TypeOID: 17}}}
	other := &decoding.Relation{RelationID: 11, Namespace: "", Name: "pg_thing",
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "k \"quoted\"", TypeOID: 25}}}
	odd := &decoding.Relation{RelationID: 12, Namespace: "a.b", Name: "c\\d\xff",
		Columns: []decoding.RelationColumn{{Name: "\xfe", TypeOID: 25}, {Name: "\xff", TypeOID: 25}, {Name: "\\xff", TypeOID: 25}}}
	msgs := []decoding.Message{
		&decoding.LogicalMessage{Flags: 0, LSN: 0x1A0, Prefix: "nontx", Content: []byte("hello")},
		&decoding.Begin{FinalLSN: 0x2F00, CommitTime: at, Xid: 700},
		rel, other, odd,
		&decoding.Insert{RelationID: 10, New: decoding.Tuple{txt("1"), txt("a\n<b>"), {Kind: 'n'}, {Kind: 'b', Data: []byte{0, 1, 2}}}},
		&decoding.Update{RelationID: 10, New: decoding.Tuple{txt("1"), txt("b"), {Kind: 'u'}, {Kind: 'n'}}},
		&decoding.Update{RelationID: 10, OldKind: 'K', Old: decoding.Tuple{txt("1"), {Kind: 'n'}, {Kind: 'n'}, {Kind: 'n'}},
			New: decoding.Tuple{txt("2"), txt("b"), {Kind: 'u'}, {Kind: 'n'}}},
		&decoding.Delete{RelationID: 11, OldKind: 'O', Old: decoding.Tuple{txt("x")}},
		&decoding.Insert{RelationID: 12, New: decoding.Tuple{txt("ok"), txt("not \xff utf-8 \\"), txt("\\x")}},
		&decoding.Truncate{Options: decoding.TruncateCascade | decoding.TruncateRestartIdentity, RelationIDs: []uint32{10, 11, 12}},
		&decoding.LogicalMessage{Flags: 1, LSN: 0x2E00, Prefix: "tx", Content: []byte{0xff}},
		&decoding.Commit{CommitLSN: 0x2F00, EndLSN: 0x2F30, CommitTime: at},
		&decoding.BeginPrepare{PrepareLSN: 0x3F00, EndLSN: 0x3F30, PrepareTime: at, Xid: 701, GID: "g1"},
		&decoding.Truncate{RelationIDs: []uint32{10}},
		&decoding.Prepare{PrepareLSN: 0x3F00, EndLSN: 0x3F30, PrepareTime: at, Xid: 701, GID: "g1"},
		&decoding.CommitPrepared{CommitLSN: 0x4F00, EndLSN: 0x4F30, CommitTime: at, Xid: 701, GID: "g1"},
		&decoding.Begin{FinalLSN: 0x5F00, CommitTime: at, Xid: 702},
		&decoding.Commit{CommitLSN: 0x5F00, EndLSN: 0x5F30, CommitTime: at},
	}
	for _, kind := range format.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			var out bytes.Buffer
			w := format.NewWriter(&out, format.Config{Kind: kind, Now: fixedNow})
			defer w.Close()
			feed(t, msgs, w.WriteTxn)
			checkLines(t, out.Bytes())
			golden(t, "synthetic."+string(kind)+".jsonl", out.Bytes())
			want := map[format.Kind]int64{format.KindTxn: 9, format.KindDebezium: 11}[kind]
			require.Equal(t, want, w.Changes())
		})
	}
}

// feed encodes msgs, runs them through a reorder buffer and writes each transaction.
func feed(t testing.TB, msgs []decoding.Message, write func(*reorderbuffer.Txn) error) {
	t.Helper()
	feedDir(t, t.TempDir(), msgs, write)
}

// feedDir is feed with the spill directory given.
func feedDir(t testing.TB, dir string, msgs []decoding.Message, write func(*reorderbuffer.Txn) error) {
	t.Helper()
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: dir})
	require.NoError(t, err)
	defer b.Close()
	for _, m := range msgs {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		require.NoError(t, err)
		require.NoError(t, b.Add(0, data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			require.NoError(t, write(x))
		}
	}
}

// bigTxn is a transaction of n inserts of a value of the given size, then optionally a change
// for a relation the stream never described.
func bigTxn(n, size int, fail bool) []decoding.Message {
	msgs := []decoding.Message{
		&decoding.Begin{FinalLSN: 0x9000, Xid: 800},
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}, {Name: "v", TypeOID: 25}}},
	}
	v := bytes.Repeat([]byte{'v'}, size)
	for i := range n {
		msgs = append(msgs, &decoding.Insert{RelationID: 1, New: decoding.Tuple{
			{Kind: 't', Data: []byte(strings.Repeat("1", i%5+1))}, {Kind: 't', Data: v}}})
	}
	if fail {
		msgs = append(msgs, &decoding.Insert{RelationID: 2, New: decoding.Tuple{{Kind: 'n'}}})
	}
	return append(msgs, &decoding.Commit{CommitLSN: 0x9000, EndLSN: 0x9030})
}

// TestWholeOrNothing: a transaction that fails after megabytes of output leaves nothing in the
// output, whether it was staged in memory or in a file; one that succeeds comes out the same
// either way.
func TestWholeOrNothing(t *testing.T) {
	for _, kind := range format.Kinds {
		for _, stage := range []int{1 << 10, 64 << 20} {
			var out bytes.Buffer
			w := format.NewWriter(&out, format.Config{Kind: kind, StageBytes: stage, TempDir: t.TempDir(), Now: fixedNow})
			var got error
			feed(t, bigTxn(100, 50<<10, true), func(x *reorderbuffer.Txn) error {
				got = w.WriteTxn(x)
				return nil
			})
			require.ErrorIs(t, got, format.ErrUnknownRelation)
			require.Zero(t, out.Len(), "%s, staging %d: a failed transaction left %d bytes", kind, stage, out.Len())

			feed(t, bigTxn(100, 50<<10, false), w.WriteTxn)
			require.NoError(t, w.Close())
			require.NoError(t, w.Close())
			var again bytes.Buffer
			w2 := format.NewWriter(&again, format.Config{Kind: kind, Now: fixedNow})
			feed(t, bigTxn(100, 50<<10, false), w2.WriteTxn)
			require.Equal(t, again.String(), out.String())
			checkLines(t, out.Bytes())
			require.Greater(t, out.Len(), 5_000_000)
		}
	}
}

// TestDebeziumLines: a large transaction is one short line per change.
func TestDebeziumLines(t *testing.T) {
	var out bytes.Buffer
	w := format.NewWriter(&out, format.Config{Kind: format.KindDebezium, Now: fixedNow})
	defer w.Close()
	feed(t, bigTxn(10000, 10, false), w.WriteTxn)
	lines := bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte{'\n'}), []byte{'\n'})
	require.Len(t, lines, 10000)
	for _, l := range lines {
		require.Less(t, len(l), 1000)
	}
	var last struct {
		Transaction struct {
			ID         string `json:"id"`
			TotalOrder int    `json:"total_order"`
			TableOrder int    `json:"data_collection_order"`
		} `json:"transaction"`
	}
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &last))
	require.Equal(t, "800:36864", last.Transaction.ID)
	require.Equal(t, 10000, last.Transaction.TotalOrder)
	require.Equal(t, 10000, last.Transaction.TableOrder)
}

type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.n -= len(p); f.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestErrors(t *testing.T) {
	_, err := format.ParseKind("xml")
	require.ErrorIs(t, err, format.ErrUnknownKind)
	require.ErrorContains(t, err, "valid: txn, debezium")
	k, err := format.ParseKind("")
	require.NoError(t, err)
	require.Equal(t, format.KindTxn, k)

	// A destination error is returned.
	w := format.NewWriter(&failingWriter{n: 10}, format.Config{})
	feed(t, bigTxn(1, 100, false), func(x *reorderbuffer.Txn) error {
		require.ErrorContains(t, w.WriteTxn(x), "disk full")
		return nil
	})
	// A bad kind, nil, and use after Close are errors, not panics.
	bad := format.NewWriter(io.Discard, format.Config{Kind: "xml"})
	feed(t, bigTxn(1, 1, false), func(x *reorderbuffer.Txn) error {
		require.ErrorIs(t, bad.WriteTxn(x), format.ErrUnknownKind)
		return nil
	})
	require.Error(t, w.WriteTxn(nil))
	require.NoError(t, w.Close())
	require.ErrorIs(t, w.WriteTxn(nil), format.ErrClosed)

	// Two columns of the same name would be duplicate keys.
	dup := []decoding.Message{
		&decoding.Begin{FinalLSN: 0x10, Xid: 5},
		&decoding.Relation{RelationID: 1, Name: "t", Columns: []decoding.RelationColumn{{Name: "a"}, {Name: "a"}}},
		&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 'n'}, {Kind: 'n'}}},
		&decoding.Commit{CommitLSN: 0x10, EndLSN: 0x18},
	}
	for _, kind := range format.Kinds {
		var out bytes.Buffer
		w := format.NewWriter(&out, format.Config{Kind: kind})
		feed(t, dup, func(x *reorderbuffer.Txn) error {
			require.ErrorIs(t, w.WriteTxn(x), format.ErrDuplicateColumn)
			return nil
		})
		require.Zero(t, out.Len())
	}
}

func TestEscapeName(t *testing.T) {
	for in, want := range map[string]string{
		"plain": "plain", "é€😀": "é€😀", "a.b": "a.b", `a\b`: `a\\b`, "\xff": `\xff`, "a\xc3": `a\xc3`,
		`\xff`: `\\xff`, "": "",
	} {
		require.Equal(t, want, format.EscapeName(in), "%q", in)
		back, ok := format.UnescapeName(want)
		require.True(t, ok, want)
		require.Equal(t, in, back)
	}
	for _, bad := range []string{`\`, `\x4`, `\q`, `\x41`, "\xff"} {
		_, ok := format.UnescapeName(bad)
		require.False(t, ok, "%q", bad)
	}
}

// FuzzNames: whatever bytes names and values hold, both formats print valid JSON without
// duplicate keys, names come back from UnescapeName as they were, and distinct columns stay
// distinct keys.
func FuzzNames(f *testing.F) {
	f.Add("public", "t", "a", "b", []byte("v"))
	f.Add("a.b", "c", "\xff", "\xfe", []byte("\xff"))
	f.Add("a", "b.c", `\xff`, "\xff", []byte(`\`))
	f.Add("", "\u2028", "\x00", "\"", []byte("\x00\u2029"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, schema, table, col1, col2 string, value []byte) {
		if col1 == col2 {
			col2 += "_"
		}
		msgs := []decoding.Message{
			&decoding.Begin{FinalLSN: 0x10, Xid: 5},
			&decoding.Relation{RelationID: 1, Namespace: schema, Name: table,
				Columns: []decoding.RelationColumn{{Name: col1, TypeOID: 25}, {Name: col2, TypeOID: 25}}},
			&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: value}, {Kind: 'n'}}},
			&decoding.Truncate{RelationIDs: []uint32{1}},
			&decoding.LogicalMessage{Flags: 1, Prefix: col1, Content: value},
			&decoding.Commit{CommitLSN: 0x10, EndLSN: 0x18},
		}
		if _, err := decoding.Append(nil, msgs[1], false, decoding.Options{}); err != nil {
			t.Skip() // a name with a NUL byte cannot be sent
		}
		for _, kind := range format.Kinds {
			var out bytes.Buffer
			w := format.NewWriter(&out, format.Config{Kind: kind, Now: fixedNow})
			feedDir(t, dir, msgs, w.WriteTxn)
			checkLines(t, out.Bytes())
			line, _, _ := bytes.Cut(out.Bytes(), []byte{'\n'})
			var v map[string]any
			require.NoError(t, json.Unmarshal(line, &v))
			var row map[string]any
			var gotSchema, gotTable string
			if kind == format.KindTxn {
				ch := v["changes"].([]any)[0].(map[string]any)
				row = ch["new"].(map[string]any)
				gotSchema, gotTable = ch["schema"].(string), ch["table"].(string)
			} else {
				row = v["after"].(map[string]any)
				src := v["source"].(map[string]any)
				gotSchema, gotTable = src["schema"].(string), src["table"].(string)
			}
			require.Len(t, row, 2)
			for _, c := range []string{col1, col2} {
				_, ok := row[format.EscapeName(c)]
				require.True(t, ok, "%s: column %q", kind, c)
			}
			wantSchema := schema
			if wantSchema == "" {
				wantSchema = "pg_catalog"
			}
			for got, want := range map[string]string{gotSchema: wantSchema, gotTable: table} {
				back, ok := format.UnescapeName(got)
				require.True(t, ok)
				require.Equal(t, want, back)
			}
		}
	})
}

// TestWriteRows: a copied chunk (here a transaction of inserts, a pgvalue.Source like a chunk) is
// one snapshot_lsn line in the txn format and an "r" event per row in the debezium format; a
// chunk holding anything but inserts leaves nothing.
func TestWriteRows(t *testing.T) {
	var txnOut, dbzOut bytes.Buffer
	tw := format.NewWriter(&txnOut, format.Config{Now: fixedNow})
	dw := format.NewWriter(&dbzOut, format.Config{Kind: format.KindDebezium, Now: fixedNow})
	defer tw.Close()
	defer dw.Close()
	feed(t, bigTxn(3, 2, false), func(x *reorderbuffer.Txn) error { return tw.WriteRows(x) })
	feed(t, bigTxn(3, 2, false), func(x *reorderbuffer.Txn) error { return dw.WriteRows(x) })
	checkLines(t, txnOut.Bytes())
	checkLines(t, dbzOut.Bytes())
	require.Equal(t, 1, bytes.Count(txnOut.Bytes(), []byte{'\n'}))
	line := parseObject(t, strings.TrimSuffix(txnOut.String(), "\n"))
	require.Equal(t, "0/0", line["snapshot_lsn"])
	require.NotContains(t, line, "xid")
	require.Len(t, line["changes"], 3)
	events := strings.Split(strings.TrimSuffix(dbzOut.String(), "\n"), "\n")
	require.Len(t, events, 3)
	for _, e := range events {
		ev := parseObject(t, e)
		require.Equal(t, "r", ev["op"])
		require.Nil(t, ev["transaction"])
		require.Equal(t, "true", ev["source"].(map[string]any)["snapshot"])
	}

	update := []decoding.Message{
		&decoding.Begin{FinalLSN: 0x100, Xid: 5},
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}}},
		&decoding.Update{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("1")}}},
		&decoding.Commit{CommitLSN: 0x100, EndLSN: 0x130},
	}
	var none bytes.Buffer
	w := format.NewWriter(&none, format.Config{})
	defer w.Close()
	feed(t, update, func(x *reorderbuffer.Txn) error {
		require.ErrorContains(t, w.WriteRows(x), "a copied chunk holds")
		return nil
	})
	require.Zero(t, none.Len())
	require.ErrorContains(t, w.WriteRows(nil), "nil source")
}
