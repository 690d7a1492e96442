package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestResumeCost: resuming after a 50 MB last line reads two small files and allocates its write
// buffer, whatever the size of the file, and a torn line left by a crash is cut.
func TestResumeCost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "changes.jsonl")
	out, err := format.OpenFile(path, format.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir(), WorkMem: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, m := range []decoding.Message{
		&decoding.Begin{FinalLSN: 0x1000, Xid: 9},
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id"}, {Name: "v"}}},
		&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("1")},
			{Kind: 't', Data: bytes.Repeat([]byte{'x'}, 50<<20)}}},
		&decoding.Commit{CommitLSN: 0x1000, EndLSN: 0x1030},
	} {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Add(0, data); err != nil {
			t.Fatal(err)
		}
	}
	x, _ := b.Next()
	if err := out.WriteTxn(x); err != nil {
		t.Fatal(err)
	}
	size := out.Offset()
	out.Close()
	// A crash in the middle of the next transaction.
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte(`{"xid":10,"commit_lsn":"0/2000","end_l`))
	f.Close()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	out, err = format.OpenFile(path, format.Config{})
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if out.Resume() != 0x1030 || out.Offset() != size {
		t.Errorf("resume after %s at %d, want 0/1030 at %d", out.Resume(), out.Offset(), size)
	}
	if st, _ := os.Stat(path); st.Size() != size {
		t.Errorf("file has %d bytes after resuming, want %d (the torn line cut)", st.Size(), size)
	}
	t.Logf("resumed after a %d-byte line in %v, allocating %d bytes", size, elapsed, after.TotalAlloc-before.TotalAlloc)
	if n := after.TotalAlloc - before.TotalAlloc; n > 256<<10 { // its 64 KiB write buffer and small change
		t.Errorf("resuming allocated %d bytes", n)
	}
}

// TestCrashBeforeAck kills the consumer after it wrote a transaction but before it acknowledged
// it, several times, and checks the file holds every committed transaction exactly once.
func TestCrashBeforeAck(t *testing.T) {
	for _, major := range pgtest.Majors(t) {
		if major != 15 && major != 18 {
			continue
		}
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db := pgtest.NewDatabase(t, srv)
			if err := pgtest.Exec(ctx, srv.ConnString(db),
				`CREATE TABLE t (id int PRIMARY KEY, v text)`,
				`CREATE PUBLICATION pub FOR TABLE t`,
				`SELECT pg_create_logical_replication_slot('cdc', 'pgoutput')`,
				// A large transaction with a rolled-back savepoint, and small ones.
				`BEGIN; INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 3000) g;
				 SAVEPOINT a; INSERT INTO t SELECT g, 'gone' FROM generate_series(3001, 4000) g; ROLLBACK TO a;
				 INSERT INTO t SELECT g, 'kept' FROM generate_series(4001, 4500) g; COMMIT`,
				`INSERT INTO t VALUES (5001, 'a')`, `INSERT INTO t VALUES (5002, 'b')`, `UPDATE t SET v = 'c' WHERE id = 5001`,
				`DELETE FROM t WHERE id = 5002`, `INSERT INTO t VALUES (5003, 'done')`); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "changes.jsonl")
			crashes := 0
			c := config{dsn: srv.ReplicationConnString(db), slot: "cdc", publications: []string{"pub"}, out: out,
				log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
			errCrash := errors.New("crash")
			for round := 0; ; round++ {
				if round > 200 {
					t.Fatal("no progress")
				}
				rctx, stop := context.WithCancel(ctx)
				first := true
				c.afterWrite = func(x *reorderbuffer.Txn) error {
					if crashes < 3 && first {
						first = false
						crashes++
						return errCrash
					}
					if lineCount(t, out) == 6 {
						stop() // the last transaction is written
					}
					return nil
				}
				err := run(rctx, c)
				stop()
				if errors.Is(err, errCrash) {
					continue
				}
				if errors.Is(err, replication.ErrSlotActive) { // the dead consumer's walsender is still exiting
					time.Sleep(50 * time.Millisecond)
					continue
				}
				if !errors.Is(err, context.Canceled) {
					t.Fatal(err)
				}
				break
			}
			// 6 transactions: the large one and five small ones, each once.
			f, err := os.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			seen := map[string]bool{}
			rows := 0
			sc := bufio.NewScanner(f)
			sc.Buffer(nil, 16<<20)
			for sc.Scan() {
				var v struct {
					CommitLSN string            `json:"commit_lsn"`
					Changes   []json.RawMessage `json:"changes"`
				}
				if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
					t.Fatal(err)
				}
				if seen[v.CommitLSN] {
					t.Errorf("transaction %s written twice", v.CommitLSN)
				}
				seen[v.CommitLSN] = true
				rows += len(v.Changes)
			}
			if len(seen) != 6 || rows != 3500+5 {
				t.Errorf("%d transactions with %d changes, want 6 with 3505", len(seen), rows)
			}
			if crashes != 3 {
				t.Errorf("%d crashes injected, want 3", crashes)
			}
		})
	}
}

func lineCount(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range b {
		if c == '\n' {
			n++
		}
	}
	return n
}
