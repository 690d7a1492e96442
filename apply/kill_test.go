package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// childEnv carries the configuration of an applier run by a re-executed test binary.
const childEnv = "PGREORDER_APPLY_CHILD"

// childConfig is what the child applies with.
type childConfig struct {
	Source, Target, Slot string
	Mode                 Mode
	Workers              int
	WorkMem              int64
	// Copy makes the initial copy, in chunks of CopyChunkSize bytes. With Stall set, the calls
	// of that hook stage after the first StallAfter write "stalled at STAGE" to stderr and wait
	// until the child is killed.
	Copy          bool
	CopyChunkSize int64
	Stall         string
	StallAfter    int32
	StallOnce     bool // only the call after the first StallAfter stalls
	CommitOrder   CommitOrder
	RunTxns       int  // Config.runTxns
	WorkersOnly   bool // hooks.workersOnly
	// Migration options.
	SkipLSN               decoding.LSN
	SchemaChanges         SchemaChanges
	SyncSequences         bool
	SyncSequencesInterval time.Duration
}

// runChild runs an applier until SIGTERM, or until it is killed.
func runChild() int {
	var c childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &c); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	level := slog.LevelInfo
	if os.Getenv("PGREORDER_APPLY_DEBUG") != "" {
		level = slog.LevelDebug
	}
	cfg := Config{
		Source:  replication.Config{ConnString: c.Source, Slot: c.Slot, Publications: []string{"pub"}, StatusInterval: 100 * time.Millisecond, Buffer: reorderbuffer.Config{WorkMem: c.WorkMem}},
		Target:  c.Target,
		Mode:    c.Mode,
		Workers: c.Workers,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("child", os.Getpid()),
	}
	cfg.Copy, cfg.CopyWorkers = c.Copy, 2
	cfg.runTxns = c.RunTxns
	cfg.CommitOrder = c.CommitOrder
	cfg.SkipLSN, cfg.SchemaChanges = c.SkipLSN, c.SchemaChanges
	cfg.SyncSequences, cfg.SyncSequencesInterval = c.SyncSequences, c.SyncSequencesInterval
	var stalls atomic.Int32
	cfg.hooks = &hooks{copyChunkSize: c.CopyChunkSize, workersOnly: c.WorkersOnly, stage: func(ctx context.Context, stage string, x txnRef) error {
		if stage != c.Stall {
			return nil
		}
		if n := stalls.Add(1); n > c.StallAfter && (!c.StallOnce || n == c.StallAfter+1) {
			fmt.Fprintln(os.Stderr, "stalled at", stage)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, cfg); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// child is an applier in a process of its own.
type child struct {
	cmd    *exec.Cmd
	stderr *pgtest.LockedBuffer
	done   chan error
}

func startChild(t *testing.T, c childConfig) *child {
	t.Helper()
	b, err := json.Marshal(c)
	must(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	ch := &child{cmd: cmd, stderr: &pgtest.LockedBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = ch.stderr
	must(t, cmd.Start())
	go func() { ch.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-ch.done
		if t.Failed() {
			t.Logf("child %d stderr:\n%s", cmd.Process.Pid, ch.stderr)
		}
	})
	return ch
}

func (ch *child) kill(t *testing.T) {
	t.Helper()
	must(t, ch.cmd.Process.Signal(syscall.SIGKILL))
	<-ch.done
	ch.done <- nil // for the cleanup
}

// waitWorkers waits until at least n worker connections of the target have written in their
// open transactions, or fails t.
func waitWorkers(t *testing.T, ctx context.Context, dsn, src string, n int, ch *child) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer conn.Close(context.Background())
	for {
		var got int
		must(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name LIKE 'pgreorder apply % w%' AND backend_xid IS NOT NULL`).Scan(&got))
		if got >= n {
			return
		}
		select {
		case err := <-ch.done:
			t.Fatalf("the child stopped: %v\n%s", err, ch.stderr)
		case <-ctx.Done():
			rows, _ := conn.Query(context.Background(), `SELECT application_name, state, backend_xid::text, wait_event_type, left(query, 60)
				FROM pg_stat_activity WHERE datname = current_database()`)
			for rows.Next() {
				v, _ := rows.Values()
				t.Log(v...)
			}
			if sc, err := pgx.Connect(context.Background(), src); err == nil {
				rows, _ := sc.Query(context.Background(), `SELECT * FROM pg_stat_replication_slots`)
				for rows.Next() {
					v, _ := rows.Values()
					t.Log(v...)
				}
				sc.Close(context.Background())
			}
			ch.cmd.Process.Signal(syscall.SIGQUIT) // a goroutine dump in its stderr, as it exits
			select {
			case err := <-ch.done:
				ch.done <- err // for the cleanup
			case <-time.After(10 * time.Second):
			}
			t.Fatalf("fewer than %d workers wrote", n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitStalled waits until the child reports a stalled hook, or fails t.
func waitStalled(t *testing.T, ctx context.Context, ch *child) {
	t.Helper()
	for !strings.Contains(ch.stderr.String(), "stalled at") {
		select {
		case err := <-ch.done:
			t.Fatalf("the child stopped: %v\n%s", err, ch.stderr)
		case <-ctx.Done():
			t.Fatalf("the child did not stall: %v", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestKill kills the applier process (SIGKILL) while workers have transactions open on the target
// (a streamed transaction applied eagerly, with savepoints; committed transactions applied in
// parallel), starts it again, and checks that the target ends equal to the source with nothing
// applied twice (the keyless events table would show a duplicate, items' key a conflict).
func TestKill(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d/eager-streamed", major), func(t *testing.T) {
			e := newEnv(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Eager, WorkMem: 256 << 10}
			first := startChild(t, cc)
			big, err := pgx.Connect(ctx, e.src)
			must(t, err)
			defer big.Close(context.Background())
			ex := func(sql string) {
				t.Helper()
				_, err := big.Exec(ctx, sql)
				must(t, err)
			}
			// A large transaction, streamed: a subtransaction kept, one rolled back.
			ex(`BEGIN`)
			ex(`SAVEPOINT a`)
			ex(`INSERT INTO big SELECT g, 1, repeat('k', 150) FROM generate_series(1, 1500) g`)
			ex(`RELEASE SAVEPOINT a`)
			ex(`SAVEPOINT b`)
			ex(`INSERT INTO big SELECT g, 2, repeat('r', 150) FROM generate_series(5001, 6000) g`)
			ex(`ROLLBACK TO SAVEPOINT b`)
			ex(`INSERT INTO events VALUES ('big', 1)`)
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items VALUES (1, 1, 'small'), (2, 2, 'small')`, `INSERT INTO events VALUES ('small', 1)`))
			waitWorkers(t, ctx, e.dst, e.src, 1, first) // the worker applies it, uncommitted
			first.kill(t)
			startChild(t, cc)
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items VALUES (3, 3, 'small')`, `INSERT INTO events VALUES ('small', 2)`))
			ex(`SAVEPOINT c`)
			ex(`INSERT INTO big SELECT g, 3, repeat('c', 150) FROM generate_series(7001, 8000) g`)
			ex(`ROLLBACK TO SAVEPOINT c`)
			ex(`UPDATE big SET payload = 'u' WHERE id % 10 = 0`)
			ex(`INSERT INTO events VALUES ('big', 2)`)
			ex(`COMMIT`)
			// Then the mixed workload, on other keys.
			must(t, workload(ctx, e.src, seeded(t), 1, nil))
			waitMarkerCtx(t, ctx, e.dst, 1)
			e.compare(t)
		})
		// After 20 commits, the next one stalls until the kill. With runs of one transaction, all
		// on workers, the transactions after it pile up, applied and uncommitted, on the other
		// workers (a leader that took chained runs over would stall its own group instead); with
		// runs of any size the process dies while a run of several transactions commits.
		for _, v := range []struct {
			name    string
			runTxns int
			writers int
		}{{"parallel", 1, 2}, {"parallel-runs", 0, 0}} {
			t.Run(fmt.Sprintf("pg%d/%s", major, v.name), func(t *testing.T) {
				e := newEnv(t, major)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				cc := childConfig{Source: e.repl, Target: e.dst, Slot: e.slot, Mode: Parallel, Workers: 4,
					WorkMem: 256 << 10, Stall: "before-commit", StallAfter: 20, RunTxns: v.runTxns, WorkersOnly: v.writers > 0}
				first := startChild(t, cc)
				rng := seeded(t)
				done := make(chan error, 1)
				go func() { done <- concurrent(ctx, e.src, rng, 4, 100) }()
				if v.writers > 0 {
					waitWorkers(t, ctx, e.dst, e.src, v.writers, first)
				} else {
					waitStalled(t, ctx, first)
				}
				first.kill(t)
				must(t, <-done)
				cc.Stall = ""
				startChild(t, cc)
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
				waitMarkerCtx(t, ctx, e.dst, 1)
				e.compare(t)
			})
		}
	}
}

// waitMarkerCtx waits until the target has marker row id, or fails t when ctx ends.
func waitMarkerCtx(t *testing.T, ctx context.Context, dsn string, id int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer conn.Close(context.Background())
	arrived := pgtest.Until(ctx, func() bool {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM marker WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatalf("waiting for marker %d: %v", id, err)
		}
		return n > 0
	})
	if !arrived {
		t.Fatalf("waiting for marker %d: %v", id, ctx.Err())
	}
}
