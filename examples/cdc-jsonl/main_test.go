package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestOpenOutput(t *testing.T) {
	tests := []struct {
		name, content, want, rest string
	}{
		{"empty", "", "0/0", ""},
		{"one line", `{"xid":1,"end_lsn":"0/16B3748","changes":[]}` + "\n", "0/16B3748", `{"xid":1,"end_lsn":"0/16B3748","changes":[]}` + "\n"},
		{"partial last line", `{"end_lsn":"0/10"}` + "\n" + `{"end_lsn":"1/2`, "0/10", `{"end_lsn":"0/10"}` + "\n"},
		{"message last", `{"end_lsn":"0/10"}` + "\n" + `{"op":"message","transactional":false,"lsn":"A/B"}` + "\n", "A/B",
			`{"end_lsn":"0/10"}` + "\n" + `{"op":"message","transactional":false,"lsn":"A/B"}` + "\n"},
		{"only partial", `{"end_lsn":"0/10"`, "0/0", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.jsonl")
			if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			f, lsn, err := openOutput(path)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			if lsn.String() != tt.want {
				t.Errorf("resume %s, want %s", lsn, tt.want)
			}
			if b, _ := os.ReadFile(path); string(b) != tt.rest {
				t.Errorf("file after open %q, want %q", b, tt.rest)
			}
		})
	}
	// A long last line spanning several read steps.
	path := filepath.Join(t.TempDir(), "long.jsonl")
	long := fmt.Sprintf(`{"end_lsn":"0/20","pad":"%0200000d"}`, 0)
	os.WriteFile(path, []byte(`{"end_lsn":"0/10"}`+"\n"+long+"\n"), 0o644)
	f, lsn, err := openOutput(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if lsn.String() != "0/20" {
		t.Errorf("resume %s after a long line, want 0/20", lsn)
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
