package kafkasink_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
)

// The crash test: a changefeed into Kafka runs in a process of its own (the test binary, run
// again), which is killed with SIGKILL at random moments, several times, while a concurrent
// workload runs on the server: big transactions that spill and stream, with a savepoint rolled
// back in each, transactions rolled back, small ones, and columns added and dropped (ALTER TABLE
// in a transaction that also writes rows). In the end a read_committed consumer must
// see the initial copy and every committed source transaction exactly once: each transaction's
// events all there (as many as the transaction made changes), none of an aborted one, every
// key's changes in commit order (replayed, they give the source table).

// crashConsumerEnv makes the test binary run the consumer instead of the tests.
const crashConsumerEnv = "PGREORDER_KAFKASINK_CRASH"

// crashConsumer runs the changefeed into Kafka: DSN, brokers and topic prefix, tab-separated.
func crashConsumer(spec string) int {
	f := strings.Split(spec, "\t")
	if len(f) != 3 {
		fmt.Fprintf(os.Stderr, "crash consumer: bad spec %q\n", spec)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	sink, err := kafkasink.Open(crashSinkConfig(strings.Split(f[1], ","), f[2], log))
	if err == nil {
		cfg := feedConfig(f[0])
		cfg.Logger = log
		err = changefeed.Run(ctx, cfg, sink, sink.Handle)
	}
	if ctx.Err() != nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "crash consumer:", err)
	return 1
}

func crashSinkConfig(brokers []string, prefix string, log *slog.Logger) kafkasink.Config {
	// A small producer buffer: big transactions wait for the brokers while they are read.
	return kafkasink.Config{Brokers: brokers, TopicPrefix: prefix, Partitions: 2, MaxBufferedRecords: 500,
		MaxBufferedBytes: 256 << 10, Logger: log}
}

// committed is what the workload committed: each transaction's xid and number of changes.
type committed struct {
	mu     sync.Mutex
	txns   map[uint64]int
	alters int // transactions with an ALTER TABLE
}

func (c *committed) add(xid uint64, n int) {
	c.mu.Lock()
	c.txns[xid] = n
	c.mu.Unlock()
}

// workload runs the concurrent workload on table t for d, recording what committed.
func workload(ctx context.Context, dsn string, seed uint64, d time.Duration, got *committed) error {
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		errs  []error
		idMu  sync.Mutex
		next  = 1_000_000
	)
	span := func(n int) int {
		idMu.Lock()
		defer idMu.Unlock()
		a := next
		next += n
		return a
	}
	deadline := time.Now().Add(d)
	// txn runs statements in a transaction and returns its xid and the rows they changed;
	// statements after "SAVEPOINT" up to "ROLLBACK TO" do not count.
	txn := func(conn *pgx.Conn, commit bool, sqls ...string) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		var xid uint64
		if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
			return err
		}
		n, inSavepoint := 0, false
		for _, s := range sqls {
			tag, err := tx.Exec(ctx, s)
			if err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
			switch {
			case strings.HasPrefix(s, "SAVEPOINT"):
				inSavepoint = true
			case strings.HasPrefix(s, "ROLLBACK TO"):
				inSavepoint = false
			case !inSavepoint:
				n += int(tag.RowsAffected())
			}
		}
		if !commit {
			return tx.Rollback(ctx)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		got.add(xid, n)
		return nil
	}
	session := func(k int, body func(conn *pgx.Conn, rng *rand.Rand) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(k)))
			conn, err := pgx.Connect(ctx, dsn)
			if err == nil {
				defer conn.Close(context.WithoutCancel(ctx))
				for time.Now().Before(deadline) && ctx.Err() == nil && err == nil {
					err = body(conn, rng)
				}
			}
			if err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
		}()
	}
	// pause paces the workload's sessions: a random gap, not a wait for anything.
	pause := func(rng *rand.Rand, lo, hi int) { time.Sleep(time.Duration(lo+rng.IntN(hi-lo)) * time.Millisecond) }
	session(1, func(conn *pgx.Conn, rng *rand.Rand) error { // big, streamed, a savepoint rolled back
		pause(rng, 300, 800)
		a, c := span(2000), span(500)
		return txn(conn, true,
			fmt.Sprintf(`INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%d, %d) g`, a, a+1999),
			"SAVEPOINT s1",
			fmt.Sprintf(`INSERT INTO t SELECT g, 'rolled back' FROM generate_series(%d, %d) g`, c, c+499),
			"ROLLBACK TO SAVEPOINT s1",
			fmt.Sprintf(`UPDATE t SET v = 'big' WHERE id BETWEEN %d AND %d`, a, a+299))
	})
	session(2, func(conn *pgx.Conn, rng *rand.Rand) error { // aborted
		pause(rng, 300, 900)
		a := span(1500)
		return txn(conn, false, fmt.Sprintf(`INSERT INTO t SELECT g, 'aborted' FROM generate_series(%d, %d) g`, a, a+1499))
	})
	session(3, func(conn *pgx.Conn, rng *rand.Rand) error { // small: insert, update or delete
		pause(rng, 20, 80)
		a := span(2)
		sqls := []string{fmt.Sprintf(`INSERT INTO t VALUES (%d, 'small'), (%d, 'small')`, a, a+1)}
		switch rng.IntN(3) {
		case 0:
			sqls = append(sqls, fmt.Sprintf(`UPDATE t SET v = 'updated' WHERE id = %d`, a))
		case 1:
			sqls = append(sqls, fmt.Sprintf(`DELETE FROM t WHERE id = %d`, a+1))
		}
		return txn(conn, true, sqls...)
	})
	alters := 0
	session(4, func(conn *pgx.Conn, rng *rand.Rand) error { // schema changes amid the rows
		pause(rng, 400, 1200)
		alters++
		got.mu.Lock()
		got.alters++
		got.mu.Unlock()
		a := span(1)
		if alters%2 == 1 {
			col := fmt.Sprintf("c%d", alters)
			return txn(conn, true, fmt.Sprintf(`ALTER TABLE t ADD COLUMN %s int DEFAULT %d`, col, alters),
				fmt.Sprintf(`INSERT INTO t (id, v, %s) VALUES (%d, 'altered', %d)`, col, a, alters))
		}
		return txn(conn, true, fmt.Sprintf(`ALTER TABLE t DROP COLUMN c%d`, alters-1),
			fmt.Sprintf(`INSERT INTO t VALUES (%d, 'dropped')`, a), fmt.Sprintf(`UPDATE t SET v = 'after drop' WHERE id = %d`, a-1))
	})
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("workload: %v", errs)
	}
	return nil
}

func TestCrash(t *testing.T) {
	c := kafkatest.Shared(t)
	self, err := os.Executable()
	require.NoError(t, err)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		seed := uint64(time.Now().UnixNano())
		if s := os.Getenv("PGREORDER_CRASH_SEED"); s != "" {
			seed, _ = strconv.ParseUint(s, 10, 64)
		}
		t.Logf("seed %d (PGREORDER_CRASH_SEED=%d repeats it)", seed, seed)
		rng := rand.New(rand.NewPCG(seed, 0))
		ctx := pgtest.Context(t, 3*time.Minute)
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION p FOR TABLE t",
			"INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 3000) g")
		prefix := newPrefix(t)
		// The copy first (a copy cut short is made again, from a later point: the workload's
		// transactions before it would be rows of the copy, not events).
		r := start(t, ctx, feedConfig(dsn), crashSinkConfig(c.Addrs(), prefix, nil))
		r.waitPast(t, ctx, 0)
		require.NoError(t, r.stop())
		got := &committed{txns: map[uint64]int{}}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		werr := make(chan error, 1)
		go func() { werr <- workload(wctx, dsn, seed, 8*time.Second, got) }()

		var stderr pgtest.LockedBuffer
		spec := strings.Join([]string{dsn, c.Seeds(), prefix}, "\t")
		kills := 0
	loop:
		for {
			cmd := exec.Command(self, "-test.run=^$")
			cmd.Env = append(os.Environ(), crashConsumerEnv+"="+spec)
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			d := time.Duration(200+rng.IntN(1800)) * time.Millisecond
			select {
			case err := <-exited:
				t.Fatalf("the consumer exited: %v\n%s", err, stderr.String())
			case <-time.After(d):
			}
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			kills++
			select {
			case err := <-werr:
				require.NoError(t, err)
				break loop
			default:
			}
		}

		// The last run, in the test: until past everything committed.
		last := commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (1, 'last') ON CONFLICT (id) DO UPDATE SET v = 'last'")
		r = start(t, ctx, feedConfig(dsn), crashSinkConfig(c.Addrs(), prefix, nil))
		r.waitPast(t, ctx, last)
		require.NoError(t, r.stop())
		// (Read once the last run fenced the killed consumer: its open transaction held back
		// what read_committed consumers see until then.)
		positions := -int(r.sink.Stats().Transactions)
		for _, rec := range readCommitted(t, ctx, c, prefix+".offsets")[prefix+".offsets"] {
			if string(rec.Key) == "s" {
				positions++
			}
		}
		t.Logf("%d kills, %d committed transactions (%d with an ALTER TABLE), %d Kafka transactions committed by the killed consumers",
			kills, len(got.txns), got.alters, positions)
		require.Positive(t, got.alters)
		require.Greater(t, positions, kills, "the killed consumers made progress")
		checkExactlyOnce(t, ctx, c, dsn, prefix, got, 3000)
	})
}

// checkExactlyOnce reads table t's topic read_committed and checks it against what the workload
// committed: copied rows once, every committed transaction whole and once, no aborted one, each
// key's changes in commit order.
func checkExactlyOnce(t *testing.T, ctx context.Context, c *kafkatest.Cluster, dsn, prefix string, got *committed, copied int) {
	t.Helper()
	recs := readCommitted(t, ctx, c, prefix+".public.t")[prefix+".public.t"]
	m := model{}
	counts := map[uint64]int{}
	lastLSN := map[int32]uint64{}
	snapshot := 0
	for _, rec := range recs {
		e := parseEvent(t, rec)
		require.NoError(t, m.apply(e), "partition %d offset %d: %s", rec.Partition, rec.Offset, rec.Value)
		if e.Op == "r" {
			snapshot++
			continue
		}
		require.NotNil(t, e.Source.TxID)
		counts[*e.Source.TxID]++
		require.GreaterOrEqual(t, *e.Source.LSN, lastLSN[rec.Partition], "commit order in partition %d at offset %d", rec.Partition, rec.Offset)
		lastLSN[rec.Partition] = *e.Source.LSN
	}
	require.Equal(t, copied, snapshot, "copied rows")
	got.mu.Lock()
	defer got.mu.Unlock()
	for xid, n := range got.txns {
		require.Equal(t, n, counts[xid], "events of transaction %d", xid)
	}
	for xid, n := range counts {
		if _, ok := got.txns[xid]; !ok {
			require.Equal(t, 1, n, "transaction %d is not the workload's: the last insert only", xid)
		}
	}
	require.Equal(t, tableModel(t, ctx, dsn, "t"), m)
}

// TestCrashDuringCopy: the consumer is killed with SIGKILL while the initial copy is being
// produced (a read_uncommitted reader sees its first records); the next run aborts the copy's
// transaction, copies again, and every row is there once.
func TestCrashDuringCopy(t *testing.T) {
	c := kafkatest.Shared(t)
	self, err := os.Executable()
	require.NoError(t, err)
	srv := pgtest.Shared(t, pgtest.Majors(t)[len(pgtest.Majors(t))-1])
	ctx := pgtest.Context(t, 2*time.Minute)
	dsn := setupTable(t, srv, 30000)
	prefix := newPrefix(t)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), crashConsumerEnv+"="+strings.Join([]string{dsn, c.Seeds(), prefix}, "\t"))
	var stderr pgtest.LockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	rd, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.ConsumeTopics(prefix+".public.t"),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.MetadataMinAge(100*time.Millisecond))
	require.NoError(t, err)
	defer rd.Close()
	for seen := false; !seen; {
		select {
		case err := <-exited:
			t.Fatalf("the consumer exited: %v\n%s", err, stderr.String())
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		fs := rd.PollFetches(pctx)
		cancel()
		require.NoError(t, ctx.Err())
		seen = len(fs.Records()) > 0
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	require.NotContains(t, stderr.String(), "initial copy done", "killed after the copy")

	r := start(t, ctx, feedConfig(dsn), crashSinkConfig(c.Addrs(), prefix, nil))
	r.waitPast(t, ctx, 0)
	r.waitPast(t, ctx, commitLSN(t, ctx, dsn, "UPDATE t SET v = 'streamed' WHERE id = 1"))
	require.NoError(t, r.stop())
	copied, streamed := rowEvents(t, ctx, c, dsn, prefix)
	require.Equal(t, 30000, copied)
	require.Equal(t, 1, streamed)
}
