package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/stretchr/testify/require"
)

// waitSlotActive waits until a walsender streams the slot (writes before the slot exists would be
// missed).
func waitSlotActive(t *testing.T, ctx context.Context, dsn, slot string) {
	t.Helper()
	var err error
	if !pgtest.Until(ctx, func() bool {
		err = pgtest.Exec(ctx, dsn, fmt.Sprintf(`SELECT 1 / count(*)::int FROM pg_replication_slots WHERE slot_name = '%s' AND active`, slot))
		return err == nil
	}) {
		t.Fatalf("slot %s never became active: %v", slot, err)
	}
}

// streamMajors are the server versions the command's end-to-end tests run against.
func streamMajors(t *testing.T) []int {
	var out []int
	for _, m := range pgtest.Majors(t) {
		if m == 15 || m == 18 {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		pgtest.Unavailable(t, "neither PostgreSQL 15 nor 18 is installed")
	}
	return out
}

// TestStreamCommand runs `pgreorder stream` against a server in both formats, reads what it
// prints on stdout, and stops it as Ctrl-C would.
func TestStreamCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	for _, major := range streamMajors(t) {
		for _, kind := range format.Kinds {
			t.Run(fmt.Sprintf("pg%d/%s", major, kind), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				srv := pgtest.Shared(t, major)
				db := pgtest.NewDatabase(t, srv)
				dsn := srv.ConnString(db)
				require.NoError(t, pgtest.Exec(ctx, dsn, `CREATE TABLE s (id int PRIMARY KEY, v text)`, `CREATE PUBLICATION p FOR TABLE s`))
				r, w, err := os.Pipe()
				require.NoError(t, err)
				stdout := os.Stdout
				os.Stdout = w
				defer func() { os.Stdout = stdout }()
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() {
					done <- runStream(runCtx, []string{"-source", dsn, "-slot", "cli", "-publication", "p",
						"-create-slot", "-work-mem", "64kB", "-format", string(kind), "-source-db", db})
					w.Close()
				}()
				go func() {
					waitSlotActive(t, ctx, dsn, "cli")
					pgtest.Exec(ctx, dsn,
						`BEGIN; INSERT INTO s SELECT g, repeat('z', 100) FROM generate_series(1, 2000) g; SAVEPOINT a;
						 DELETE FROM s WHERE id > 1000; ROLLBACK TO a; COMMIT`,
						`UPDATE s SET v = NULL WHERE id = 7`)
				}()
				sc := bufio.NewScanner(r)
				sc.Buffer(nil, 64<<20)
				var got []map[string]any
				want := map[format.Kind]int{format.KindTxn: 2, format.KindDebezium: 2001}[kind]
				for len(got) < want && sc.Scan() {
					var v map[string]any
					require.NoError(t, json.Unmarshal(sc.Bytes(), &v), "%s", sc.Bytes())
					got = append(got, v)
				}
				stop()
				require.NoError(t, <-done)
				require.Len(t, got, want)
				switch kind {
				case format.KindTxn:
					require.Len(t, got[0]["changes"].([]any), 2000, "the rolled-back deletes dropped")
					c := got[1]["changes"].([]any)
					require.Len(t, c, 1)
					require.Equal(t, "update", c[0].(map[string]any)["op"])
				case format.KindDebezium:
					for _, ev := range got[:2000] {
						require.Equal(t, "c", ev["op"])
						require.Equal(t, db, ev["source"].(map[string]any)["db"])
					}
					last := got[2000]
					require.Equal(t, "u", last["op"])
					require.Nil(t, last["after"].(map[string]any)["v"])
					require.Equal(t, float64(7), last["after"].(map[string]any)["id"], "typed: a number")
				}
			})
		}
	}
}

// readOutput parses a -o file: its lines, each transaction's commit_lsn once.
func readOutput(t *testing.T, path string) (txns []string, changes int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, len(b) == 0 || b[len(b)-1] == '\n', "the file ends with a whole line")
	seen := map[string]bool{}
	for line := range bytes.Lines(b) {
		var v struct {
			CommitLSN string            `json:"commit_lsn"`
			Changes   []json.RawMessage `json:"changes"`
		}
		require.NoError(t, json.Unmarshal(line, &v), "%s", line)
		require.False(t, seen[v.CommitLSN], "transaction %s written twice", v.CommitLSN)
		seen[v.CommitLSN] = true
		txns = append(txns, v.CommitLSN)
		changes += len(v.Changes)
	}
	return txns, changes
}

// TestStreamFileKilled streams to a file with -o, kills the process with SIGKILL while it writes
// large transactions, starts it again with the same -o, and checks that the file ends up with every
// transaction exactly once and no torn line.
func TestStreamFileKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := filepath.Join(t.TempDir(), "pgreorder")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, major := range streamMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			dsn := srv.ConnString(db)
			require.NoError(t, pgtest.Exec(ctx, dsn, `CREATE TABLE s (id int PRIMARY KEY, v text)`, `CREATE PUBLICATION p FOR TABLE s`,
				`SELECT pg_create_logical_replication_slot('killed', 'pgoutput')`))
			const txns, rows = 6, 20000
			for i := range txns { // about 4.6 MB of JSON each
				require.NoError(t, pgtest.Exec(ctx, dsn, fmt.Sprintf(
					`INSERT INTO s SELECT g, repeat('k', 150) FROM generate_series(%d, %d) g`, i*rows+1, (i+1)*rows)))
			}
			path := filepath.Join(t.TempDir(), "out.jsonl")
			args := []string{"stream", "-source", dsn, "-slot", "killed", "-publication", "p", "-work-mem", "64kB", "-o", path}
			cmd := exec.CommandContext(ctx, bin, args...)
			require.NoError(t, cmd.Start())
			// Kill it while it writes the second transaction: the first is recorded and the file
			// has grown by a megabyte past it.
			recorded := func() int64 {
				s, err := changefeed.OpenFile(path + changefeed.PositionSuffix)
				if err != nil {
					return 0
				}
				defer s.Close()
				p, ok, err := s.Load(ctx, "killed")
				if err != nil || !ok {
					return 0
				}
				off, _ := strconv.ParseInt(string(p.State), 10, 64)
				return off
			}
			for {
				st, err := os.Stat(path)
				if off := recorded(); err == nil && off > 0 && st.Size() > off+1<<20 {
					break
				}
				require.NoError(t, ctx.Err())
				// A poll, at a millisecond: the kill must land within the second transaction's
				// writing, which takes tens of milliseconds.
				time.Sleep(time.Millisecond)
			}
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			cmd.Wait()
			st, err := os.Stat(path)
			require.NoError(t, err)
			t.Logf("killed with %d bytes written, %d recorded", st.Size(), recorded())
			require.Greater(t, st.Size(), recorded(), "the kill left a torn transaction to cut")

			// Start again in-process, and stop once every transaction is there. The killed
			// process's walsender may hold the slot for a moment.
			var done chan error
			var stop context.CancelFunc
			start := func() {
				var runCtx context.Context
				runCtx, stop = context.WithCancel(ctx)
				done = make(chan error, 1)
				go func() { done <- runStream(runCtx, args[1:]) }()
			}
			start()
			for {
				got, _ := readOutputLenient(path)
				if got >= txns {
					break
				}
				select {
				case err := <-done:
					if !errors.Is(err, replication.ErrSlotActive) {
						t.Fatalf("stream stopped: %v", err)
					}
					stop()
					pgtest.Eventually(t, 30*time.Second, "the killed process's walsender to release the slot", func() bool {
						return pgtest.Count(t, dsn, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'killed' AND active`) == 0
					})
					start()
				case <-time.After(20 * time.Millisecond):
				}
			}
			stop()
			require.NoError(t, <-done)
			lsns, changes := readOutput(t, path)
			require.Len(t, lsns, txns)
			require.Equal(t, txns*rows, changes)
			st, err = os.Stat(path)
			require.NoError(t, err)
			require.Equal(t, st.Size(), recorded())
		})
	}
}

// readOutputLenient counts the whole lines of a file that is being written.
func readOutputLenient(path string) (int, error) {
	b, err := os.ReadFile(path)
	return bytes.Count(b, []byte{'\n'}), err
}

// TestStreamFlagErrors: a bad command line names the flag and says what is valid.
func TestStreamFlagErrors(t *testing.T) {
	base := []string{"-source", "host=/nonexistent", "-slot", "s", "-publication", "p"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"missing -source, -slot, -publication"}},
		{[]string{"-source", "x"}, []string{"missing -slot, -publication"}},
		{[]string{"-source", "x", "-slot", "s"}, []string{"missing -publication"}},
		{append([]string{"-proto", "9"}, base...), []string{"-proto 9", "1-4"}},
		{append([]string{"-work-mem", "0"}, base...), []string{"-work-mem", "none", "bare number is in kB"}},
		{append([]string{"-streaming", "yes"}, base...), []string{"-streaming", "off, on and parallel"}},
		{append([]string{"-origin-filter", "all"}, base...), []string{"-origin-filter", "any and none"}},
		{append([]string{"-format", "avro"}, base...), []string{"-format", "txn, debezium"}},
		{append([]string{"-resume", "nope"}, base...), []string{"-resume", "0/16B3748"}},
		{append([]string{"-resume", "0/1", "-o", "f"}, base...), []string{"-resume and -o"}},
		{append([]string{"-temporary"}, base...), []string{"-temporary needs -create-slot"}},
		{append([]string{"-file-mode", "999"}, base...), []string{"-file-mode", "octal"}},
		{append(base, "extra"), []string{"unexpected arguments: extra"}},
	} {
		err := runStream(context.Background(), tc.args)
		require.Error(t, err, "%v", tc.args)
		for _, w := range tc.want {
			require.Contains(t, err.Error(), w, "%v", tc.args)
		}
	}
	// The usage text says how to cut a torn line.
	var buf strings.Builder
	buf.WriteString(streamUsage)
	require.Contains(t, buf.String(), "truncate -s")
}
