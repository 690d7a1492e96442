package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestKafkaFlags: flags that cannot work are refused before anything connects, naming the flag.
func TestKafkaFlags(t *testing.T) {
	base := []string{"-source", "x", "-slot", "s", "-publication", "p"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing -source, -slot, -publication, -kafka-brokers"},
		{base, "missing -kafka-brokers"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-compression", "brotli"), "-kafka-compression"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-sasl-user", "u"), "-kafka-sasl-user needs -kafka-sasl-mechanism"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-sasl-mechanism", "GSSAPI"), "-kafka-sasl-mechanism"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-topic-prefix", "a b"), "-kafka-topic-prefix"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-partitions", "-1"), "-kafka-partitions"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-tls-cert", "c.pem"), "-kafka-tls-cert and -kafka-tls-key"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-max-buffered", "lots"), "-kafka-max-buffered"},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-group", "0"), "-kafka-group 0: want 1 or more"},
		{append(base, "-kafka-brokers", "b:9092", "-spill-compression", "gzip"), `-spill-compression "gzip"`},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-topic-map", "sales.items"), `want SCHEMA.TABLE=TOPIC`},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-topic-map", "sales.items=a b"), `-kafka-topic-map`},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-value-format", "avro"), `-kafka-value-format "avro": valid values are json and json-schema`},
		{append(base, "-kafka-brokers", "b:9092", "-kafka-key-format", "xml"), `-kafka-key-format "xml"`},
		{append(base, "-kafka-brokers", "b:9092", "-decimal-handling", "float"), `-decimal-handling "float": valid values are precise, string and double`},
		{append(base, "-kafka-brokers", "b:9092", "-interval-handling", "iso"), `-interval-handling "iso"`},
	} {
		err := runKafka(context.Background(), tc.args)
		require.Error(t, err, "%v", tc.args)
		require.Contains(t, err.Error(), tc.want, "%v", tc.args)
	}
}

// TestParseTopicMap: -kafka-topic-map takes names as SQL writes them: bare ones folded to lower
// case, quoted ones as they are (a '.' inside quotes is part of the name).
func TestParseTopicMap(t *testing.T) {
	for _, tc := range []struct {
		in    string
		table catalog.TableName
		topic string
	}{
		{"sales.order_items=sales-order-items", catalog.TableName{Schema: "sales", Name: "order_items"}, "sales-order-items"},
		{"Sales.Items=t", catalog.TableName{Schema: "sales", Name: "items"}, "t"},
		{`"x.a".b=x_a.b`, catalog.TableName{Schema: "x.a", Name: "b"}, "x_a.b"},
		{`x."a.b"=t.1`, catalog.TableName{Schema: "x", Name: "a.b"}, "t.1"},
		{`"Odd ""q"""."Mixed Case"=odd`, catalog.TableName{Schema: `Odd "q"`, Name: "Mixed Case"}, "odd"},
	} {
		table, topic, err := parseTopicMap(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.table, table, tc.in)
		require.Equal(t, tc.topic, topic, tc.in)
	}
	for _, bad := range []string{"items=t", `"x.a=t`, "s.t=", "s.t=a/b", ".t=x", `s.""=x`, "s.t"} {
		_, _, err := parseTopicMap(bad)
		require.Error(t, err, bad)
	}
}

// TestKafkaCommand: pgreorder kafka copies and streams a table into Kafka; the slot is
// acknowledged once the events are committed there. With -two-phase (on 18), the slot decodes
// at PREPARE, and a prepared transaction reaches Kafka once committed, never when rolled back.
func TestKafkaCommand(t *testing.T) {
	c := kafkatest.Shared(t)
	for _, major := range pgtest.Majors(t) {
		if major != 18 && major != 15 {
			continue
		}
		twoPhase := major == 18
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			srv := pgtest.Shared(t, major)
			dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
			require.NoError(t, pgtest.Exec(ctx, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION p FOR TABLE t",
				"INSERT INTO t VALUES (1, 'copied')"))
			prefix := fmt.Sprintf("cmd%d", major)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			args := []string{"-source", dsn, "-slot", "k", "-publication", "p", "-progress", "50ms", "-status-interval", "100ms",
				"-kafka-brokers", c.Seeds(), "-kafka-topic-prefix", prefix, "-kafka-partitions", "3", "-kafka-compression", "zstd"}
			if twoPhase {
				args = append(args, "-two-phase")
			}
			go func() { done <- runKafka(runCtx, args) }()
			conn, err := pgx.Connect(ctx, dsn)
			require.NoError(t, err)
			defer conn.Close(ctx)
			acked := func() decoding.LSN {
				var s *string
				if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'k'").Scan(&s); err != nil || s == nil {
					return 0
				}
				l, _ := decoding.ParseLSN(*s)
				return l
			}
			for acked() == 0 { // the copy is done
				select {
				case err := <-done:
					t.Fatalf("pgreorder kafka stopped: %v", err)
				case <-time.After(20 * time.Millisecond):
				}
			}
			want := []string{`r {"id":1}`, `c {"id":2}`}
			if twoPhase {
				var on bool
				require.NoError(t, conn.QueryRow(ctx, "SELECT two_phase FROM pg_replication_slots WHERE slot_name = 'k'").Scan(&on))
				require.True(t, on, "the slot decodes at PREPARE")
				require.NoError(t, pgtest.Exec(ctx, dsn, "BEGIN", "INSERT INTO t VALUES (3, 'prepared')", "PREPARE TRANSACTION 'k3'",
					"COMMIT PREPARED 'k3'", "BEGIN", "INSERT INTO t VALUES (4, 'rolled back')", "PREPARE TRANSACTION 'k4'",
					"ROLLBACK PREPARED 'k4'"))
				want = append(want, `c {"id":3}`)
			}
			var lsn string
			require.NoError(t, conn.QueryRow(ctx, "WITH i AS (INSERT INTO t VALUES (2, 'streamed') RETURNING 1) SELECT pg_current_wal_insert_lsn()::text FROM i").Scan(&lsn))
			last, err := decoding.ParseLSN(lsn)
			require.NoError(t, err)
			for acked() <= last {
				select {
				case err := <-done:
					t.Fatalf("pgreorder kafka stopped: %v", err)
				case <-time.After(20 * time.Millisecond):
				}
			}
			stop()
			require.NoError(t, <-done)
			var ops []string
			for _, r := range kafkatest.ReadCommitted(t, ctx, c, prefix+".public.t")[prefix+".public.t"] {
				var e struct{ Op string }
				require.NoError(t, json.Unmarshal(r.Value, &e))
				ops = append(ops, e.Op+" "+string(r.Key))
			}
			require.ElementsMatch(t, want, ops, strings.Join(ops, "; "))
		})
	}
}

// TestKafkaSourceRefused: with the brokers up and the source refusing connections, the first start
// stops within -start-timeout (30s by default) with an error that says the source could not be
// reached, where a service manager sees it, instead of retrying for ever.
func TestKafkaSourceRefused(t *testing.T) {
	c := kafkatest.Shared(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	err = runKafka(ctx, []string{"-source", fmt.Sprintf("host=127.0.0.1 port=%d dbname=x", port), "-slot", "k", "-publication", "p",
		"-kafka-brokers", c.Seeds(), "-kafka-topic-prefix", "refused"})
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "stopped by itself, not by the test's deadline")
	require.Contains(t, err.Error(), "refused")
	require.Contains(t, err.Error(), "on the source")
	require.Contains(t, err.Error(), fmt.Sprint(port), "the error names the source's address")
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
}
