package kafkasink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/snapshot"
)

// confirmedFlush returns slot s's confirmed_flush_lsn: how far the source was acknowledged.
func confirmedFlush(t *testing.T, ctx context.Context, dsn string) decoding.LSN {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var s *string
	err = conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'").Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) || s == nil {
		return 0
	}
	require.NoError(t, err)
	l, err := decoding.ParseLSN(*s)
	require.NoError(t, err)
	return l
}

// slotExists reports whether slot s exists.
func slotExists(t *testing.T, ctx context.Context, dsn string) bool {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's'").Scan(&n))
	return n > 0
}

// rowEvents reads table t's events and replays them (failing on a duplicate), returning the
// number of copied rows and of streamed events.
func rowEvents(t *testing.T, ctx context.Context, c *kafkatest.Cluster, dsn, prefix string) (copied, streamed int) {
	t.Helper()
	return tableEvents(t, ctx, c, dsn, prefix, "t")
}

// tableEvents is rowEvents for the table public.<table>.
func tableEvents(t *testing.T, ctx context.Context, c *kafkatest.Cluster, dsn, prefix, table string) (copied, streamed int) {
	t.Helper()
	m := model{}
	topic := prefix + ".public." + table
	for _, rec := range readCommitted(t, ctx, c, topic)[topic] {
		e := parseEvent(t, rec)
		require.NoError(t, m.apply(e), string(rec.Value))
		if e.Op == "r" {
			copied++
		} else {
			streamed++
		}
	}
	require.Equal(t, tableModel(t, ctx, dsn, table), m)
	return copied, streamed
}

func setupTable(t *testing.T, srv *pgtest.Server, rows int) string {
	t.Helper()
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION p FOR TABLE t",
		fmt.Sprintf("INSERT INTO t SELECT g, 'copied' FROM generate_series(1, %d) g", rows))
	return dsn
}

// TestFencing: a second sink of the same slot fences the first, which stops with ErrFenced at
// its next transaction without acknowledging it; the second delivers it, once.
func TestFencing(t *testing.T) {
	c := kafkatest.Shared(t)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := setupTable(t, srv, 10)
		prefix := newPrefix(t)
		kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix}
		a := start(t, ctx, feedConfig(dsn), kcfg)
		a.waitPast(t, ctx, 0)
		a.waitPast(t, ctx, commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (11, 'a')"))
		acked := confirmedFlush(t, ctx, dsn)

		b := start(t, ctx, feedConfig(dsn), kcfg)
		fenced := pgtest.Until(ctx, func() bool { return b.sink.TransactionalID() != "" }) // Load ran: a is fenced
		require.True(t, fenced, "the second sink did not load its position")
		last := commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (12, 'b')")
		err := <-a.done
		a.done <- err
		require.ErrorIs(t, err, kafkasink.ErrFenced)
		require.Contains(t, err.Error(), "pgreorder-s")
		t.Logf("the first sink: %v", err)
		// The first sink's own acknowledgements: the slot's confirmed position may be the second
		// sink's by now (it takes the slot as soon as the first lets go of it).
		require.Less(t, a.feed.Progress().Flushed, last, "the fenced sink acknowledged a transaction it did not commit")
		require.GreaterOrEqual(t, confirmedFlush(t, ctx, dsn), acked)
		b.waitPast(t, ctx, last)
		require.NoError(t, b.stop())
		copied, streamed := rowEvents(t, ctx, c, dsn, prefix)
		require.Equal(t, 10, copied)
		require.Equal(t, 2, streamed)
	})
}

// TestBrokerRestart: the broker is killed in the middle of a big transaction and restarted;
// the sink goes on, or stops and is run again, and the transaction reaches Kafka once.
func TestBrokerRestart(t *testing.T) {
	c := kafkatest.Start(t, 1)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 4*time.Minute)
		dsn := setupTable(t, srv, 10)
		prefix := newPrefix(t)
		kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix, MaxBufferedRecords: 200, TransactionTimeout: time.Minute}
		r := start(t, ctx, feedConfig(dsn), kcfg)
		r.waitPast(t, ctx, 0)
		bigThroughFault(t, ctx, r, dsn, kcfg, c, prefix, func() {
			c.Brokers[0].Kill()
			require.NoError(t, c.Brokers[0].Restart(ctx))
		})
	})
}

// TestUnreachable: no broker answering is a clear error, before the slot is even made.
func TestUnreachable(t *testing.T) {
	kafkatest.Check(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := setupTable(t, srv, 10)
		sink, err := kafkasink.Open(kafkasink.Config{Brokers: []string{addr}, ConnectTimeout: 2 * time.Second})
		require.NoError(t, err)
		err = changefeed.Run(ctx, feedConfig(dsn), sink, sink.Handle)
		require.ErrorIs(t, err, kafkasink.ErrUnreachable)
		require.Contains(t, err.Error(), addr)
		require.False(t, slotExists(t, ctx, dsn))
	})
}

// TestTopicsRequired: with RequireTopics, a missing offsets topic or table topic stops the sink
// with an error naming it, and nothing it produced is visible; once the topics may be created,
// the copy and the stream arrive once.
func TestTopicsRequired(t *testing.T) {
	c := kafkatest.Shared(t)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := setupTable(t, srv, 50)
		prefix := newPrefix(t)
		kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix, Topics: kafkasink.RequireTopics}
		sink, err := kafkasink.Open(kcfg)
		require.NoError(t, err)
		err = changefeed.Run(ctx, feedConfig(dsn), sink, sink.Handle)
		require.ErrorIs(t, err, kafkasink.ErrTopicMissing)
		require.Contains(t, err.Error(), prefix+".offsets")
		require.False(t, slotExists(t, ctx, dsn))

		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
		require.NoError(t, err)
		defer cl.Close()
		compact := "compact"
		_, err = kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, prefix+".offsets")
		require.NoError(t, err)
		sink, err = kafkasink.Open(kcfg)
		require.NoError(t, err)
		err = changefeed.Run(ctx, feedConfig(dsn), sink, sink.Handle)
		require.ErrorIs(t, err, kafkasink.ErrTopicMissing)
		require.Contains(t, err.Error(), prefix+".public.t")
		require.Zero(t, confirmedFlush(t, ctx, dsn))

		kcfg.Topics = kafkasink.CreateTopics
		r := start(t, ctx, feedConfig(dsn), kcfg)
		r.waitPast(t, ctx, 0)
		r.waitPast(t, ctx, commitLSN(t, ctx, dsn, "UPDATE t SET v = 'streamed' WHERE id = 1"))
		require.NoError(t, r.stop())
		copied, streamed := rowEvents(t, ctx, c, dsn, prefix)
		require.Equal(t, 50, copied)
		require.Equal(t, 1, streamed)
	})
}

// TestRecordTooLarge: an event larger than its topic's max.message.bytes stops the sink with an
// error naming the table, the key and the size, the transaction unacknowledged and invisible;
// with the limit raised, it arrives once.
func TestRecordTooLarge(t *testing.T) {
	c := kafkatest.Shared(t)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := setupTable(t, srv, 5)
		prefix := newPrefix(t)
		kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix, TopicConfigs: map[string]string{"max.message.bytes": "4000"}}
		r := start(t, ctx, feedConfig(dsn), kcfg)
		r.waitPast(t, ctx, 0)
		last := commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (6, 'small')", "INSERT INTO t VALUES (7, repeat('x', 10000))")
		err := <-r.done
		r.done <- err
		require.ErrorIs(t, err, kafkasink.ErrRecordTooLarge)
		for _, want := range []string{"table public.t", `key {"id":7}`, "bytes", "max.message.bytes"} {
			require.Contains(t, err.Error(), want)
		}
		t.Logf("%v", err)
		require.Less(t, confirmedFlush(t, ctx, dsn), last)
		for _, rec := range readCommitted(t, ctx, c, prefix+".public.t")[prefix+".public.t"] {
			require.Equal(t, "r", parseEvent(t, rec).Op, "an event of the transaction that failed is visible")
		}

		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
		require.NoError(t, err)
		defer cl.Close()
		big := "100000"
		res, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &big}}, prefix+".public.t")
		require.NoError(t, err)
		require.NoError(t, res[0].Err)
		r = start(t, ctx, feedConfig(dsn), kcfg)
		r.waitPast(t, ctx, last)
		require.NoError(t, r.stop())
		copied, streamed := rowEvents(t, ctx, c, dsn, prefix)
		require.Equal(t, 5, copied)
		require.Equal(t, 2, streamed)
	})
}

// TestCopyRetried: the copy's connections are terminated in the middle of the copy; Run copies
// again at once (a second Reset), and the rows the first copy produced are not visible: the
// copy's Kafka transaction is aborted, and the table's rows arrive once.
func TestCopyRetried(t *testing.T) {
	c := kafkatest.Shared(t)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := setupTable(t, srv, 2000)
		prefix := newPrefix(t)
		cfg := feedConfig(dsn)
		cfg.Copy = snapshot.Config{Workers: 2, ChunkSize: 8 << 10}
		sink, err := kafkasink.Open(kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix})
		require.NoError(t, err)
		var once sync.Once
		resets := 0
		h := func(ctx context.Context, b *changefeed.Batch) error {
			if err := sink.Handle(ctx, b); err != nil {
				return err
			}
			switch b.Kind {
			case changefeed.Reset:
				resets++
			case changefeed.Snapshot:
				once.Do(func() {
					pgtest.ExecAll(t, dsn, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgreorder-copy'`)
				})
			}
			return nil
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- changefeed.Run(rctx, cfg, sink, h) }()
		r := &running{sink: sink, cancel: cancel, done: done}
		t.Cleanup(func() { r.stop() })
		r.waitPast(t, ctx, 0)
		r.waitPast(t, ctx, commitLSN(t, ctx, dsn, "INSERT INTO t VALUES (0, 'streamed')"))
		require.NoError(t, r.stop())
		require.Equal(t, 2, resets, "a Reset for each copy")
		copied, streamed := rowEvents(t, ctx, c, dsn, prefix)
		require.Equal(t, 2000, copied)
		require.Equal(t, 1, streamed)
	})
}

// TestLeaderLoss: in a cluster of three brokers (topics replicated three times, two in sync
// required), the leader of the table's partition is killed in the middle of a big transaction;
// the sink goes on with the new leader (or stops and is run again), and the transaction reaches
// Kafka once.
func TestLeaderLoss(t *testing.T) {
	c := kafkatest.Start(t, 3)
	srv := pgtest.Shared(t, pgtest.Majors(t)[len(pgtest.Majors(t))-1])
	ctx := pgtest.Context(t, 4*time.Minute)
	dsn := setupTable(t, srv, 10)
	prefix := newPrefix(t)
	kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix, Partitions: 1, ReplicationFactor: 3,
		TopicConfigs: map[string]string{"min.insync.replicas": "2"}, MaxBufferedRecords: 200, TransactionTimeout: time.Minute}
	r := start(t, ctx, feedConfig(dsn), kcfg)
	r.waitPast(t, ctx, 0)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, prefix+".public.t")
	require.NoError(t, err)
	leader := td[prefix+".public.t"].Partitions[0].Leader
	bigThroughFault(t, ctx, r, dsn, kcfg, c, prefix, func() {
		t.Logf("killing broker %d, the partition's leader", leader)
		c.Brokers[leader-1].Kill()
	})
}

// TestOffsetsTopicOnePartition: an offsets topic of several partitions is refused, naming it,
// before the slot is made.
func TestOffsetsTopicOnePartition(t *testing.T) {
	err := refusedBeforeSlot(t, func(prefix string) (string, int32, map[string]*string) { return prefix + ".offsets", 2, nil })
	require.ErrorIs(t, err, kafkasink.ErrInvalidConfig)
	require.ErrorContains(t, err, ".offsets has 2 partitions")
}

// refusedBeforeSlot makes the topic topic(prefix) names (with its partitions and configuration),
// runs a changefeed of one table into a sink of prefix, and returns the error it stopped with,
// having checked that no slot was left.
func refusedBeforeSlot(t *testing.T, topic func(prefix string) (string, int32, map[string]*string)) error {
	t.Helper()
	c := kafkatest.Shared(t)
	srv := pgtest.Shared(t, pgtest.Majors(t)[len(pgtest.Majors(t))-1])
	ctx := pgtest.Context(t, time.Minute)
	dsn := setupTable(t, srv, 1)
	prefix := newPrefix(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	name, partitions, configs := topic(prefix)
	_, err = kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, configs, name)
	require.NoError(t, err)
	sink, err := kafkasink.Open(kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix})
	require.NoError(t, err)
	err = changefeed.Run(ctx, feedConfig(dsn), sink, sink.Handle)
	require.Error(t, err)
	require.False(t, slotExists(t, ctx, dsn), "a slot was left behind")
	return err
}

// TestRecordBeyondBuffer: an event larger than the producer's buffer stops the sink with an error
// that says which limit to raise, and nothing of the copy is visible.
func TestRecordBeyondBuffer(t *testing.T) {
	c := kafkatest.Shared(t)
	srv := pgtest.Shared(t, pgtest.Majors(t)[len(pgtest.Majors(t))-1])
	ctx := pgtest.Context(t, time.Minute)
	dsn := setupTable(t, srv, 3)
	pgtest.ExecAll(t, dsn, "UPDATE t SET v = repeat('y', 5000) WHERE id = 2")
	prefix := newPrefix(t)
	sink, err := kafkasink.Open(kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix, MaxBufferedBytes: 2000})
	require.NoError(t, err)
	err = changefeed.Run(ctx, feedConfig(dsn), sink, sink.Handle)
	require.ErrorIs(t, err, kafkasink.ErrRecordTooLarge)
	for _, want := range []string{"table public.t", `key {"id":2}`, "-kafka-max-buffered"} {
		require.Contains(t, err.Error(), want)
	}
	require.Empty(t, readCommitted(t, ctx, c, prefix+".public.t")[prefix+".public.t"])
}

// bigThroughFault commits a 20,000-row transaction into t (which holds 10 copied rows), runs
// fault once the sink is producing it, runs the sink again (as a supervisor would) each time it
// stops, without its having acknowledged the transaction, until the transaction is in, and
// checks that every row reached Kafka once.
func bigThroughFault(t *testing.T, ctx context.Context, r *running, dsn string, kcfg kafkasink.Config,
	c *kafkatest.Cluster, prefix string, fault func()) {
	t.Helper()
	before := r.sink.Stats()
	last := commitLSN(t, ctx, dsn, "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(100, 20099) g")
	for r.sink.Stats().Events < before.Events+2000 {
		select {
		case err := <-r.done:
			t.Fatalf("the feed stopped: %v", err)
		case <-time.After(5 * time.Millisecond): // polling the counter
		}
	}
	require.Equal(t, before.Transactions, r.sink.Stats().Transactions, "the transaction is still being produced")
	fault()
	for attempt := 0; r.sink.Stats().Position <= last; {
		select {
		case err := <-r.done:
			require.Less(t, confirmedFlush(t, ctx, dsn), last)
			attempt++
			require.Less(t, attempt, 5, "the sink does not recover: %v", err)
			t.Logf("the sink stopped: %v; running it again", err)
			r = start(t, ctx, feedConfig(dsn), kcfg)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling the position
		}
	}
	require.NoError(t, r.stop())
	copied, streamed := rowEvents(t, ctx, c, dsn, prefix)
	require.Equal(t, 10, copied)
	require.Equal(t, 20000, streamed)
}

// TestOffsetsTopicCompacted: an offsets topic that someone made with cleanup.policy=delete (which
// would drop the position once retention passes, and leave a slot no run can resume) is refused
// before a slot exists, with the fix.
func TestOffsetsTopicCompacted(t *testing.T) {
	del := "delete"
	err := refusedBeforeSlot(t, func(prefix string) (string, int32, map[string]*string) {
		return prefix + ".offsets", 1, map[string]*string{"cleanup.policy": &del}
	})
	require.ErrorIs(t, err, kafkasink.ErrInvalidConfig)
	require.ErrorContains(t, err, ".offsets has cleanup.policy=delete; it needs cleanup.policy=compact")
}

// TestBrokerKilledInTableCopy: the broker is killed, and started again, in the middle of the copy
// of a table added to the publication (its Kafka transaction open); the sink goes on, or stops
// and is run again, and the table's rows, then its changes, reach Kafka each once (read
// committed).
func TestBrokerKilledInTableCopy(t *testing.T) {
	c := kafkatest.Start(t, 1)
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 4*time.Minute)
		dsn := setupTable(t, srv, 10)
		const rows = 3000
		pgtest.ExecAll(t, dsn, "CREATE TABLE u (id int PRIMARY KEY, v text)",
			fmt.Sprintf("INSERT INTO u SELECT g, 'copied' FROM generate_series(1, %d) g", rows))
		prefix := newPrefix(t)
		kcfg := kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix, Logger: testLogger, TransactionTimeout: time.Minute}
		cfg := feedConfig(dsn)
		cfg.PublicationCheck = 50 * time.Millisecond
		cfg.Copy = snapshot.Config{Workers: 1, ChunkSize: 8 << 10} // one worker: the kill comes with chunks left to copy
		var killed, restarted atomic.Bool
		var resets atomic.Int64
		tctx := ctx
		run := func() *running {
			sink, err := kafkasink.Open(kcfg)
			require.NoError(t, err)
			h := func(ctx context.Context, b *changefeed.Batch) error {
				if err := sink.Handle(ctx, b); err != nil {
					return err
				}
				switch {
				case b.Kind == changefeed.TableReset:
					resets.Add(1)
				case b.Kind == changefeed.Snapshot && b.Table != nil && killed.CompareAndSwap(false, true):
					c.Brokers[0].Kill()
					require.NoError(t, c.Brokers[0].Restart(tctx))
					restarted.Store(true)
				}
				return nil
			}
			rctx, cancel := context.WithCancel(ctx)
			r := &running{sink: sink, cancel: cancel, done: make(chan error, 1)}
			go func() { r.done <- changefeed.Run(rctx, cfg, sink, h) }()
			t.Cleanup(func() { r.stop() })
			return r
		}
		r := run()
		r.waitPast(t, ctx, 0)
		pgtest.ExecAll(t, dsn, "ALTER PUBLICATION p ADD TABLE u", "UPDATE u SET v = 'before the copy' WHERE id = 2")
		oid := uint32(pgtest.Count(t, dsn, "SELECT 'u'::regclass::oid::int8"))
		// Until the stored position has u known (its copy done), whatever the sink's restarts.
		var last decoding.LSN
		for attempt := 0; last == 0 || r.sink.Stats().Position <= last; {
			if last == 0 && restarted.Load() {
				if known, syncing := storedTables(t, ctx, c, prefix); !syncing && slices.Contains(known, oid) {
					// Committed after the copy: in the stream.
					last = commitLSN(t, ctx, dsn, "INSERT INTO u VALUES (0, 'streamed')", "UPDATE u SET v = 'changed' WHERE id = 1")
				}
			}
			select {
			case err := <-r.done:
				attempt++
				require.Less(t, attempt, 5, "the sink does not recover: %v", err)
				t.Logf("the sink stopped: %v; running it again", err)
				r = run()
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(20 * time.Millisecond): // polling the position
			}
		}
		require.NoError(t, r.stop())
		require.True(t, killed.Load(), "the broker was not killed during the copy")
		// The open transaction may survive the broker's restart (its records and the
		// coordinator's state are on disk) and commit whole, or be aborted and copied again.
		t.Logf("%d table resets", resets.Load())
		// Each row once (the model refuses a second insert of a key), equal to the table.
		copied, streamed := tableEvents(t, ctx, c, dsn, prefix, "u")
		require.Equal(t, rows, copied)
		require.Equal(t, 2, streamed)
	})
}

// storedTables reads the last position committed to the offsets topic (read_committed, beside the
// sink: its Load would use the sink's own transactional client) and returns its known tables and
// whether it records a table's copy under way.
func storedTables(t *testing.T, ctx context.Context, c *kafkatest.Cluster, prefix string) (known []uint32, syncing bool) {
	t.Helper()
	topic := prefix + ".offsets"
	for _, rec := range readCommitted(t, ctx, c, topic)[topic] {
		if string(rec.Key) != "s" {
			continue // the probes of Load
		}
		var p struct {
			Tables []uint32        `json:"tables"`
			Sync   json.RawMessage `json:"sync"`
		}
		require.NoError(t, json.Unmarshal(rec.Value, &p))
		known, syncing = p.Tables, len(p.Sync) > 0 && string(p.Sync) != "null"
	}
	return known, syncing
}
