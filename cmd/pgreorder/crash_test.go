package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// The crash test: a consumer that writes every committed transaction to a durable file and
// acknowledges it only then is killed with SIGKILL at random moments, many times, while a
// concurrent workload runs on the server — large streamed transactions with savepoints rolled
// back, whole transactions rolled back, small ones, two-phase transactions whose PREPARE and
// COMMIT PREPARED are seconds apart, and an ALTER TABLE ... ADD COLUMN half way — and is started
// again each time from its last durable position. What it wrote in the end must be exactly what
// the server committed, each transaction once, in commit order (compared with a second slot,
// created back to back with the first and read with streaming off), and applying it must give
// the source table's contents.
//
// Two consumers: `pgreorder stream -two-phase -work-mem 64kB -o FILE`, and a loop over the
// library (changefeed.Run with StartStream and a changefeed.JSONLines), which the test binary runs when re-executed.

// crashConsumerEnv makes the test binary run the library consumer instead of the tests.
const crashConsumerEnv = "PGREORDER_CRASH_CONSUMER"

func init() {
	if spec := os.Getenv(crashConsumerEnv); spec != "" {
		os.Exit(crashConsumer(spec))
	}
}

// crashConsumer is the library loop: DSN, slot, publication and output path, tab-separated.
func crashConsumer(spec string) int {
	f := strings.Split(spec, "\t")
	if len(f) != 4 {
		fmt.Fprintf(os.Stderr, "crash consumer: bad spec %q\n", spec)
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	out, err := changefeed.OpenJSONLines(f[3], changefeed.JSONLinesConfig{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash consumer:", err)
		return 1
	}
	err = changefeed.Run(ctx, changefeed.Config{Start: changefeed.StartStream, Replication: replication.Config{
		ConnString:   f[0],
		Slot:         f[1],
		Publications: []string{f[2]},
		TwoPhase:     true,
		Buffer:       reorderbuffer.Config{WorkMem: 64 << 10},
	}}, out, out.Handle)
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "crash consumer:", err)
		return 1
	}
	return 0
}

func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func TestCrashResume(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload for a minute against each server")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGREORDER_SEED"); s != "" {
		_, err := fmt.Sscan(s, &seed)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set PGREORDER_SEED to replay)", seed)
	bin := filepath.Join(t.TempDir(), "pgreorder")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	self, err := os.Executable()
	require.NoError(t, err)

	majors := streamMajors(t) // 15 and 18
	if os.Getenv("PGREORDER_CRASH_ALL") == "1" {
		majors = pgtest.Majors(t)
	}
	for _, major := range majors {
		for i, consumer := range []string{"stream", "library"} {
			t.Run(fmt.Sprintf("pg%d/%s", major, consumer), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, uint64(major*10+i)))
				start := func(dsn, slot, pub, path string) *exec.Cmd {
					if consumer == "stream" {
						return exec.Command(bin, "stream", "-source", dsn, "-slot", slot, "-publication", pub,
							"-two-phase", "-work-mem", "64kB", "-o", path)
					}
					cmd := exec.Command(self, "-test.run=^$")
					cmd.Env = append(os.Environ(), crashConsumerEnv+"="+strings.Join([]string{dsn, slot, pub, path}, "\t"))
					return cmd
				}
				crashResume(t, major, rng, start)
			})
		}
	}
}

func crashResume(t *testing.T, major int, rng *rand.Rand, start func(dsn, slot, pub, path string) *exec.Cmd) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	require.NoError(t, pgtest.Exec(ctx, dsn,
		`CREATE TABLE t (id int PRIMARY KEY, v text, n int)`,
		`CREATE PUBLICATION p FOR TABLE t`,
		// Back to back: both slots see the same WAL. The oracle is read with streaming off.
		`SELECT pg_create_logical_replication_slot('oracle', 'pgoutput')`,
		`SELECT pg_create_logical_replication_slot('crash', 'pgoutput', false, true)`))
	path := filepath.Join(t.TempDir(), "out.jsonl")

	// The consumer, killed and started again until the workload is over.
	var (
		mu    sync.Mutex
		cmd   *exec.Cmd
		kills int
		logs  pgtest.LockedBuffer
	)
	workloadSeed, killerRng := rng.Uint64(), rand.New(rand.NewPCG(rng.Uint64(), 1))
	launch := func() error {
		c := start(dsn, "crash", "p", path)
		c.Stdout, c.Stderr = &logs, &logs
		if err := c.Start(); err != nil {
			return err
		}
		cmd = c
		return nil
	}
	mu.Lock()
	require.NoError(t, launch())
	mu.Unlock()
	stopKiller := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		for {
			select {
			case <-stopKiller:
				return
			case <-time.After(time.Duration(200+killerRng.IntN(1300)) * time.Millisecond):
			}
			mu.Lock()
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			kills++
			err := launch()
			mu.Unlock()
			if err != nil {
				t.Errorf("starting the consumer again: %v", err)
				return
			}
		}
	}()

	runCrashWorkload(t, ctx, dsn, workloadSeed, 12*time.Second)
	close(stopKiller)
	<-killerDone

	// The oracle: what the server sends with streaming off, as the consumer renders it.
	want := oracleReading(t, ctx, dsn)
	require.NotEmpty(t, want)

	// Let the consumer catch up, then stop it the polite way.
	var got []string
	pgtest.Until(ctx, func() bool {
		got = readComparable(t, path)
		return len(got) >= len(want)
	})
	mu.Lock()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	mu.Unlock()
	t.Logf("killed %d times; %d transactions", kills, len(want))
	require.GreaterOrEqual(t, kills, 5, "the consumer was not killed often enough to test anything")
	if t.Failed() || len(got) != len(want) {
		t.Logf("consumer output:\n%s", logs.String())
	}
	got = readComparable(t, path)
	require.Equal(t, len(want), len(got), "transactions written, want the server's")
	for i := range want {
		require.Equal(t, want[i], got[i], "transaction %d of %d differs (duplicate, missing or out of order)", i, len(want))
	}
	checkTableEqualsOutput(t, ctx, dsn, path)
}

// runCrashWorkload runs concurrent sessions for d: large streamed transactions with rolled-back
// savepoints, whole rolled-back transactions, small inserts, updates and deletes, two-phase
// transactions held for seconds, and one ALTER TABLE ADD COLUMN half way.
func runCrashWorkload(t *testing.T, ctx context.Context, dsn string, seed uint64, d time.Duration) {
	t.Helper()
	var (
		wg     sync.WaitGroup
		errMu  sync.Mutex
		errs   []error
		nextID = make(chan int, 64)
		ddl    sync.Once
	)
	go func() {
		for id := 1; ; id++ {
			select {
			case nextID <- id:
			case <-ctx.Done():
				return
			}
		}
	}()
	deadline := time.Now().Add(d)
	session := func(name string, k int, body func(conn *pgx.Conn, rng *rand.Rand) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(k)))
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := body(conn, rng); err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", name, err))
					errMu.Unlock()
					return
				}
			}
		}()
	}
	ids := func(n int) (int, int) {
		first := <-nextID
		last := first
		for range n - 1 {
			last = <-nextID
		}
		return first, last // ids are handed out in order by one goroutine, so the range is ours
	}
	run := func(conn *pgx.Conn, sqls ...string) error {
		for _, s := range sqls {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	}
	var idMu sync.Mutex // ids ranges must be contiguous per call
	span := func(n int) (int, int) {
		idMu.Lock()
		defer idMu.Unlock()
		return ids(n)
	}
	for k := range 2 {
		session("big", k, func(conn *pgx.Conn, rng *rand.Rand) error {
			// Pacing, not a wait: the workload's sessions run at rates of their own.
			time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
			a, b := span(1500)
			c, e := span(800)
			f, g := span(300)
			return run(conn, "BEGIN",
				fmt.Sprintf(`INSERT INTO t SELECT g, md5(g::text), 0 FROM generate_series(%d, %d) g`, a, b),
				"SAVEPOINT s1",
				fmt.Sprintf(`INSERT INTO t SELECT g, md5(g::text), 1 FROM generate_series(%d, %d) g`, c, e),
				"ROLLBACK TO SAVEPOINT s1",
				fmt.Sprintf(`INSERT INTO t SELECT g, md5(g::text), 2 FROM generate_series(%d, %d) g`, f, g),
				fmt.Sprintf(`UPDATE t SET n = n + 10 WHERE id BETWEEN %d AND %d`, a, a+50),
				"COMMIT")
		})
	}
	session("abort", 2, func(conn *pgx.Conn, rng *rand.Rand) error {
		// Pacing, not a wait.
		time.Sleep(time.Duration(300+rng.IntN(600)) * time.Millisecond)
		a, b := span(1200)
		return run(conn, "BEGIN",
			fmt.Sprintf(`INSERT INTO t SELECT g, md5(g::text), 3 FROM generate_series(%d, %d) g`, a, b), "ROLLBACK")
	})
	for k := range 1 {
		session("small", 3+k, func(conn *pgx.Conn, rng *rand.Rand) error {
			a, _ := span(1)
			sqls := []string{fmt.Sprintf(`INSERT INTO t VALUES (%d, 'small', 4)`, a)}
			switch rng.IntN(3) {
			case 0:
				sqls = append(sqls, fmt.Sprintf(`UPDATE t SET v = 'updated', n = n + 1 WHERE id = %d`, 1+rng.IntN(a)))
			case 1:
				sqls = append(sqls, fmt.Sprintf(`DELETE FROM t WHERE id = %d`, 1+rng.IntN(a)))
			}
			if time.Until(deadline) < d/2 {
				ddl.Do(func() { sqls = append(sqls, `ALTER TABLE t ADD COLUMN extra text`) })
			}
			time.Sleep(time.Duration(50+rng.IntN(150)) * time.Millisecond) // pacing, not a wait
			return run(conn, sqls...)
		})
	}
	gid := 0
	var gidMu sync.Mutex
	session("two-phase", 5, func(conn *pgx.Conn, rng *rand.Rand) error {
		gidMu.Lock()
		gid++
		name := fmt.Sprintf("crash-%d", gid)
		gidMu.Unlock()
		a, b := span(400)
		if err := run(conn, "BEGIN",
			fmt.Sprintf(`INSERT INTO t SELECT g, md5(g::text), 5 FROM generate_series(%d, %d) g`, a, b),
			fmt.Sprintf(`PREPARE TRANSACTION '%s'`, name)); err != nil {
			return err
		}
		// Not a wait for anything: the prepared transaction stays open across kills for 1 to 3s.
		time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
		end := "COMMIT PREPARED"
		if rng.IntN(4) == 0 {
			end = "ROLLBACK PREPARED"
		}
		return run(conn, fmt.Sprintf(`%s '%s'`, end, name))
	})
	wg.Wait()
	require.Empty(t, errs)
}

// oracleReading reads the oracle slot (streaming off: the server reorders) and renders it as
// the consumer's output compares: one comparable line per transaction with changes.
func oracleReading(t *testing.T, ctx context.Context, dsn string) []string {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes('oracle', NULL, NULL,
		'proto_version', '1', 'publication_names', 'p')`)
	require.NoError(t, err)
	var recs []capture.Record
	for rows.Next() {
		var lsn string
		var data []byte
		require.NoError(t, rows.Scan(&lsn, &data))
		r := capture.Record{Data: data}
		require.NoError(t, r.LSN.Scan(lsn))
		recs = append(recs, r)
	}
	require.NoError(t, rows.Err())
	b, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: 1 << 40, Dir: t.TempDir()})
	require.NoError(t, err)
	defer b.Close()
	var out strings.Builder
	w := format.NewWriter(&out, format.Config{})
	for _, r := range recs {
		require.NoError(t, b.Add(r.LSN, r.Data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			require.NoError(t, w.WriteTxn(x))
			require.NoError(t, b.Ack(x))
		}
	}
	lines, err := comparable(out.String())
	require.NoError(t, err)
	return lines
}

// readComparable reads the consumer's output file up to its last complete line.
func readComparable(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	if i := strings.LastIndexByte(string(data), '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	lines, err := comparable(string(data))
	require.NoError(t, err)
	return lines
}

// checkTableEqualsOutput applies the output's changes to a map keyed by id and compares it with
// the source table.
func checkTableEqualsOutput(t *testing.T, ctx context.Context, dsn, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	rows := map[string]map[string]any{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 256<<20)
	for sc.Scan() {
		var txn struct {
			Changes []struct {
				Op  string         `json:"op"`
				New map[string]any `json:"new"`
				Old map[string]any `json:"old"`
			} `json:"changes"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &txn))
		for _, c := range txn.Changes {
			switch c.Op {
			case "insert", "update":
				rows[c.New["id"].(string)] = c.New
			case "delete":
				delete(rows, c.Old["id"].(string))
			}
		}
	}
	require.NoError(t, sc.Err())
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	res, err := conn.Query(ctx, `SELECT id::text, v, n::text, to_jsonb(t) ? 'extra', (to_jsonb(t)->>'extra') FROM t`)
	require.NoError(t, err)
	n := 0
	for res.Next() {
		var id, v, nn string
		var hasExtra bool
		var extra *string
		require.NoError(t, res.Scan(&id, &v, &nn, &hasExtra, &extra))
		got, ok := rows[id]
		require.True(t, ok, "row %s is in the table, not in the output", id)
		require.Equal(t, v, got["v"], "row %s", id)
		require.Equal(t, nn, got["n"], "row %s", id)
		if e, ok := got["extra"]; ok && e != nil {
			require.NotNil(t, extra, "row %s", id)
			require.Equal(t, *extra, e, "row %s", id)
		}
		n++
	}
	require.NoError(t, res.Err())
	require.Equal(t, len(rows), n, "rows in the output that the table does not have")
}
