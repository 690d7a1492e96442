package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestKilled runs the command against a table being written to, kills it with SIGKILL again and
// again (the first time during its initial copy), starts it again each time, and checks that the
// file holds what the source holds: every copied row once, every later change once, and, replayed
// by key, the source's rows exactly.
func TestKilled(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGREORDER_SEED"); s != "" {
		_, err := fmt.Sscan(s, &seed)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set PGREORDER_SEED to replay)", seed)
	bin := filepath.Join(t.TempDir(), "cdc-jsonl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ran := false
	for _, major := range pgtest.Majors(t) {
		if major != 15 && major != 18 {
			continue
		}
		ran = true
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			killed(t, bin, pgtest.Shared(t, major), rand.New(rand.NewPCG(seed, uint64(major))))
		})
	}
	if !ran {
		pgtest.Unavailable(t, "neither PostgreSQL 15 nor 18 is installed")
	}
}

func killed(t *testing.T, bin string, srv *pgtest.Server, rng *rand.Rand) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	require.NoError(t, pgtest.Exec(ctx, dsn,
		`CREATE TABLE t (id int PRIMARY KEY, n int NOT NULL, pad text)`,
		`INSERT INTO t SELECT g, 0, repeat('p', 300) FROM generate_series(1, 40000) g`, // a copy that takes a moment
		`CREATE PUBLICATION pub FOR TABLE t`))
	path := filepath.Join(t.TempDir(), "changes.jsonl")

	var logs pgtest.LockedBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the command's log:\n%s", logs.String())
		}
	})
	start := func() *exec.Cmd {
		c := exec.Command(bin, dsn, "cdc", "pub", path)
		c.Stdout, c.Stderr = &logs, &logs
		require.NoError(t, c.Start())
		return c
	}
	// exited checks how the command ended: killed, or stopped with SIGINT, never by itself.
	exited := func(c *exec.Cmd, sig syscall.Signal) {
		err := c.Wait()
		if st, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && sig == syscall.SIGKILL && st.Signaled() {
			return
		}
		require.NoError(t, err, "the command stopped by itself:\n%s", logs.String())
	}

	// The writer: inserts, updates, deletes, a rolled-back transaction and a rolled-back
	// savepoint, each transaction's effect recorded only by the source itself.
	done := make(chan error, 1)
	stopWriting := make(chan struct{})
	go func() { done <- write(ctx, dsn, rng.Uint64(), stopWriting) }()

	// The first kill comes during the copy: the output then holds copied rows and no position
	// that counts them.
	cmd := start()
	pgtest.Eventually(t, time.Minute, "the copy to write a megabyte", func() bool {
		st, err := os.Stat(path)
		return err == nil && st.Size() > 1<<20
	})
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	exited(cmd, syscall.SIGKILL)
	kills := 1
	for ; kills < 6; kills++ {
		cmd = start()
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond) // the moment of the kill, at random
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		exited(cmd, syscall.SIGKILL)
	}
	// The last run: until its copy is done and the slot has confirmed everything the source
	// wrote, then a clean stop. The writer stops only once the copy is stored as done: what it
	// wrote meanwhile comes through the stream, whatever the kills' moments left to copy again.
	// (A slot the run creates for its copy is at the end of the WAL from the start: it says
	// nothing until the copy is stored as done.)
	cmd = start()
	pgtest.Eventually(t, 2*time.Minute, "the last run's copy stored as done", func() bool { return copyDone(ctx, path) })
	close(stopWriting)
	require.NoError(t, <-done)
	end := pgtest.QueryText(t, dsn, `SELECT pg_current_wal_lsn()::text`)
	pgtest.Eventually(t, 2*time.Minute, "the slot confirmed past "+end, func() bool {
		return pgtest.QueryOne[bool](t, dsn, `SELECT coalesce(bool_or(confirmed_flush_lsn >= $1::pg_lsn), false)
			FROM pg_replication_slots WHERE slot_name = 'cdc'`, end)
	})
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	exited(cmd, syscall.SIGINT)
	t.Logf("%d kills", kills)
	got := replay(t, path)
	want := map[int]int{}
	require.NoError(t, withConn(ctx, dsn, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT id, n FROM t`)
		if err != nil {
			return err
		}
		var id, n int
		_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { want[id] = n; return nil })
		return err
	}))
	require.Empty(t, pgtest.MapDiff(got, want, 20), "ids and n: %d rows in the source, %d in the output", len(want), len(got))
}

// write writes to t until stop is closed: small transactions, and some that roll back, whole or
// in part. It stops between transactions, never in one: a statement cut short by a cancelled
// context may still commit on the server after write returned, after the test read the WAL's end.
func write(ctx context.Context, dsn string, seed uint64, stop <-chan struct{}) error {
	rng := rand.New(rand.NewPCG(seed, 7))
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	next := 40001
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		id := 1 + rng.IntN(next-1)
		var stmts []string
		switch k := rng.IntN(10); {
		case k < 3:
			stmts = []string{fmt.Sprintf(`INSERT INTO t VALUES (%d, 0, 'new')`, next)}
			next++
		case k < 7:
			stmts = []string{fmt.Sprintf(`UPDATE t SET n = n + 1 WHERE id BETWEEN %d AND %d`, id, id+rng.IntN(50))}
		case k < 8:
			stmts = []string{fmt.Sprintf(`DELETE FROM t WHERE id = %d`, id)}
		case k < 9:
			stmts = []string{`BEGIN`, fmt.Sprintf(`UPDATE t SET n = n + 100 WHERE id < %d`, id), `ROLLBACK`}
		default:
			stmts = []string{`BEGIN`, fmt.Sprintf(`UPDATE t SET n = n + 1 WHERE id = %d`, id), `SAVEPOINT s`,
				`UPDATE t SET n = n + 1000 WHERE id < 1000`, `ROLLBACK TO s`, `COMMIT`}
		}
		for _, s := range stmts {
			if _, err := conn.Exec(ctx, s); err != nil {
				return err
			}
		}
	}
}

// replay reads the Debezium lines and applies them by key, checking that each copied row and
// each streamed change is there once.
func replay(t *testing.T, path string) map[int]int {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	type row struct {
		ID int  `json:"id"`
		N  *int `json:"n"`
	}
	var ev struct {
		Op          string `json:"op"`
		Before      *row   `json:"before"`
		After       *row   `json:"after"`
		Transaction *struct {
			ID    string `json:"id"`
			Total int    `json:"total_order"`
		} `json:"transaction"`
	}
	rows := map[int]int{}
	copied := map[int]bool{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		ev.Before, ev.After, ev.Transaction = nil, nil, nil
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "%s", sc.Bytes())
		switch ev.Op {
		case "r":
			require.False(t, copied[ev.After.ID], "row %d copied twice", ev.After.ID)
			copied[ev.After.ID] = true
		case "c", "u", "d":
			require.NotNil(t, ev.Transaction, "%s", sc.Bytes())
			k := ev.Transaction.ID + "/" + strconv.Itoa(ev.Transaction.Total)
			require.False(t, seen[k], "change %s twice", k)
			seen[k] = true
		default:
			t.Fatalf("unexpected event %s", sc.Bytes())
		}
		if ev.Op == "d" {
			delete(rows, ev.Before.ID)
		} else {
			rows[ev.After.ID] = *ev.After.N
		}
	}
	require.NoError(t, sc.Err())
	t.Logf("%d rows copied, %d changes streamed", len(copied), len(seen))
	require.Greater(t, len(copied), 39000, "copied rows")
	require.NotEmpty(t, seen, "streamed changes")
	return rows
}

// withConn runs f on a new connection to dsn.
func withConn(ctx context.Context, dsn string, f func(*pgx.Conn) error) error {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	return f(c)
}

// copyDone reports whether the position stored beside the output at path says the copy is done.
func copyDone(ctx context.Context, path string) bool {
	s, err := changefeed.OpenFile(path + changefeed.PositionSuffix)
	if err != nil {
		return false
	}
	defer s.Close()
	p, ok, err := s.Load(ctx, "cdc")
	return err == nil && ok && p.CopyDone
}
