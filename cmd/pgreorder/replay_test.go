package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"

	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

// committedTxns runs replay over a capture file and returns its transactions with changes, in
// the form comparable gives.
func committedTxns(t *testing.T, file string, workMem int64) []string {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var out bytes.Buffer
	_, err = replay(context.Background(), f, &out, reorderbuffer.Config{WorkMem: workMem, Dir: t.TempDir()}, format.Config{})
	require.NoError(t, err, file)
	txns, err := comparable(out.String())
	require.NoError(t, err)
	return txns
}

// TestReplayCommittedCaptures: for every streamed capture the project keeps beside a
// non-streamed capture of the same run, `pgreorder replay -work-mem 64kB` of the streamed one
// prints the same committed transactions as `pgreorder replay` of the plain one (leaving out
// transactions with no changes). The demo's capture has no plain twin; its test compares it with
// the table it came from instead.
func TestReplayCommittedCaptures(t *testing.T) {
	plains, err := filepath.Glob("../../decoding/testdata/captures/*-nostream.txt")
	require.NoError(t, err)
	require.NotEmpty(t, plains)
	pairs := 0
	for _, plain := range plains {
		prefix := strings.SplitN(filepath.Base(plain), "-", 2)[0] + "-" // pg15-, pg18-
		siblings, err := filepath.Glob(filepath.Join(filepath.Dir(plain), prefix+"*.txt"))
		require.NoError(t, err)
		want := committedTxns(t, plain, math.MaxInt64)
		require.NotEmpty(t, want)
		for _, s := range siblings {
			if s == plain || strings.Contains(s, "binary") { // the binary capture is a different run
				continue
			}
			for _, wm := range []int64{64 << 10, reorderbuffer.SpillEverything} {
				require.Equal(t, want, committedTxns(t, s, wm), "%s vs %s at %d", s, plain, wm)
			}
			pairs++
		}
	}
	require.GreaterOrEqual(t, pairs, 3)
}

func TestReplayMalformed(t *testing.T) {
	for name, in := range map[string]string{
		"not hex":           "0/1\t1\tzz\n",
		"truncated message": "0/1\t1\t42\n", // a Begin of one byte
		"change outside":    "0/1\t0\t49000040000e4e0001740000000131\n",
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := replay(context.Background(), strings.NewReader("# comment\n"+in), &out, reorderbuffer.Config{Dir: t.TempDir()}, format.Config{})
			require.Error(t, err)
			require.Contains(t, err.Error(), "line 2")
		})
	}
}

// TestReplayGzip: the capture that ships with the command is gzip-compressed; replay reads it as
// it reads the same capture uncompressed, whatever its name.
func TestReplayGzip(t *testing.T) {
	z, err := os.ReadFile("testdata/demo.capture.gz")
	require.NoError(t, err)
	zr, err := gzip.NewReader(bytes.NewReader(z))
	require.NoError(t, err)
	plain, err := io.ReadAll(zr)
	require.NoError(t, err)
	var fromGzip, fromPlain bytes.Buffer
	st, err := replay(context.Background(), bytes.NewReader(z), &fromGzip, reorderbuffer.Config{Dir: t.TempDir(), WorkMem: 64 << 10}, format.Config{})
	require.NoError(t, err)
	require.Positive(t, st.TotalTxns)
	_, err = replay(context.Background(), bytes.NewReader(plain), &fromPlain, reorderbuffer.Config{Dir: t.TempDir(), WorkMem: 64 << 10}, format.Config{})
	require.NoError(t, err)
	require.Equal(t, fromPlain.String(), fromGzip.String())
	require.Greater(t, fromGzip.Len(), 1000)

	// Through the command, from a file whose name does not say gzip.
	renamed := filepath.Join(t.TempDir(), "capture.txt")
	require.NoError(t, os.WriteFile(renamed, z, 0o644))
	out := captureStdout(t, func() error { return runReplay(context.Background(), []string{"-work-mem", "64kB", renamed}) })
	require.Equal(t, fromGzip.String(), out)
}

// TestReplaySpillCompression: with -spill-compression the output is the same, and the spill
// figures say what was written before and after compression.
func TestReplaySpillCompression(t *testing.T) {
	z, err := os.ReadFile("testdata/demo.capture.gz")
	require.NoError(t, err)
	var plain bytes.Buffer
	st, err := replay(context.Background(), bytes.NewReader(z), &plain, reorderbuffer.Config{Dir: t.TempDir(), WorkMem: reorderbuffer.SpillEverything}, format.Config{})
	require.NoError(t, err)
	for _, name := range []string{"s2", "lz4", "zstd"} {
		codec, err := parseSpillCompression(name)
		require.NoError(t, err)
		var out bytes.Buffer
		cst, err := replay(context.Background(), bytes.NewReader(z), &out, reorderbuffer.Config{Dir: t.TempDir(), WorkMem: reorderbuffer.SpillEverything, SpillCompressor: codec}, format.Config{})
		require.NoError(t, err)
		require.Equal(t, plain.String(), out.String(), name)
		require.Positive(t, cst.SpillBytes, name)
		require.Less(t, cst.SpillWrittenBytes, st.SpillWrittenBytes/2, "%s: %d bytes written, %d uncompressed", name, cst.SpillWrittenBytes, st.SpillWrittenBytes)
		require.Contains(t, formatStats(cst), fmt.Sprintf("spill_bytes=%d spill_written_bytes=%d", cst.SpillBytes, cst.SpillWrittenBytes))
	}
}

// captureStdout runs f with os.Stdout redirected to a file and returns what it wrote.
func captureStdout(t *testing.T, f func() error) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stdout")
	require.NoError(t, err)
	defer tmp.Close()
	stdout := os.Stdout
	os.Stdout = tmp
	err = f()
	os.Stdout = stdout
	require.NoError(t, err)
	b, err := os.ReadFile(tmp.Name())
	require.NoError(t, err)
	return string(b)
}

// TestReplayFormats: -format debezium prints one event per change of the same capture.
func TestReplayFormats(t *testing.T) {
	file := "../../decoding/testdata/captures/pg15-proto2-binary.txt"
	txn := captureStdout(t, func() error { return runReplay(context.Background(), []string{file}) })
	dbz := captureStdout(t, func() error {
		return runReplay(context.Background(), []string{"-format", "debezium", "-source-db", "app", file})
	})
	changes := 0
	for line := range strings.Lines(txn) {
		var v struct {
			Changes []json.RawMessage `json:"changes"`
			Op      string            `json:"op"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &v))
		changes += len(v.Changes)
		if v.Op != "" {
			changes++ // a non-transactional message
		}
	}
	events := 0
	for line := range strings.Lines(dbz) {
		var v struct {
			Source struct {
				DB string `json:"db"`
			} `json:"source"`
			Op string `json:"op"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &v))
		require.Equal(t, "app", v.Source.DB)
		events++
	}
	// One event per change, and one more per table of a multi-table truncate (the capture
	// truncates parent and child together).
	require.Equal(t, changes+1, events)
}

// TestReplayFlagErrors: a bad command line names the flag and says what is valid.
func TestReplayFlagErrors(t *testing.T) {
	file := "../../decoding/testdata/captures/pg15-proto2-binary.txt"
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"missing FILE"}},
		{[]string{"a", "b"}, []string{"one FILE"}},
		{[]string{"-proto", "9", file}, []string{"-proto 9", "1-4"}},
		{[]string{"-work-mem", "0", file}, []string{"-work-mem", "is zero", "none", "bare number is in kB"}},
		{[]string{"-work-mem", "64kb", file}, []string{"-work-mem \"64kb\"", "bare number is in kB"}},
		{[]string{"-format", "xml", file}, []string{"-format", "txn, debezium"}},
		{[]string{"-spill-compression", "gzip", file}, []string{"-spill-compression \"gzip\"", "none", "s2"}},
	} {
		err := runReplay(context.Background(), tc.args)
		require.Error(t, err, "%v", tc.args)
		for _, w := range tc.want {
			require.Contains(t, err.Error(), w, "%v", tc.args)
		}
	}
}

// genCapture writes a capture of one transaction inserting one row with a value of the given
// size, hex-encoding it in small pieces so that the generator itself holds little memory.
func genCapture(w io.Writer, size int) error {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rel := &decoding.Relation{RelationID: 16384, Namespace: "public", Name: "big",
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}, {Name: "v", TypeOID: 25}}}
	line := func(lsn decoding.LSN, m decoding.Message) error {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\t900\t%x\n", lsn, data)
		return err
	}
	if err := line(0x3000000, &decoding.Begin{FinalLSN: 0x3000100, CommitTime: at, Xid: 900}); err != nil {
		return err
	}
	if err := line(0, rel); err != nil {
		return err
	}
	// The Insert, written by hand so that the generator holds no copy of the value: type, relation,
	// 'N', two columns, "1" as text, then the value's text header and bytes.
	head := []byte{'I', 0, 0, 0x40, 0, 'N', 0, 2, 't', 0, 0, 0, 1, '1', 't',
		byte(size >> 24), byte(size >> 16), byte(size >> 8), byte(size)}
	if _, err := fmt.Fprintf(w, "0/3000010\t900\t%x", head); err != nil {
		return err
	}
	piece := []byte(strings.Repeat(hex.EncodeToString([]byte("abcdefghijklmnop")), 1024)) // 16 KiB of value
	for left := size; left > 0; left -= len(piece) / 2 {
		if _, err := w.Write(piece[:2*min(left, len(piece)/2)]); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	return line(0x3000100, &decoding.Commit{CommitLSN: 0x3000100, EndLSN: 0x3000130, CommitTime: at})
}

// countingWriter counts bytes and keeps the last few.
type countingWriter struct {
	n    int64
	tail []byte
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	c.tail = append(c.tail, p[max(0, len(p)-64):]...)
	c.tail = c.tail[max(0, len(c.tail)-64):]
	return len(p), nil
}

// TestReplayLargeRecordMemory: replaying one 32 MiB value at -work-mem 64kB allocates a small
// multiple of the value (the capture reader about two copies, the buffer its own copy and the
// read-back from its spill file), in both formats; before, the reader held the hex line several
// times over and the writer built the whole JSON line in memory. TotalAlloc counts every byte
// allocated, whatever the collector does, so the bound does not depend on timing.
func TestReplayLargeRecordMemory(t *testing.T) {
	const size = 32 << 20
	for _, kind := range format.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(genCapture(pw, size)) }()
			var out countingWriter
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			st, err := replay(context.Background(), pr, &out, reorderbuffer.Config{WorkMem: 64 << 10, Dir: t.TempDir()},
				format.Config{Kind: kind, TempDir: t.TempDir()})
			runtime.ReadMemStats(&after)
			require.NoError(t, err)
			require.EqualValues(t, 1, st.TotalTxns)
			require.Greater(t, out.n, int64(size))
			require.True(t, bytes.HasSuffix(out.tail, []byte("}\n")))
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s: allocated %.1f MiB for a %d MiB value (%.2fx)", kind, float64(allocated)/(1<<20), size>>20, float64(allocated)/size)
			require.Less(t, allocated, uint64(5*size))
		})
	}
}
