package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// BenchmarkKafkaSink measures how fast package kafkasink, in this process, delivers a backlog to
// Kafka: the backlog is committed while the sink is stopped, and an operation is the sink's run
// from its start until it committed a position past the backlog's last transaction. Two cases:
//
//   - small: TXNS one-row transactions, each its own Kafka transaction or grouped as the sink
//     groups them;
//   - big: one transaction of ROWS rows, which the buffer (WorkMem 64 kB) spills.
//
// Each case reports events/s and MB/s (the events' keys and values, kafkasink.Stats), with the
// allocations of the whole process over the timed part (b.ReportAllocs: the sink, the buffer,
// the Kafka client). It runs against a broker of its own (internal/testing/kafkatest: a single
// KRaft node) and a throwaway PostgreSQL 18 server (the newest installed otherwise), topics of 3
// partitions, and needs PGREORDER_BENCH_KAFKA_SINK=1:
//
//	PGREORDER_BENCH_KAFKA_SINK=1 go test -run '^$' -bench KafkaSink -benchtime 1x ./bench/
//
// Sizes (PGREORDER_BENCH_FULL=1 selects the larger value of each):
//
//	PGREORDER_BENCH_KAFKA_SINK_TXNS  one-row transactions of the small case (2000; 20000)
//	PGREORDER_BENCH_KAFKA_SINK_ROWS  rows of the big case's transaction (200000; 1000000)
//
// PGREORDER_BENCH_KAFKA_SINK_CASES selects cases, comma-separated (small,big).
func BenchmarkKafkaSink(b *testing.B) {
	if os.Getenv("PGREORDER_BENCH_KAFKA_SINK") != "1" {
		b.Skip("set PGREORDER_BENCH_KAFKA_SINK=1 to measure the Kafka sink's throughput")
	}
	txns := envSize(b, "PGREORDER_BENCH_KAFKA_SINK_TXNS", 20_000, 2000)
	rows := envSize(b, "PGREORDER_BENCH_KAFKA_SINK_ROWS", 1_000_000, 200_000)
	cases := envList(b, "PGREORDER_BENCH_KAFKA_SINK_CASES", []string{"small", "big"})
	installs := pgtest.FindInstalls()
	if len(installs) == 0 {
		pgtest.Unavailable(b, "no PostgreSQL server installed")
	}
	in := installs[len(installs)-1]
	for _, i := range installs {
		if i.Major == 18 {
			in = i
		}
	}
	kafka := kafkatest.Start(b, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, in, pgtest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()

	for _, name := range cases {
		b.Run(name, func(b *testing.B) {
			db := fmt.Sprintf("sink_%s", name)
			if err := pgtest.Exec(ctx, srv.ConnString("postgres"), "CREATE DATABASE "+db); err != nil {
				b.Fatal(err)
			}
			defer pgtest.DropDatabase(context.Background(), srv, db)
			dsn := srv.ConnString(db)
			if err := pgtest.Exec(ctx, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION p FOR TABLE t"); err != nil {
				b.Fatal(err)
			}
			sb := &sinkBench{dsn: dsn, kcfg: kafkasink.Config{Brokers: kafka.Addrs(), TopicPrefix: "bench_" + name, Partitions: 3,
				Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}}
			// The first run makes the slot and copies the empty table: after it, the sink streams.
			if _, err := sb.deliver(ctx, 0); err != nil {
				b.Fatal(err)
			}
			next := int64(1)
			var events, bytes int64
			var took time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				var last decoding.LSN
				if name == "small" {
					err = pgtest.Exec(ctx, dsn, fmt.Sprintf(`DO $$ BEGIN FOR i IN %d..%d LOOP INSERT INTO t VALUES (i, md5(i::text)); COMMIT; END LOOP; END $$`,
						next, next+txns-1))
					next += txns
					if err == nil {
						last, err = commitLSN(ctx, dsn, fmt.Sprintf(`INSERT INTO t VALUES (%d, 'last')`, next))
						next++
					}
				} else {
					last, err = commitLSN(ctx, dsn, fmt.Sprintf(`INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%d, %d) g`,
						next, next+rows-1))
					next += rows
				}
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				st, err := sb.deliver(ctx, last)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				events += st.Events
				bytes += st.Bytes
				took += st.took
			}
			b.ReportMetric(float64(events)/took.Seconds(), "events/s")
			b.ReportMetric(float64(bytes)/1e6/took.Seconds(), "MB/s")
		})
	}
}

// sinkBench runs a changefeed into a kafkasink.Sink, one run per delivery.
type sinkBench struct {
	dsn  string
	kcfg kafkasink.Config
}

// sinkRun is what a delivery did: the sink's statistics and the time from its start until it
// committed past the backlog.
type sinkRun struct {
	kafkasink.Stats
	took time.Duration
}

// deliver starts a sink, waits until it committed a position past last and stops it.
func (sb *sinkBench) deliver(ctx context.Context, last decoding.LSN) (sinkRun, error) {
	start := time.Now()
	sink, err := kafkasink.Open(sb.kcfg)
	if err != nil {
		return sinkRun{}, err
	}
	cfg := changefeed.Config{Replication: replication.Config{ConnString: sb.dsn, Slot: "s", Publications: []string{"p"},
		Buffer: reorderbuffer.Config{WorkMem: 64 << 10}}, Logger: sb.kcfg.Logger}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- changefeed.Run(rctx, cfg, sink, sink.Handle) }()
	stop := func() error {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	// A millisecond's poll: the measurement's resolution.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for sink.Stats().Position <= last {
		select {
		case err := <-done:
			done <- err
			stop()
			return sinkRun{}, fmt.Errorf("the feed stopped: %w", err)
		case <-ctx.Done():
			stop()
			return sinkRun{}, fmt.Errorf("the sink did not commit past %s: %w", last, ctx.Err())
		case <-tick.C:
		}
	}
	r := sinkRun{Stats: sink.Stats(), took: time.Since(start)}
	return r, stop()
}

// commitLSN runs sql in a transaction of its own and returns an LSN its commit's end is beyond.
func commitLSN(ctx context.Context, dsn, sql string) (decoding.LSN, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, sql); err != nil {
		return 0, err
	}
	var lsn string
	if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return decoding.ParseLSN(lsn)
}
