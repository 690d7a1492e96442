package changefeed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// messageCount is a slog.Handler that counts the records of each message, and passes them on.
type messageCount struct {
	next slog.Handler
	mu   *sync.Mutex
	n    map[string]int
}

func newMessageCount(t *testing.T) *messageCount {
	return &messageCount{next: testLogger(t).Handler(), mu: new(sync.Mutex), n: map[string]int{}}
}

func (c *messageCount) Enabled(context.Context, slog.Level) bool { return true }
func (c *messageCount) WithAttrs(a []slog.Attr) slog.Handler {
	return &messageCount{next: c.next.WithAttrs(a), mu: c.mu, n: c.n}
}
func (c *messageCount) WithGroup(g string) slog.Handler {
	return &messageCount{next: c.next.WithGroup(g), mu: c.mu, n: c.n}
}
func (c *messageCount) Handle(ctx context.Context, r slog.Record) error {
	c.mu.Lock()
	c.n[r.Message]++
	c.mu.Unlock()
	if c.next.Enabled(ctx, r.Level) {
		return c.next.Handle(ctx, r)
	}
	return nil
}

func (c *messageCount) count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[msg]
}

// countPrefix counts the records whose message begins with prefix.
func (c *messageCount) countPrefix(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for m, k := range c.n {
		if strings.HasPrefix(m, prefix) {
			n += k
		}
	}
	return n
}

// restartMessage is what Run logs before it makes another attempt.
const restartMessage = "replication interrupted; resuming"

// TestWalsenderKilled: the walsender of the Feed's stream is terminated while the source keeps
// committing; the stream does not reconnect by itself, Run's next attempt resumes after the
// stored position, and every transaction reaches the handler exactly once. What the first
// connection logs for good (the publication, on PostgreSQL 17 and later the failover settings'
// warning) the second attempt does not log again.
func TestWalsenderKilled(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text, n int)`,
			`INSERT INTO t SELECT g, 'v', g FROM generate_series(1, 100) g`, `CREATE PUBLICATION pub FOR TABLE t`)
		log := newMessageCount(t)
		cfg := changefeed.Config{Logger: slog.New(log),
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "cf", Publications: []string{"pub"},
				StatusInterval: 100 * time.Millisecond, Reconnect: replication.ReconnectPolicy{MaxDelay: 500 * time.Millisecond}}}
		failover := srv.Major() >= 17
		cfg.Replication.Failover = failover
		r := &recorder{txns: make(chan struct{}, 100)}
		f, err := changefeed.New(cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), r.handle)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Run(rctx) }()
		defer func() {
			cancel()
			<-done
		}()
		pgtest.Eventually(t, time.Minute, "the stream starts", func() bool { return f.Progress().Start != 0 })
		const before, during, after = 3, 3, 3
		for i := range before {
			pgtest.ExecAll(t, dsn, fmt.Sprintf(`INSERT INTO t VALUES (%d, 'a', %d)`, 1000+i, i))
		}
		waitTxns(t, r, before)

		killed := pgtest.Count(t, dsn, `SELECT count(pg_catalog.pg_terminate_backend(active_pid)) FROM pg_catalog.pg_replication_slots
			WHERE slot_name = 'cf' AND active_pid IS NOT NULL`)
		require.EqualValues(t, 1, killed, "the stream's walsender")
		for i := range during {
			pgtest.ExecAll(t, dsn, fmt.Sprintf(`UPDATE t SET v = 'b', n = n + 1 WHERE id = %d`, 1000+i))
		}
		pgtest.Eventually(t, time.Minute, "a second stream", func() bool { return f.Reconnects() >= 1 })
		for i := range after {
			pgtest.ExecAll(t, dsn, fmt.Sprintf(`DELETE FROM t WHERE id = %d`, 1+i))
		}
		waitTxns(t, r, during+after)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		done <- nil

		require.Equal(t, 1, f.Reconnects(), "one stream started again")
		// The readings go on across the attempts' streams: the changes of both are counted.
		require.GreaterOrEqual(t, f.Stats().TotalChanges, int64(before+during+after), "counters summed over the streams")
		require.NotZero(t, f.Progress().Acked)
		require.Equal(t, 1, log.count(restartMessage), "one attempt made again")
		require.Equal(t, 1, log.count("publication"), "the publication logged by the first attempt only")
		if failover { // no standby keeps the slot: one warning
			require.Equal(t, 1, log.countPrefix("the slot may not survive a failover"), "the failover warning logged by the first attempt only")
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		var txns, resumes int
		for _, k := range r.kinds {
			switch k {
			case changefeed.Transaction:
				txns++
			case changefeed.Resume:
				resumes++
			}
		}
		require.Equal(t, before+during+after, txns, "each transaction once")
		require.Equal(t, 1, resumes, "the second attempt resumes after the stored position")
		m := newModel()
		for _, l := range r.lines {
			require.NoError(t, m.apply(l), l)
		}
		require.Empty(t, diff(m.rows["public.t"], tableRows(ctx, t, dsn, "t")))
	})
}

// refusedSource returns a replication connection string to a port that refuses connections.
func refusedSource(t *testing.T) (string, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return fmt.Sprintf("host=127.0.0.1 port=%d dbname=x user=x connect_timeout=5 replication=database", port), port
}

// TestSourceRefused: a Feed whose source refuses connections stops within StartTimeout with a
// NotStartedError that names the source and the refusal; with StartTimeout negative it goes on
// trying until ctx ends.
func TestSourceRefused(t *testing.T) {
	dsn, port := refusedSource(t)
	cfg := changefeed.Config{Logger: testLogger(t), StartTimeout: time.Second,
		Replication: replication.Config{ConnString: dsn, Slot: "cf", Publications: []string{"pub"}}}
	for _, start := range []changefeed.Start{changefeed.StartCopy, changefeed.StartStream} {
		t.Run(start.String(), func(t *testing.T) {
			cfg := cfg
			cfg.Start = start
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			began := time.Now()
			err := changefeed.Run(ctx, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), drain)
			took := time.Since(began)
			require.NoError(t, ctx.Err(), "stopped by itself")
			require.ErrorIs(t, err, changefeed.ErrNotStarted)
			var ne *changefeed.NotStartedError
			require.ErrorAs(t, err, &ne)
			require.Equal(t, changefeed.SideSource, ne.Side)
			require.Contains(t, err.Error(), "the source could not be reached")
			require.Contains(t, err.Error(), "refused")
			require.Contains(t, err.Error(), fmt.Sprint(port))
			require.Contains(t, err.Error(), "StartTimeout")
			require.Less(t, took, 20*time.Second)

			// No limit: still trying when ctx ends.
			cfg.StartTimeout = -1
			short, cancel2 := context.WithTimeout(ctx, 3*time.Second)
			defer cancel2()
			err = changefeed.Run(short, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), drain)
			require.ErrorIs(t, err, context.DeadlineExceeded)
		})
	}
}

// refusingStore is a Store whose Load fails as an unreachable database does.
type refusingStore struct{ changefeed.SlotStore }

var errStoreDown = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}

func (refusingStore) Load(context.Context, string) (changefeed.Position, bool, error) {
	return changefeed.Position{}, false, fmt.Errorf("store: %w", errStoreDown)
}

// TestStoreRefused: a store that cannot be reached stops the first start within StartTimeout,
// naming the store.
func TestStoreRefused(t *testing.T) {
	dsn, _ := refusedSource(t)
	cfg := changefeed.Config{Logger: testLogger(t), StartTimeout: 500 * time.Millisecond, Start: changefeed.StartStream,
		Replication: replication.Config{ConnString: dsn, Slot: "cf", Publications: []string{"pub"}}}
	err := changefeed.Run(pgtest.Context(t, time.Minute), cfg, refusingStore{}, drain)
	var ne *changefeed.NotStartedError
	require.ErrorAs(t, err, &ne)
	require.Equal(t, changefeed.SideStore, ne.Side)
	require.ErrorIs(t, err, errStoreDown)
	require.True(t, strings.Contains(err.Error(), "the store could not be reached"), err.Error())
}

// TestTemporarySlotLost: a temporary slot goes with its connection, so a Feed on one does not
// make another attempt when the walsender is terminated: Run stops and says why.
func TestTemporarySlotLost(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text, n int)`, `CREATE PUBLICATION pub FOR TABLE t`)
		log := newMessageCount(t)
		cfg := changefeed.Config{Logger: slog.New(log), Start: changefeed.StartStream,
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "tmp", Publications: []string{"pub"},
				CreateSlot: true, TemporarySlot: true}}
		f, err := changefeed.New(cfg, changefeed.SlotStore{}, drain)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- f.Run(ctx) }()
		pgtest.Eventually(t, 30*time.Second, "the stream starts", func() bool { return f.Progress().Start != 0 })
		killed := pgtest.Count(t, dsn, `SELECT count(pg_catalog.pg_terminate_backend(active_pid)) FROM pg_catalog.pg_replication_slots
			WHERE slot_name = 'tmp' AND active_pid IS NOT NULL`)
		require.EqualValues(t, 1, killed)
		err = <-done
		require.ErrorContains(t, err, `the connection to the temporary slot "tmp" was lost`)
		require.NoError(t, ctx.Err())
		require.Zero(t, log.count(restartMessage), "no second attempt")
	})
}
