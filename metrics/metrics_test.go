package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// majors are the server versions the tests run against.
func majors(t *testing.T) []int {
	var out []int
	for _, m := range pgtest.Majors(t) {
		if m == 15 || m == 18 {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		pgtest.Unavailable(t, "neither PostgreSQL 15 nor 18 is installed")
	}
	return out
}

// gather collects c through a registry and returns every value by name, with labels other than
// the constant ones in braces: pgreorder_wal_position_bytes{received}.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "position" {
					name += "{" + l.GetValue() + "}"
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[name] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[name] = m.GetGauge().GetValue()
			default:
				t.Fatalf("%s is a %v", name, mf.GetType())
			}
		}
	}
	return out
}

// inserts reads x's changes and returns the number of inserts.
func inserts(t *testing.T, x *reorderbuffer.Txn) int {
	t.Helper()
	n := 0
	for c, err := range x.Changes() {
		require.NoError(t, err)
		if _, ok := c.Msg.(*decoding.Insert); ok {
			n++
		}
	}
	return n
}

// consume reads n transactions and acknowledges them, and returns the number of inserts.
func consume(ctx context.Context, t *testing.T, s *replication.Stream, n int) int {
	t.Helper()
	changes := 0
	for range n {
		x, err := s.Next(ctx)
		require.NoError(t, err)
		changes += inserts(t, x)
		require.NoError(t, s.Ack(x))
	}
	return changes
}

// idle drives Next (which receives keepalives and sends status updates) until cond holds.
func idle(ctx context.Context, t *testing.T, s *replication.Stream, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		nctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		x, err := s.Next(nctx)
		cancel()
		require.Nil(t, x, "nothing more was written")
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		require.NoError(t, ctx.Err(), "waiting for %s", what)
	}
}

// TestCollector streams from PostgreSQL 15 and 18 with a small work memory, scrapes the
// collector from another goroutine the whole time, and checks the values: changes counted equal
// rows inserted, spilled bytes, the unacknowledged transaction and its age, lag back to 0 when
// caught up. It lints the metric names and help texts.
func TestCollector(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	for _, major := range majors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			dsn := srv.ConnString(db)
			require.NoError(t, pgtest.Exec(ctx, dsn, `CREATE TABLE m (id int PRIMARY KEY, v text)`, `CREATE PUBLICATION p FOR TABLE m`))
			s, err := replication.Start(ctx, replication.Config{
				ConnString: srv.ReplicationConnString(db), Slot: "m", Publications: []string{"p"}, CreateSlot: true,
				StatusInterval: 50 * time.Millisecond,
				Buffer:         reorderbuffer.Config{WorkMem: 64 << 10, Dir: t.TempDir()},
			})
			require.NoError(t, err)
			defer s.Close(ctx)
			c, err := metrics.New(s, metrics.Options{Labels: map[string]string{"slot": "m"}})
			require.NoError(t, err)

			problems, err := testutil.CollectAndLint(c)
			require.NoError(t, err)
			require.Empty(t, problems)
			require.Equal(t, 27, testutil.CollectAndCount(c), "25 metrics, one with three positions")

			// Scrape from another goroutine while the consumer works (run with -race).
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					testutil.CollectAndCount(c)
					_ = c.Reading().String()
					time.Sleep(time.Millisecond) // pacing, not a wait: scrapes all along the run
				}
			})
			defer func() { close(stop); wg.Wait() }()

			const bigRows, small = 3000, 20
			inserted := time.Now()
			require.NoError(t, pgtest.Exec(ctx, dsn,
				fmt.Sprintf(`INSERT INTO m SELECT g, repeat('x', 200) FROM generate_series(1, %d) g`, bigRows)))
			for i := range small {
				require.NoError(t, pgtest.Exec(ctx, dsn, fmt.Sprintf(`INSERT INTO m VALUES (%d, 'small')`, bigRows+1+i)))
			}
			changes := consume(ctx, t, s, small)
			// The last one is handed out and held: unacknowledged, and getting older.
			x, err := s.Next(ctx)
			require.NoError(t, err)
			changes += inserts(t, x)
			var v map[string]float64
			pgtest.Eventually(t, time.Minute, "the held transaction's age to reach 200ms", func() bool {
				v = gather(t, c)
				return v["pgreorder_oldest_unacknowledged_age_seconds"] >= 0.2
			})
			require.LessOrEqual(t, v["pgreorder_oldest_unacknowledged_age_seconds"], time.Since(inserted).Seconds(),
				"older than the transaction")
			require.Equal(t, 1.0, v["pgreorder_unacknowledged_transactions"])
			require.Equal(t, 0.0, v["pgreorder_caught_up"])
			require.Greater(t, v["pgreorder_lag_seconds"], 0.0, "the consumer holds a transaction")
			require.Equal(t, float64(small), v["pgreorder_acknowledged_transactions_total"])
			require.NoError(t, s.Ack(x))

			require.Equal(t, bigRows+small, changes)
			// Caught up: the server sent a keepalive, everything is acknowledged, a status update
			// went out. (WAL written elsewhere on the server brings keepalives that move the
			// received position ahead again until the next status update: check one reading.)
			var rd metrics.Reading
			idle(ctx, t, s, "lag 0", func() bool {
				rd = c.Reading()
				return rd.Activity.CaughtUp && rd.LagBytes == 0
			})
			t.Logf("%s", rd)
			require.Contains(t, rd.String(), "received 21 txns, 3.02k changes | acked 21 | caught up")
			require.Equal(t, rd.Position.Received, rd.Position.Flushed)
			require.Equal(t, x.EndLSN, rd.Position.Acked)
			v = gather(t, c)
			for name, want := range map[string]float64{
				"pgreorder_received_transactions_total":       small + 1,
				"pgreorder_received_changes_total":            bigRows + small,
				"pgreorder_acknowledged_transactions_total":   small + 1,
				"pgreorder_unacknowledged_transactions":       0,
				"pgreorder_oldest_unacknowledged_age_seconds": 0,
				"pgreorder_lag_seconds":                       0,
				"pgreorder_queued_transactions":               0,
				"pgreorder_reconnects_total":                  0,
				"pgreorder_spill_files_bytes":                 0,
			} {
				require.Equal(t, want, v[name], name)
			}
			require.Greater(t, v["pgreorder_spilled_bytes_total"], 0.0, "64kB of work memory")
			require.Greater(t, v["pgreorder_spilled_transactions_total"], 0.0)
			require.Greater(t, v["pgreorder_memory_peak_bytes"], 0.0)
			require.Greater(t, v["pgreorder_received_bytes_total"], 0.0)
			require.GreaterOrEqual(t, v["pgreorder_wal_position_bytes{received}"], v["pgreorder_wal_position_bytes{flushed}"])
			require.Equal(t, float64(x.EndLSN), v["pgreorder_wal_position_bytes{acknowledged}"])
		})
	}
}

// TestCollectorAfterClose: a closed stream can still be read.
func TestCollectorAfterClose(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	major := majors(t)[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	db := pgtest.NewDatabase(t, srv)
	require.NoError(t, pgtest.Exec(ctx, srv.ConnString(db), `CREATE TABLE m (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE m`))
	s, err := replication.Start(ctx, replication.Config{
		ConnString: srv.ReplicationConnString(db), Slot: "m", Publications: []string{"p"}, CreateSlot: true, TemporarySlot: true,
	})
	require.NoError(t, err)
	c, err := metrics.New(s, metrics.Options{})
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	require.Equal(t, 27, testutil.CollectAndCount(c))
}

// TestNewMisuse: a nil stream and bad labels are errors, not panics.
func TestNewMisuse(t *testing.T) {
	_, err := metrics.New(nil, metrics.Options{})
	require.ErrorIs(t, err, metrics.ErrNoStream)
	_, err = metrics.Handler(nil)
	require.ErrorIs(t, err, metrics.ErrNoStream)
	_, err = metrics.Listen("127.0.0.1:0", nil)
	require.Error(t, err)
}

// TestLabelsChecked: label names are checked before the stream is needed.
func TestLabelsChecked(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	major := majors(t)[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	db := pgtest.NewDatabase(t, srv)
	require.NoError(t, pgtest.Exec(ctx, srv.ConnString(db), `CREATE TABLE m (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE m`))
	s, err := replication.Start(ctx, replication.Config{
		ConnString: srv.ReplicationConnString(db), Slot: "m", Publications: []string{"p"}, CreateSlot: true, TemporarySlot: true,
	})
	require.NoError(t, err)
	defer s.Close(ctx)
	for _, bad := range []string{"", "1slot", "a-b", "__name", "position"} {
		_, err := metrics.New(s, metrics.Options{Labels: map[string]string{bad: "x"}})
		require.Error(t, err, "label %q", bad)
	}
	c, err := metrics.New(s, metrics.Options{Labels: map[string]string{"slot": "m", "db": db}})
	require.NoError(t, err)

	// Served on /metrics and nothing else.
	h, err := metrics.Handler(c)
	require.NoError(t, err)
	srvM, err := metrics.Listen("127.0.0.1:0", h)
	require.NoError(t, err)
	get := func(method, path string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, method, "http://"+srvM.Addr()+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := get("GET", "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `pgreorder_lag_bytes{db="`+db+`",slot="m"} 0`)
	require.Contains(t, body, "# TYPE pgreorder_received_changes_total counter")
	require.Contains(t, body, "go_goroutines")
	require.Contains(t, body, "process_cpu_seconds_total")
	for _, path := range []string{"/", "/metrics/", "/debug/pprof/", "/favicon.ico"} {
		code, _ := get("GET", path)
		require.Equal(t, http.StatusNotFound, code, path)
	}
	code, _ = get("POST", "/metrics")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.NoError(t, srvM.Close(ctx))
	require.NoError(t, srvM.Close(ctx), "twice")
	_, err = http.Get("http://" + srvM.Addr() + "/metrics")
	require.Error(t, err, "closed")
	require.True(t, strings.HasPrefix(srvM.Addr(), "127.0.0.1:"))
}
