package main

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestKafkaMetrics runs `pgreorder kafka -metrics-addr 127.0.0.1:0` and scrapes the Kafka
// metrics: the events and bytes produced, the commits, the committed position (past the last
// transaction's start) and the lag, 0 once caught up.
func TestKafkaMetrics(t *testing.T) {
	c := kafkatest.Shared(t)
	majors := pgtest.Majors(t)
	srv := pgtest.Shared(t, majors[len(majors)-1])
	ctx := pgtest.Context(t, 2*time.Minute)
	bin := filepath.Join(t.TempDir(), "pgreorder")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION p FOR TABLE t", "INSERT INTO t VALUES (0, 'copied')")
	cmd := exec.CommandContext(ctx, bin, "kafka", "-source", dsn, "-slot", "km", "-publication", "p", "-status-interval", "100ms",
		"-progress", "0", "-metrics-addr", "127.0.0.1:0", "-kafka-brokers", c.Seeds(), "-kafka-topic-prefix", "km")
	wait := serveMetrics(ctx, t, cmd).wait
	defer cmd.Process.Kill()
	wait("the copied row", func(v map[string]float64) bool { return v["pgreorder_kafka_produced_events_total"] == 1 })
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var lsn string
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn))
	before, err := decoding.ParseLSN(lsn)
	require.NoError(t, err)
	const rows = 500
	pgtest.ExecAll(t, dsn, "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 500) g")
	v := wait("every row, caught up", func(v map[string]float64) bool {
		return v["pgreorder_kafka_produced_events_total"] == rows+1 && v["pgreorder_caught_up"] == 1
	})
	require.Zero(t, v["pgreorder_kafka_lag_bytes"])
	require.Greater(t, v["pgreorder_kafka_produced_bytes_total"], float64(rows*100))
	require.GreaterOrEqual(t, v["pgreorder_kafka_commit_seconds_count"], 2.0, "the copy's and the insert's")
	require.Positive(t, v["pgreorder_kafka_commit_seconds_sum"])
	require.Greater(t, v["pgreorder_kafka_committed_position_bytes"], float64(before), "the insert's end is committed")
}
