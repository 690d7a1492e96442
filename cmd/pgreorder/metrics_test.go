package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/scrape"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// lineLog collects the lines a process writes, safe for concurrent use.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func (l *lineLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

var metricsURL = regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+/metrics)`)

// served is a command serving metrics: its address, its stderr lines, and a channel closed once
// its stderr has been read to the end.
type served struct {
	url  string
	log  *lineLog
	done <-chan struct{}
	ctx  context.Context
	t    *testing.T
}

// serveMetrics starts cmd, which logs its metrics address on stderr. The caller kills cmd.
func serveMetrics(ctx context.Context, t *testing.T, cmd *exec.Cmd) *served {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	log := &lineLog{}
	urls := make(chan string, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.add(sc.Text())
			if m := metricsURL.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
	}()
	s := &served{log: log, done: readDone, ctx: ctx, t: t}
	select {
	case s.url = <-urls:
	case <-readDone:
		t.Fatalf("no metrics address logged:\n%s", strings.Join(log.all(), "\n"))
	case <-ctx.Done():
		t.Fatal("no metrics address logged")
	}
	return s
}

// wait polls the metrics until cond holds, failing the test with the last scrape and the
// command's stderr once the context ends.
func (s *served) wait(what string, cond func(map[string]float64) bool) map[string]float64 {
	s.t.Helper()
	var v map[string]float64
	if !pgtest.Until(s.ctx, func() bool { v = scrape.Get(s.ctx, s.t, s.url); return cond(v) }) {
		s.t.Fatalf("waiting for %s; last scrape: %v\nstderr:\n%s", what, v, strings.Join(s.log.all(), "\n"))
	}
	return v
}

// TestStreamMetrics runs `pgreorder stream -metrics-addr 127.0.0.1:0` against PostgreSQL 15 and
// 18, scrapes /metrics over HTTP while a workload runs, and checks that the values move as they
// must: changes counted equal rows inserted, spilled bytes with a small work memory, lag back to
// 0 once caught up, a reconnection counted after the walsender is terminated. It also checks the
// progress lines on stderr, and that nothing but /metrics is served.
func TestStreamMetrics(t *testing.T) {
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
				`SELECT pg_create_logical_replication_slot('met', 'pgoutput')`))
			cmd := exec.CommandContext(ctx, bin, "stream", "-source", dsn, "-slot", "met", "-publication", "p",
				"-work-mem", "64kB", "-status-interval", "100ms", "-progress", "200ms", "-metrics-addr", "127.0.0.1:0",
				"-o", filepath.Join(t.TempDir(), "out.jsonl"))
			sv := serveMetrics(ctx, t, cmd)
			defer cmd.Process.Kill()
			url, wait, log, readDone := sv.url, sv.wait, sv.log, sv.done
			v := wait("caught up at the start", func(v map[string]float64) bool { return v["pgreorder_caught_up"] == 1 })
			require.Zero(t, v["pgreorder_received_changes_total"])

			const bigRows, small, smallRows = 5000, 10, 10
			require.NoError(t, pgtest.Exec(ctx, dsn,
				fmt.Sprintf(`INSERT INTO s SELECT g, repeat('x', 200) FROM generate_series(1, %d) g`, bigRows)))
			for i := range small {
				lo := bigRows + i*smallRows + 1
				require.NoError(t, pgtest.Exec(ctx, dsn,
					fmt.Sprintf(`INSERT INTO s SELECT g, 'small' FROM generate_series(%d, %d) g`, lo, lo+smallRows-1)))
			}
			const rows = bigRows + small*smallRows
			v = wait("every change, caught up", func(v map[string]float64) bool {
				return v["pgreorder_received_changes_total"] == rows && v["pgreorder_caught_up"] == 1 && v["pgreorder_lag_bytes"] == 0
			})
			for name, want := range map[string]float64{
				"pgreorder_received_transactions_total":       small + 1,
				"pgreorder_acknowledged_transactions_total":   small + 1,
				"pgreorder_unacknowledged_transactions":       0,
				"pgreorder_oldest_unacknowledged_age_seconds": 0,
				"pgreorder_lag_seconds":                       0,
				"pgreorder_reconnects_total":                  0,
			} {
				require.Equal(t, want, v[name], name)
			}
			require.Positive(t, v["pgreorder_spilled_bytes_total"], "64kB of work memory")
			require.Positive(t, v["pgreorder_memory_peak_bytes"])
			require.Equal(t, v[`pgreorder_wal_position_bytes{position="received"}`], v[`pgreorder_wal_position_bytes{position="flushed"}`])
			require.Contains(t, v, "go_goroutines", "the runtime's metrics too")

			// Nothing else is served.
			for _, path := range []string{"/", "/debug/pprof/", "/metrics/x"} {
				resp, err := http.Get(strings.TrimSuffix(url, "/metrics") + path)
				require.NoError(t, err)
				resp.Body.Close()
				require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
			}

			// A terminated walsender: the stream reconnects and counts it.
			require.NoError(t, pgtest.Exec(ctx, dsn,
				`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'met'`))
			wait("a reconnection", func(v map[string]float64) bool { return v["pgreorder_reconnects_total"] == 1 })
			require.NoError(t, pgtest.Exec(ctx, dsn, `INSERT INTO s VALUES (0, 'after')`))
			wait("the change after the reconnection", func(v map[string]float64) bool {
				return v["pgreorder_received_changes_total"] == rows+1 && v["pgreorder_caught_up"] == 1 && v["pgreorder_lag_bytes"] == 0
			})

			// Progress lines: one line each, with what a user wants to know; one says the stream
			// caught up again after the reconnection.
			progressLines := func() []string {
				var out []string
				for _, l := range log.all() {
					if strings.Contains(l, " received ") && strings.Contains(l, " | acked ") {
						out = append(out, l)
					}
				}
				return out
			}
			final := fmt.Sprintf("received %d txns, 5.10k changes | acked %d | caught up", small+2, small+2)
			found := pgtest.Until(ctx, func() bool {
				return slices.ContainsFunc(progressLines(), func(l string) bool {
					return strings.Contains(l, final) && strings.HasSuffix(l, "| reconnects 1")
				})
			})
			require.True(t, found, "no progress line with %q:\n%s", final, strings.Join(log.all(), "\n"))
			progress := progressLines()
			for _, want := range []string{" txns, ", " changes | acked ", " txn/s, ", " changes/s | memory ", ", peak ", " | spilled "} {
				require.Contains(t, progress[0], want)
			}
			// The lag, or "caught up": one of the two, never both.
			lag, caught := strings.Contains(progress[0], " | lag "), strings.Contains(progress[0], " | caught up")
			require.True(t, lag != caught, "lag or caught up, not both: %s", progress[0])
			last := progress[len(progress)-1]

			require.NoError(t, cmd.Process.Signal(os.Interrupt))
			<-readDone // stderr read to its end before Wait, which closes the pipe
			require.NoError(t, cmd.Wait(), "a clean stop:\n%s", strings.Join(log.all(), "\n"))
			_, err = http.Get(url)
			require.Error(t, err, "the metrics server stops with the command")
			t.Logf("progress: %d lines, the last: %s", len(progress), last)
		})
	}
}

// TestProgressLines drives the progress printer with readings made up for it: a line when
// something moved or the stream is behind, none while it stays caught up and idle.
func TestProgressLines(t *testing.T) {
	at := time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)
	idle := metrics.Reading{Time: at, Activity: replication.Activity{CaughtUp: true}}
	busy := func(txns int64, caughtUp bool) metrics.Reading {
		return metrics.Reading{Time: at, Stats: reorderbuffer.Stats{TotalTxns: txns, TotalChanges: 10 * txns},
			Activity: replication.Activity{CaughtUp: caughtUp, Acked: txns}}
	}
	readings := []metrics.Reading{
		idle, idle, idle, // one line, then nothing
		busy(5, false), busy(5, false), // behind: a line each time
		busy(9, true), busy(9, true), busy(9, true), // caught up: one line
		busy(10, true), // moved while caught up between readings: a line
	}
	want := []int{0, 3, 4, 5, 8}
	var mu sync.Mutex
	i := 0
	done := make(chan struct{})
	read := func() metrics.Reading {
		mu.Lock()
		defer mu.Unlock()
		if i == len(readings) {
			select {
			case <-done:
			default:
				close(done)
			}
			return readings[len(readings)-1]
		}
		i++
		return readings[i-1]
	}
	var buf bytes.Buffer
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		printProgress(stop, &buf, time.Millisecond, read)
	}()
	<-done
	close(stop)
	<-finished
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, len(want), buf.String())
	for j, k := range want {
		require.Equal(t, "12:00:00 "+readings[k].String(), lines[j])
	}
}

// TestProgressFlag: -progress takes an interval; negative ones are refused.
func TestProgressFlag(t *testing.T) {
	err := runStream(context.Background(), []string{"-source", "x", "-slot", "s", "-publication", "p", "-progress", "-1s"})
	require.ErrorContains(t, err, "-progress -1s")
}

// lagLine matches a progress line's lag while behind: bytes above 0, and a time.
var lagLine = regexp.MustCompile(`\| lag [1-9][0-9.]* (B|KiB|MiB|GiB), [0-9.]+(ms|s|m[0-9]+s) \|`)

// TestApplyMetrics runs `pgreorder apply -metrics-addr 127.0.0.1:0 -progress 100ms` against
// PostgreSQL 15 and 18, holds the applier back with a lock on the target table while the source
// commits a transaction, and checks that /metrics and the progress line show the lag in bytes
// and in time, then 0 and caught up once the lock is released and the transaction applied.
func TestApplyMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := filepath.Join(t.TempDir(), "pgreorder")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	majors := streamMajors(t)
	for _, major := range majors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// The target on the other server if there are two: on one server, the applier's
			// progress row writes are WAL the source sends again, and it is seldom caught up.
			srv, dsrv := pgtest.Shared(t, major), pgtest.Shared(t, major)
			for _, m := range majors {
				if m != major {
					dsrv = pgtest.Shared(t, m)
				}
			}
			srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, dsrv)
			src, dst := srv.ConnString(srcDB), dsrv.ConnString(dstDB)
			const table = `CREATE TABLE s (id int PRIMARY KEY, v text)`
			require.NoError(t, pgtest.Exec(ctx, src, table, `CREATE PUBLICATION p FOR TABLE s`))
			require.NoError(t, pgtest.Exec(ctx, dst, table))
			cmd := exec.CommandContext(ctx, bin, "apply", "-source", src, "-target", dst, "-slot", "am",
				"-publication", "p", "-create-slot", "-status-interval", "100ms", "-progress", "100ms",
				"-metrics-addr", "127.0.0.1:0")
			sv := serveMetrics(ctx, t, cmd)
			defer cmd.Process.Kill()
			url, wait, log, readDone := sv.url, sv.wait, sv.log, sv.done
			// waitLine waits for a progress line that match accepts.
			waitLine := func(what string, match func(string) bool) string {
				t.Helper()
				var line string
				found := pgtest.Until(ctx, func() bool {
					for _, l := range log.all() {
						if strings.Contains(l, " applied ") && match(l) {
							line = l
							return true
						}
					}
					return false
				})
				require.True(t, found, "no progress line %s:\n%s", what, strings.Join(log.all(), "\n"))
				return line
			}
			caughtUp := func(v map[string]float64) bool {
				return v["pgreorder_caught_up"] == 1 && v["pgreorder_lag_bytes"] == 0 && v["pgreorder_lag_seconds"] == 0
			}
			wait("caught up at the start", caughtUp)

			lock := pgtest.Connect(t, dst)
			defer lock.Close(context.Background())
			pgtest.MustExec(t, lock, `BEGIN; LOCK TABLE s IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, pgtest.Exec(ctx, src, `INSERT INTO s SELECT g, 'x' FROM generate_series(1, 100) g`))
			v := wait("behind in bytes and in time", func(v map[string]float64) bool {
				return v["pgreorder_caught_up"] == 0 && v["pgreorder_lag_bytes"] > 0 && v["pgreorder_lag_seconds"] > 0
			})
			require.Zero(t, v["pgreorder_acknowledged_transactions_total"])
			behind := waitLine("with a lag while held back", func(l string) bool {
				return strings.Contains(l, " applied 0 txns: ") && lagLine.MatchString(l)
			})
			pgtest.MustExec(t, lock, `COMMIT`)
			wait("caught up once applied", func(v map[string]float64) bool {
				return caughtUp(v) && v["pgreorder_acknowledged_transactions_total"] >= 1
			})
			done := waitLine("caught up once applied", func(l string) bool {
				return strings.Contains(l, " applied 1 txns: 100 inserts (") && strings.Contains(l, "| caught up |")
			})

			require.NoError(t, cmd.Process.Signal(os.Interrupt))
			<-readDone // stderr read to its end before Wait, which closes the pipe
			require.NoError(t, cmd.Wait(), "a clean stop:\n%s", strings.Join(log.all(), "\n"))
			final := log.all()[len(log.all())-1]
			for _, key := range []string{"msg=progress", " transactions=1 ", " inserts=100 ", " inserts_via_copy=", " initial_copy_rows=0 "} {
				require.Contains(t, final, key, "the final progress line")
			}
			_, err = http.Get(url)
			require.Error(t, err, "the metrics server stops with the command")
			t.Logf("behind: %s\ncaught up: %s", behind, done)
		})
	}
}

// TestApplyProgressLines drives apply's progress printer with readings made up for it: nothing
// before the first stream, a line each time while behind, one once caught up, then none while
// idle, and one when a counter moved.
func TestApplyProgressLines(t *testing.T) {
	at := time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)
	type reading struct {
		st apply.Stats
		rd metrics.Reading
	}
	waiting := reading{apply.Stats{Sessions: 3}, metrics.Reading{Time: at}}
	behind := reading{apply.Stats{Sessions: 3}, metrics.Reading{Time: at, LagBytes: 4096, Lag: 1500 * time.Millisecond,
		Activity: replication.Activity{Started: at, BehindSince: at}}}
	applied := func(txns int64) reading {
		return reading{apply.Stats{Txns: txns, Inserts: 10 * txns, InsertsViaCopy: 8 * txns, Sessions: 3},
			metrics.Reading{Time: at, Activity: replication.Activity{Started: at, CaughtUp: true, Acked: txns}}}
	}
	readings := []reading{
		waiting, waiting, // no stream yet: nothing
		behind, behind, // a line each time
		applied(2), applied(2), applied(2), // caught up: one line
		applied(3), // moved: a line
	}
	want := []int{2, 3, 4, 7}
	var mu sync.Mutex
	i := 0
	done := make(chan struct{})
	read := func() (apply.Stats, metrics.Reading) {
		mu.Lock()
		defer mu.Unlock()
		if i == len(readings) {
			select {
			case <-done:
			default:
				close(done)
			}
			i-- // the last one again
		}
		i++
		return readings[i-1].st, readings[i-1].rd
	}
	var buf bytes.Buffer
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		printApplyProgress(stop, &buf, time.Millisecond, read)
	}()
	<-done
	close(stop)
	<-finished
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, len(want), buf.String())
	for j, k := range want {
		require.Equal(t, "12:00:00 "+applyProgressLine(readings[k].st, readings[k].rd), lines[j])
	}
	require.Contains(t, lines[1], "| lag 4.00 KiB, 1.5s |")
	require.Equal(t, "12:00:00 applied 3 txns: 30 inserts (24 via COPY), 0 updates, 0 deletes, 0 truncates | received 0 txns, 0 changes | acked 3 | caught up |",
		lines[3][:strings.Index(lines[3], "caught up |")+len("caught up |")])
}
