package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// The replica test: a replica built from the topics equals the source. `pgreorder kafka
// -kafka-tombstones -kafka-partitions 4` copies four tables — one with a primary key (REPLICA
// IDENTITY DEFAULT, with TOASTed values), one REPLICA IDENTITY FULL with a primary key, one FULL
// with a unique index of NOT NULL columns and no primary key, one FULL without a key (duplicate
// rows) — and streams a concurrent randomised workload on them: inserts, updates of non-key
// columns (TOASTed values unchanged), primary-key changes, deletes, a TRUNCATE now and then,
// transactions big enough to be streamed (with a savepoint rolled back), transactions rolled
// back. Meanwhile the process is killed with SIGKILL and started again: the first run during the
// initial copy (its first records, read uncommitted, are out), then, once the second run's copy is
// committed, at random moments, until the workload is done. Then a last run catches up (up to a
// logical message emitted after the workload), the topics are read read_committed and applied,
// with the applier of kafka_replica_apply_test.go, to replica tables in another database, and
// every replica table must equal its source table.
//
// The child is the test binary, run again: it runs runKafka, what `pgreorder kafka` runs, with
// the command's flags, and stops on SIGTERM as the command does. Built with the tests it needs no
// go build, and under -race its data races are reported, and fail the test.
//
// Order: a key's events all go to one partition, in the source's order, so a consumer of each
// partition alone gets each key's changes in order; not, though, a truncate or a keyless table's
// changes (null keys) relative to the other partitions, nor the delete of an old key before the
// create of the new (which takes the old row's unchanged TOASTed values). So the test applies
// the partitions merged by the source's order as the events carry it (copied rows first, then
// source.lsn, the commit LSN, and transaction.total_order), after checking that each partition
// is in that order and that each key has one partition (replicaOrder): the merge keeps every
// partition's order.

// replicaChildEnv makes the test binary run `pgreorder kafka` (runKafka) with the arguments it
// holds, a JSON array, instead of the tests.
const replicaChildEnv = "PGREORDER_KAFKA_REPLICA_CHILD"

func init() {
	if spec := os.Getenv(replicaChildEnv); spec != "" {
		os.Exit(replicaChild(spec))
	}
}

func replicaChild(spec string) int {
	var args []string
	if err := json.Unmarshal([]byte(spec), &args); err != nil {
		fmt.Fprintf(os.Stderr, "replica child: bad arguments %q: %v\n", spec, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runKafka(ctx, args); err != nil {
		fmt.Fprintf(os.Stderr, "pgreorder kafka: %v\n", err)
		return 1
	}
	return 0
}

// The workload's size.
const (
	replicaCopyRows      = 20000 // rows of table pk at the start: a copy long enough to be killed in
	replicaSideRows      = 300   // rows of each other table at the start
	replicaSmallSessions = 3     // sessions of small transactions
	replicaSmallTxns     = 120   // transactions of each: 1 to 4 changes, one in ten rolled back
	replicaBigTxns       = 8     // transactions of hundreds of changes, streamed; one in four rolled back
	replicaTruncates     = 3     // transactions with a TRUNCATE
	replicaMinKills      = 5     // kills while the workload runs, besides the one during the copy
)

// replicaTables are the tables, created in this order (pk first: the big one, copied first).
var replicaTables = []string{"pk", "fullpk", "uniq", "nokey"}

const replicaSetup = `
CREATE TABLE pk (id int8 PRIMARY KEY, n int4 NOT NULL, amount numeric(10,2), flag bool, ts timestamp,
	data bytea, doc jsonb, note text, big text);
ALTER TABLE pk ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE fullpk (id int4 PRIMARY KEY, n int8, note text, amount numeric(10,2), ts timestamp, flag bool);
ALTER TABLE fullpk REPLICA IDENTITY FULL;
CREATE TABLE uniq (a int4 NOT NULL, b int4 NOT NULL, note text, data bytea, doc jsonb, UNIQUE (a, b));
ALTER TABLE uniq REPLICA IDENTITY FULL;
CREATE TABLE nokey (grp int4, note text, amount numeric(10,2), flag bool);
ALTER TABLE nokey REPLICA IDENTITY FULL;
CREATE PUBLICATION p FOR TABLE pk, fullpk, uniq, nokey;
INSERT INTO pk SELECT g, g % 1000, (g % 100000) / 100.0, g % 2 = 0, timestamp '2024-01-01' + g * interval '1.000001 second',
	decode(md5(g::text), 'hex'), jsonb_build_object('g', g, 's', 'copié ✓'), CASE WHEN g % 7 <> 0 THEN 'note ✓ ' || g END,
	CASE WHEN g % 100 = 0 THEN repeat(md5(g::text), 100) END
	FROM generate_series(1, {copyRows}) g;
INSERT INTO fullpk SELECT g, g::int8 * 1000000000, 'full ' || g, g / 4.0, timestamp '2023-06-01' + g * interval '1 hour', g % 3 = 0
	FROM generate_series(1, {sideRows}) g;
INSERT INTO uniq SELECT g, g % 5, CASE WHEN g % 4 <> 0 THEN 'uniq 🐘 ' || g END, decode(lpad(to_hex(g), 8, '0'), 'hex'),
	jsonb_build_object('a', g) FROM generate_series(1, {sideRows}) g;
INSERT INTO nokey SELECT g % 30, CASE g % 3 WHEN 0 THEN 'dup' WHEN 1 THEN 'ü ✓' END, (g % 30) / 3.0, g % 2 = 0
	FROM generate_series(1, {sideRows}) g;
`

func TestKafkaReplicaCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload against each server while killing pgreorder kafka")
	}
	c := kafkatest.Shared(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGREORDER_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (PGREORDER_SEED=%d repeats it)", seed, seed)
	self, err := os.Executable()
	require.NoError(t, err)
	pgtest.EachMajor(t, []int{15, 18}, func(t *testing.T, srv *pgtest.Server) {
		replicaCrash(t, c, srv, self, seed+uint64(srv.Major()))
	})
}

// replicaPrefixes numbers the topic prefixes of the test binary's runs (-count).
var replicaPrefixes atomic.Int64

func replicaCrash(t *testing.T, c *kafkatest.Cluster, srv *pgtest.Server, self string, seed uint64) {
	ctx := pgtest.Context(t, 4*time.Minute)
	rng := rand.New(rand.NewPCG(seed, 0))
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, strings.NewReplacer("{copyRows}", strconv.Itoa(replicaCopyRows), "{sideRows}", strconv.Itoa(replicaSideRows)).Replace(replicaSetup))
	prefix := fmt.Sprintf("replica%d_%d_%d", os.Getpid(), srv.Major(), replicaPrefixes.Add(1))
	slot := fmt.Sprintf("replica_%d", srv.Major())
	args, err := json.Marshal([]string{"-source", dsn, "-slot", slot, "-publication", "p",
		"-kafka-brokers", c.Seeds(), "-kafka-topic-prefix", prefix, "-kafka-partitions", "4", "-kafka-tombstones",
		"-progress", "0", "-status-interval", "100ms"})
	require.NoError(t, err)

	var logs pgtest.LockedBuffer
	runs := 0
	launch := func() *replicaRun {
		runs++
		fmt.Fprintf(&logs, "=== run %d\n", runs)
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), replicaChildEnv+"="+string(args))
		cmd.Stdout, cmd.Stderr = &logs, &logs
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		require.NoError(t, cmd.Start())
		r := &replicaRun{cmd: cmd, exited: make(chan struct{})}
		go func() { r.err = cmd.Wait(); close(r.exited) }()
		t.Cleanup(r.kill)
		return r
	}
	defer func() {
		if t.Failed() {
			s := logs.String()
			if len(s) > 12000 {
				s = "..." + s[len(s)-12000:]
			}
			t.Logf("seed %d; pgreorder kafka's output:\n%s", seed, s)
		}
	}()

	// The first run, and the workload at once; the first run is killed during the copy.
	first := launch()
	w := &replicaWorkload{dsn: dsn, seed: seed}
	w.nextPK.Store(replicaCopyRows)
	w.nextFull.Store(replicaSideRows)
	w.nextUniq.Store(replicaSideRows)
	werr := make(chan error, 1)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	go func() { werr <- w.run(wctx) }()
	pkTopic := dbzTopic(prefix, "public", "pk")
	replicaWait(t, ctx, c, pkTopic, kgo.ReadUncommitted(), "a record of the copy", first, dsn, func(*kgo.Record) bool { return true })
	first.kill()
	copyCut := !strings.Contains(logs.String(), "initial copy done")

	// The second run copies again; once its copy is committed, runs are killed at random moments
	// and started again, until the workload is done and replicaMinKills of them were.
	r := launch()
	replicaWait(t, ctx, c, pkTopic, kgo.ReadCommitted(), "the copy, committed", r, dsn, func(*kgo.Record) bool { return true })
	kills := 0
	for done := false; ; r = launch() {
		select {
		case <-r.exited:
			t.Fatalf("pgreorder kafka exited by itself: %v", r.err)
		case <-time.After(time.Duration(300+rng.IntN(2200)) * time.Millisecond):
		}
		r.kill()
		kills++
		if !done {
			select {
			case err := <-werr:
				if err != nil {
					t.Fatalf("the workload: %v; the server's sessions:\n%s", err, replicaActivity(dsn))
				}
				done = true
			default:
			}
		}
		if done && kills >= replicaMinKills {
			break
		}
	}

	// The last run: until the message emitted after everything else, read committed.
	pgtest.ExecAll(t, dsn, "SELECT pg_logical_emit_message(false, 'replica-end', '')")
	last := launch()
	replicaWait(t, ctx, c, prefix+".message", kgo.ReadCommitted(), "the end message", last, dsn, func(r *kgo.Record) bool {
		var m struct{ Message struct{ Prefix string } }
		return json.Unmarshal(r.Value, &m) == nil && m.Message.Prefix == "replica-end"
	})
	require.NoError(t, last.cmd.Process.Signal(syscall.SIGTERM))
	<-last.exited
	if last.err != nil {
		t.Errorf("the last run, stopped with SIGTERM: %v", last.err)
	}

	// Read every table topic, and apply it.
	topics := replicaTopics(t, ctx, c, prefix)
	read := kafkatest.ReadCommitted(t, ctx, c, topics...)
	var recs []dbzRecord
	for _, topic := range topics {
		for _, r := range read[topic] {
			rec := dbzRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, [2]string{h.Key, string(h.Value)})
			}
			recs = append(recs, rec)
		}
	}
	ordered, problems := replicaOrder(recs)
	for _, p := range problems {
		t.Error(p)
	}
	src, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer src.Close(context.Background())
	dst, err := pgx.Connect(ctx, srv.ConnString(pgtest.NewDatabase(t, srv)))
	require.NoError(t, err)
	defer dst.Close(context.Background())
	rep := newDBZReplica(dst)
	var specs []dbzTableSpec
	for _, name := range replicaTables {
		spec, err := dbzCreateReplica(ctx, src, dst, "public", name)
		require.NoError(t, err)
		require.NoError(t, rep.add(ctx, dbzTopic(prefix, "public", name), spec))
		specs = append(specs, spec)
	}
	start := time.Now()
	require.NoError(t, rep.apply(ctx, ordered))
	t.Logf("%d kills after the copy, one during it (%v), %d runs; workload: %s; applied %d records in %v: %s",
		kills, copyCut, runs, w.String(), len(recs), time.Since(start).Round(time.Millisecond), rep.counts())

	for _, spec := range specs {
		diff, err := dbzDiff(ctx, src, dst, spec, 5)
		require.NoError(t, err)
		if diff != "" {
			t.Error(diff)
		}
	}
	if a := rep.Anomalies(); a != "" {
		t.Error(a)
	}
	if races := replicaRaces(logs.String()); races != "" {
		t.Errorf("pgreorder kafka reported data races:\n%s", races)
	}
	// What the run exercised, so that the comparison means something.
	require.True(t, copyCut, "the first kill was not during the initial copy")
	require.GreaterOrEqual(t, kills, replicaMinKills)
	require.Positive(t, w.keyChanges.Load(), "primary-key changes committed")
	require.Positive(t, w.truncates.Load(), "truncates committed")
	require.Positive(t, w.streamed.Load(), "streamed transactions committed")
	require.Positive(t, rep.tables[dbzTopic(prefix, "public", "pk")].counts["kept"], "unchanged TOASTed values kept")
}

// replicaRaces returns the race detector's reports in out, the first two whole.
func replicaRaces(out string) string {
	const mark = "WARNING: DATA RACE"
	n := strings.Count(out, mark)
	if n == 0 {
		return ""
	}
	var reports []string
	for rest := out; len(reports) < 2; {
		i := strings.Index(rest, mark)
		if i < 0 {
			break
		}
		rest = rest[i:]
		end := strings.Index(rest, "\n==================")
		if end < 0 {
			end = len(rest)
		}
		reports = append(reports, rest[:end])
		rest = rest[end:]
	}
	return fmt.Sprintf("%d reports; the first:\n%s", n, strings.Join(reports, "\n"))
}

// replicaRun is one run of pgreorder kafka.
type replicaRun struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // once exited is closed
}

// kill kills the run with SIGKILL, if it still runs, and waits for it to be gone.
func (r *replicaRun) kill() {
	r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
}

// replicaWait waits, two minutes at most, until a record of topic read at isolation level iso
// matches, while run runs.
func replicaWait(t *testing.T, ctx context.Context, c *kafkatest.Cluster, topic string, iso kgo.IsolationLevel, what string,
	run *replicaRun, dsn string, match func(*kgo.Record) bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(iso),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		select {
		case <-run.exited:
			t.Fatalf("pgreorder kafka exited by itself: %v", run.err)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waited two minutes for %s on %s; the server's sessions:\n%s", what, topic, replicaActivity(dsn))
		}
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		for _, r := range fs.Records() {
			if match(r) {
				return
			}
		}
	}
}

// replicaActivity describes the sessions of dsn's database, for a test that waited too long.
func replicaActivity(dsn string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT format('pid %s %s %s, waiting for %s:%s (blocked by %s) since %s: %s', pid, backend_type, state,
		wait_event_type, wait_event, pg_blocking_pids(pid), now() - state_change, left(query, 200))
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid`)
	if err != nil {
		return err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return strings.Join(lines, "\n")
}

// replicaTopics returns the table topics of prefix, which must be those of replicaTables.
func replicaTopics(t *testing.T, ctx context.Context, c *kafkatest.Cluster, prefix string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx)
	require.NoError(t, err)
	var got, want []string
	for _, name := range td.Names() {
		if strings.HasPrefix(name, prefix+".") && name != prefix+".message" && name != prefix+".offsets" {
			got = append(got, name)
			require.Len(t, td[name].Partitions, 4, name)
		}
	}
	for _, name := range replicaTables {
		want = append(want, dbzTopic(prefix, "public", name))
	}
	require.ElementsMatch(t, want, got, "the table topics")
	return want
}

// replicaPosition is where an event stands in the source's history: copied rows first, then by
// the commit LSN of their transaction (source.lsn) and their place in it
// (transaction.total_order).
type replicaPosition struct {
	streamed bool
	lsn      uint64
	order    int64
}

func (p replicaPosition) compare(q replicaPosition) int {
	if p.streamed != q.streamed {
		if p.streamed {
			return 1
		}
		return -1
	}
	return cmp.Or(cmp.Compare(p.lsn, q.lsn), cmp.Compare(p.order, q.order))
}

func (p replicaPosition) String() string {
	if !p.streamed {
		return "copy"
	}
	return fmt.Sprintf("lsn %d order %d", p.lsn, p.order)
}

// replicaEventPosition reads an event's position; ok is false for a record without one (a tombstone,
// anything but a row or truncate event).
func replicaEventPosition(value []byte) (p replicaPosition, ok bool, err error) {
	if value == nil {
		return p, false, nil
	}
	var ev struct {
		Op     string
		Source struct {
			LSN *json.Number `json:"lsn"`
		}
		Transaction *struct {
			TotalOrder int64 `json:"total_order"`
		}
	}
	if err := dbzDecode(value, &ev); err != nil {
		return p, false, err
	}
	switch ev.Op {
	case "r":
		return p, true, nil
	case "c", "u", "d", "t":
	default:
		return p, false, nil
	}
	if ev.Source.LSN == nil {
		return p, false, errors.New("no source.lsn")
	}
	lsn, err := strconv.ParseUint(ev.Source.LSN.String(), 10, 64)
	if err != nil {
		return p, false, fmt.Errorf("source.lsn: %w", err)
	}
	p = replicaPosition{streamed: true, lsn: lsn}
	if ev.Transaction != nil {
		p.order = ev.Transaction.TotalOrder
	}
	return p, true, nil
}

// replicaOrder merges each topic's partitions (recs holds them in partition order) by the
// events' positions, keeping each partition's order, and says what contradicts the order Kafka
// promises: an event of a partition before the one ahead of it, a key in two partitions.
func replicaOrder(recs []dbzRecord) ([]dbzRecord, []string) {
	type item struct {
		rec *dbzRecord
		pos replicaPosition
	}
	var problems []string
	nProblems := 0
	problem := func(format string, args ...any) {
		nProblems++
		if len(problems) < dbzMaxAnomalies {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	byTopic := map[string]map[int32][]item{}
	var topics []string
	for i := range recs {
		r := &recs[i]
		parts := byTopic[r.Topic]
		if parts == nil {
			parts = map[int32][]item{}
			byTopic[r.Topic] = parts
			topics = append(topics, r.Topic)
		}
		pos, ok, err := replicaEventPosition(r.Value)
		if err != nil {
			problem("%s: %v: %s", r, err, r.Value)
		}
		prev := parts[r.Partition]
		if !ok && len(prev) > 0 {
			pos = prev[len(prev)-1].pos // a tombstone stays after its delete
		}
		if ok && len(prev) > 0 && pos.compare(prev[len(prev)-1].pos) < 0 {
			problem("%s: at %v, before the partition's previous event %s at %v", r, pos, prev[len(prev)-1].rec, prev[len(prev)-1].pos)
		}
		parts[r.Partition] = append(prev, item{r, pos})
	}
	var out []dbzRecord
	for _, topic := range topics {
		parts := byTopic[topic]
		keys := map[string]int32{}
		var heads [][]item
		for p, items := range parts {
			heads = append(heads, items)
			for _, it := range items {
				if it.rec.Key == nil {
					continue
				}
				if q, ok := keys[string(it.rec.Key)]; ok && q != p {
					problem("%s: key also in partition %d", it.rec, q)
				}
				keys[string(it.rec.Key)] = p
			}
		}
		for {
			best := -1
			for i, h := range heads {
				if len(h) == 0 {
					continue
				}
				if best < 0 || h[0].pos.compare(heads[best][0].pos) < 0 ||
					h[0].pos.compare(heads[best][0].pos) == 0 && h[0].rec.Partition < heads[best][0].rec.Partition {
					best = i
				}
			}
			if best < 0 {
				break
			}
			out = append(out, *heads[best][0].rec)
			heads[best] = heads[best][1:]
		}
	}
	if nProblems > len(problems) {
		problems = append(problems, fmt.Sprintf("... and %d more order problems", nProblems-len(problems)))
	}
	return out, problems
}

// replicaWorkload is the concurrent workload on the replica test's tables, and what it committed.
type replicaWorkload struct {
	dsn  string
	seed uint64

	nextPK, nextFull, nextUniq atomic.Int64 // the last id given out

	committed, rolledBack, conflicts, keyChanges, truncates, streamed atomic.Int64
}

func (w *replicaWorkload) String() string {
	return fmt.Sprintf("%d transactions committed (%d streamed, %d with a truncate, %d primary-key changes), %d rolled back, %d more in deadlocks",
		w.committed.Load(), w.streamed.Load(), w.truncates.Load(), w.keyChanges.Load(), w.rolledBack.Load(), w.conflicts.Load())
}

// run runs the sessions, each on a connection of its own, until each has done its part.
func (w *replicaWorkload) run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, replicaSmallSessions+2)
	session := func(k int, body func(conn *pgx.Conn, rng *rand.Rand) error) {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, w.dsn)
			if err != nil {
				errs[k] = err
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if err := body(conn, rand.New(rand.NewPCG(w.seed, uint64(k)+1))); err != nil {
				errs[k] = fmt.Errorf("session %d: %w", k, err)
			}
		})
	}
	for k := range replicaSmallSessions {
		session(k, func(conn *pgx.Conn, rng *rand.Rand) error {
			for range replicaSmallTxns {
				replicaPause(rng, 10, 40)
				n := 1 + rng.IntN(4)
				if err := w.txn(ctx, conn, rng.IntN(10) == 0, func(tx pgx.Tx, note *txnNote) error {
					for range n {
						if err := w.smallChange(ctx, tx, rng, note); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	session(replicaSmallSessions, func(conn *pgx.Conn, rng *rand.Rand) error {
		for range replicaBigTxns {
			replicaPause(rng, 150, 500)
			if err := w.txn(ctx, conn, rng.IntN(4) == 0, func(tx pgx.Tx, note *txnNote) error { return w.bigChange(ctx, tx, rng, note) }); err != nil {
				return err
			}
		}
		return nil
	})
	session(replicaSmallSessions+1, func(conn *pgx.Conn, rng *rand.Rand) error {
		for i := range replicaTruncates {
			replicaPause(rng, 1000, 2500)
			table := []string{"fullpk", "uniq", "nokey"}[rng.IntN(3)]
			if err := w.txn(ctx, conn, i == 1, func(tx pgx.Tx, note *txnNote) error {
				if _, err := tx.Exec(ctx, "TRUNCATE "+table); err != nil {
					return err
				}
				for range 3 {
					if err := w.insert(ctx, tx, rng, table); err != nil {
						return err
					}
				}
				note.truncate = true
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	wg.Wait()
	return errors.Join(errs...)
}

// replicaPause paces the workload: a random gap between its transactions, not a wait for
// anything.
func replicaPause(rng *rand.Rand, lo, hi int) {
	time.Sleep(time.Duration(lo+rng.IntN(hi-lo)) * time.Millisecond)
}

// txnNote is what a transaction of the workload did, counted once it commits.
type txnNote struct {
	keyChanges         int
	truncate, streamed bool
}

// txn runs body in a transaction, and commits it unless rollback. A deadlock rolls it back
// (counted apart).
func (w *replicaWorkload) txn(ctx context.Context, conn *pgx.Conn, rollback bool, body func(tx pgx.Tx, note *txnNote) error) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var note txnNote
	err = body(tx, &note)
	if err == nil && !rollback {
		err = tx.Commit(ctx)
		if err == nil {
			w.committed.Add(1)
			w.keyChanges.Add(int64(note.keyChanges))
			if note.truncate {
				w.truncates.Add(1)
			}
			if note.streamed {
				w.streamed.Add(1)
			}
			return nil
		}
	}
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001") {
		w.conflicts.Add(1)
		return nil
	}
	if err != nil {
		return err
	}
	w.rolledBack.Add(1)
	return tx.Rollback(ctx)
}

var replicaNotes = []string{"plain", "héllo wörld ✓", "🐘 elephant", "", `quote ' and " and \`, "日本語のテキスト", "NULL"}

func replicaNote(rng *rand.Rand) any {
	if rng.IntN(5) == 0 {
		return nil
	}
	return replicaNotes[rng.IntN(len(replicaNotes))] + " " + strconv.Itoa(rng.IntN(1000))
}

func replicaAmount(rng *rand.Rand) string {
	return fmt.Sprintf("%d.%02d", rng.IntN(2_000_000)-1_000_000, rng.IntN(100))
}

func replicaStamp(rng *rand.Rand) string {
	return time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(400*24*3600*1e6)) * time.Microsecond).Format("2006-01-02 15:04:05.999999")
}

func replicaBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, rng.IntN(n+1))
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	return b
}

func replicaDoc(rng *rand.Rand) string {
	j, _ := json.Marshal(map[string]any{"k": rng.IntN(1000), "s": replicaNote(rng), "a": []any{1, 2.5, true, nil}})
	return string(j)
}

// replicaBig is a value TOASTed out of line (pk.big is STORAGE EXTERNAL), or null.
func replicaBig(rng *rand.Rand) any {
	if rng.IntN(3) == 0 {
		return nil
	}
	return hex.EncodeToString(replicaBytes(rng, 1500)) + strings.Repeat("✓", 600)
}

// insert inserts a new row into table.
func (w *replicaWorkload) insert(ctx context.Context, tx pgx.Tx, rng *rand.Rand, table string) error {
	var err error
	switch table {
	case "pk":
		var big any
		if rng.IntN(8) == 0 {
			big = replicaBig(rng)
		}
		_, err = tx.Exec(ctx, `INSERT INTO pk (id, n, amount, flag, ts, data, doc, note, big)
			VALUES ($1, $2, $3::text::numeric, $4, $5::text::timestamp, $6, $7::text::jsonb, $8, $9)`,
			w.nextPK.Add(1), rng.Int32N(1<<30), replicaAmount(rng), rng.IntN(2) == 0, replicaStamp(rng), replicaBytes(rng, 40), replicaDoc(rng), replicaNote(rng), big)
	case "fullpk":
		_, err = tx.Exec(ctx, `INSERT INTO fullpk (id, n, note, amount, ts, flag) VALUES ($1, $2, $3, $4::text::numeric, $5::text::timestamp, $6)`,
			w.nextFull.Add(1), rng.Int64(), replicaNote(rng), replicaAmount(rng), replicaStamp(rng), rng.IntN(2) == 0)
	case "uniq":
		_, err = tx.Exec(ctx, `INSERT INTO uniq (a, b, note, data, doc) VALUES ($1, $2, $3, $4, $5::text::jsonb)`,
			w.nextUniq.Add(1), rng.Int32N(10), replicaNote(rng), replicaBytes(rng, 20), replicaDoc(rng))
	case "nokey":
		sql := `INSERT INTO nokey (grp, note, amount, flag) VALUES ($1, $2, $3::text::numeric, $4)`
		if rng.IntN(3) == 0 { // two equal rows
			sql += `, ($1, $2, $3::text::numeric, $4)`
		}
		var n any = []string{"dup", "ü ✓", "x"}[rng.IntN(3)]
		if rng.IntN(4) == 0 {
			n = nil
		}
		_, err = tx.Exec(ctx, sql, rng.Int32N(30), n, strconv.Itoa(rng.IntN(10)), rng.IntN(2) == 0)
	}
	return err
}

// smallChange makes one change to a random table: an insert, an update of non-key columns, a
// key change or a delete.
func (w *replicaWorkload) smallChange(ctx context.Context, tx pgx.Tx, rng *rand.Rand, note *txnNote) error {
	table := []string{"pk", "pk", "fullpk", "uniq", "nokey"}[rng.IntN(5)]
	op := rng.IntN(10)
	if op < 3 {
		return w.insert(ctx, tx, rng, table)
	}
	exec := func(sql string, args ...any) error {
		tag, err := tx.Exec(ctx, sql, args...)
		if err == nil && op >= 6 && op < 8 && table != "nokey" {
			note.keyChanges += int(tag.RowsAffected())
		}
		return err
	}
	switch table {
	case "pk":
		id := 1 + rng.Int64N(w.nextPK.Load())
		if rng.IntN(2) == 0 { // a row of the copy with a TOASTed value
			id = 100 * (1 + rng.Int64N(replicaCopyRows/100))
		}
		switch {
		case op < 6:
			return exec(`UPDATE pk SET n = n + 1, amount = $2::text::numeric, note = $3, flag = NOT flag, ts = $4::text::timestamp WHERE id = $1`,
				id, replicaAmount(rng), replicaNote(rng), replicaStamp(rng))
		case op < 8:
			return exec(`UPDATE pk SET id = $2, n = n + 1 WHERE id = $1`, id, w.nextPK.Add(1))
		case op == 8:
			return exec(`DELETE FROM pk WHERE id = $1`, id)
		default:
			return exec(`UPDATE pk SET big = $2, data = $3 WHERE id = $1`, id, replicaBig(rng), replicaBytes(rng, 40))
		}
	case "fullpk":
		id := 1 + rng.Int64N(w.nextFull.Load())
		switch {
		case op < 6 || op == 9:
			return exec(`UPDATE fullpk SET n = n + 1, note = $2, ts = $3::text::timestamp WHERE id = $1`, id, replicaNote(rng), replicaStamp(rng))
		case op < 8:
			return exec(`UPDATE fullpk SET id = $2, amount = $3::text::numeric WHERE id = $1`, id, w.nextFull.Add(1), replicaAmount(rng))
		default:
			return exec(`DELETE FROM fullpk WHERE id = $1`, id)
		}
	case "uniq":
		a := 1 + rng.Int64N(w.nextUniq.Load())
		switch {
		case op < 6 || op == 9:
			return exec(`UPDATE uniq SET note = $2, data = $3, doc = $4::text::jsonb WHERE a = $1`, a, replicaNote(rng), replicaBytes(rng, 20), replicaDoc(rng))
		case op < 8:
			return exec(`UPDATE uniq SET b = b + 10 WHERE a = $1`, a)
		default:
			return exec(`DELETE FROM uniq WHERE a = $1`, a)
		}
	default: // nokey: groups of equal rows
		g := rng.Int32N(30)
		switch {
		case op < 8:
			return exec(`UPDATE nokey SET amount = coalesce(amount, 0) + 1, flag = NOT flag WHERE grp = $1`, g)
		case op == 8:
			return exec(`DELETE FROM nokey WHERE ctid = (SELECT ctid FROM nokey WHERE grp = $1 LIMIT 1)`, g)
		default:
			return exec(`DELETE FROM nokey WHERE grp = $1 AND flag`, g)
		}
	}
}

// bigChange makes a transaction of hundreds of changes, over the server's
// logical_decoding_work_mem (64kB on the test servers): it is streamed. A savepoint's changes are
// rolled back half of the time.
func (w *replicaWorkload) bigChange(ctx context.Context, tx pgx.Tx, rng *rand.Rand, note *txnNote) error {
	last := w.nextPK.Add(500)
	first := last - 499
	moved := w.nextPK.Add(50) - 49
	lo := 1 + rng.Int64N(replicaCopyRows-300)
	steps := []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO pk SELECT g, g % 1000, (g % 100000) / 100.0, g % 2 = 0, timestamp '2024-06-01' + g * interval '1.5 second',
			decode(md5(g::text), 'hex'), jsonb_build_object('g', g, 'big', true), 'bulk 🐘 ' || g,
			CASE WHEN g % 25 = 0 THEN repeat(md5(g::text), 100) END FROM generate_series($1::int8, $2::int8) g`, []any{first, last}},
		{`SAVEPOINT s1`, nil},
		{`UPDATE pk SET note = 'rolled back?' WHERE id BETWEEN $1 AND $1 + 99`, []any{first}},
		{[]string{`ROLLBACK TO SAVEPOINT s1`, `RELEASE SAVEPOINT s1`}[rng.IntN(2)], nil},
		{`UPDATE pk SET n = n + 1, flag = NOT flag WHERE id BETWEEN $1 AND $1 + 199`, []any{lo}},
		{`UPDATE pk SET id = id - $1 + $2 WHERE id BETWEEN $1 AND $1 + 49`, []any{lo + 200, moved}},
		{`INSERT INTO nokey SELECT g % 30, 'bulk', (g % 7)::numeric, g % 2 = 0 FROM generate_series(1, 200) g`, nil},
		{`UPDATE fullpk SET n = n + 100 WHERE id % 10 = $1`, []any{rng.IntN(10)}},
	}
	for i, s := range steps {
		tag, err := tx.Exec(ctx, s.sql, s.args...)
		if err != nil {
			return err
		}
		if i == 5 {
			note.keyChanges += int(tag.RowsAffected())
		}
	}
	note.streamed = true
	return nil
}
