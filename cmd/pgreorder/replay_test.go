package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/internal/jsonl"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

// committedTxns runs replay over a capture file and returns its transactions with changes, in
// the form jsonl.Comparable gives.
func committedTxns(t *testing.T, file string, workMem int64) []string {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var out bytes.Buffer
	_, err = replay(context.Background(), f, &out, reorderbuffer.Config{WorkMem: workMem, Dir: t.TempDir()})
	require.NoError(t, err, file)
	txns, err := jsonl.Comparable(out.String())
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
			_, err := replay(context.Background(), strings.NewReader("# comment\n"+in), &out, reorderbuffer.Config{Dir: t.TempDir()})
			require.Error(t, err)
			require.Contains(t, err.Error(), "line 2")
		})
	}
}
