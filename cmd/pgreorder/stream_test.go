package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/pgtest"
)

// TestStreamCommand runs `pgreorder stream` against a throwaway server, reads the JSON lines it
// prints, and stops it as Ctrl-C would.
func TestStreamCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	pgtest.Majors(t) // skips without servers, or fails with PGREORDER_REQUIRE_PG=1
	installs := pgtest.FindInstalls()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, installs[len(installs)-1], pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if err := pgtest.Exec(ctx, srv.ConnString("postgres"),
		`CREATE TABLE s (id int PRIMARY KEY, v text)`, `CREATE PUBLICATION p FOR TABLE s`); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = stdout }()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- runStream(runCtx, []string{"-dsn", srv.ConnString("postgres"), "-slot", "cli", "-publication", "p",
			"-create-slot", "-work-mem", "64kB"})
		w.Close()
	}()
	go func() {
		// Write only once the slot exists (1 / 0 fails until then).
		for ctx.Err() == nil {
			if err := pgtest.Exec(ctx, srv.ConnString("postgres"), `SELECT 1 / count(*)::int FROM pg_replication_slots WHERE slot_name = 'cli' AND active`); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		pgtest.Exec(ctx, srv.ConnString("postgres"),
			`BEGIN; INSERT INTO s SELECT g, repeat('z', 100) FROM generate_series(1, 2000) g; SAVEPOINT a;
			 DELETE FROM s WHERE id > 1000; ROLLBACK TO a; COMMIT`,
			`UPDATE s SET v = NULL WHERE id = 7`)
	}()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 64<<20)
	var got []map[string]any
	for len(got) < 2 && sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		got = append(got, v)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d lines", len(got))
	}
	if n := len(got[0]["changes"].([]any)); n != 2000 {
		t.Errorf("first transaction has %d changes, want 2000 (the rolled-back deletes dropped)", n)
	}
	if c := got[1]["changes"].([]any); len(c) != 1 || c[0].(map[string]any)["op"] != "update" {
		t.Errorf("second transaction: %v", c)
	}
}
