package apply

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// syncName is the application_name the applier's replication connection uses in
// TestSynchronousSource, and the source's synchronous_standby_names.
const syncName = "syncapply"

// TestSynchronousSource replicates from a source whose synchronous_standby_names names the
// applier: every COMMIT on the source returns only once the applier has acknowledged a flush
// position at or past it. The applier must therefore make each commit durable and acknowledge
// it even when nothing follows it in the stream: a streamed transaction's COMMIT followed by
// silence, small transactions one at a time. A commit the applier holds back hangs the source,
// which the test reports as a timeout of that COMMIT.
func TestSynchronousSource(t *testing.T) {
	syncSourceModes(t, "sync", func(t *testing.T, ctx context.Context, e *env, cfg Config) {
		r := start(t, cfg)
		waitSync(t, ctx, e.src)

		syncWorkload(t, ctx, e, r, 45*time.Second, 20, nil)
		e.waitMarker(t, r, 1)
		r.halt(t)
		e.compare(t)
	})
}

// TestSynchronousSourceAtOnce checks that, under synchronous replication, the commit the source
// waits for is made durable by itself and acknowledged at once: once the stream is quiet (the
// source's COMMIT is waiting), every commit is synchronous, so no timer (asyncDelay, the status
// interval, a flushing transaction after another idle wait) stands between it and the flush
// report that releases the source. asyncDelay is set to an hour, and the status interval to 5s
// (the source counts the applier as synchronous only after its first status update). A worker's
// commit of a streamed transaction is held until the leader found the stream quiet (as it does
// when the worker is behind the stream, the case of a large transaction), and every commit sent
// with synchronous_commit off fails the test.
func TestSynchronousSourceAtOnce(t *testing.T) {
	syncSourceModes(t, "atonce", func(t *testing.T, ctx context.Context, e *env, cfg Config) {
		w := &quietWatch{ch: make(chan struct{})}
		cfg.Source.StatusInterval = 5 * time.Second
		cfg.hooks = &hooks{asyncDelay: time.Hour, stage: w.stage}
		r := start(t, cfg)
		waitSync(t, ctx, e.src)

		syncWorkload(t, ctx, e, r, 20*time.Second, 5, func(what string) {
			if xs := w.takeAsync(); len(xs) > 0 {
				t.Errorf("%s: transactions %v committed on the target without waiting for its WAL flush after the "+
					"stream went quiet: the source's COMMIT waited for a later flush", what, xs)
			}
		})
		e.waitMarker(t, r, 1)
		r.halt(t)
		e.compare(t)
	})
}

// syncWorkload runs, one at a time on the source, a streamed transaction followed by nothing, a
// streamed one with a subtransaction rolled back, small transactions and a marker, and fails t
// if a COMMIT waits longer than wait for the applier's acknowledgement. after, if set, is called
// after each COMMIT with what it committed.
func syncWorkload(t *testing.T, ctx context.Context, e *env, r *running, wait time.Duration, small int, after func(what string)) {
	t.Helper()
	conn, err := pgx.Connect(ctx, e.src)
	must(t, err)
	defer conn.Close(context.Background())
	commit := func(what string, sql ...string) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, wait)
		defer ccancel()
		tx, err := conn.Begin(cctx)
		must(t, err)
		for _, s := range sql {
			_, err := tx.Exec(cctx, s)
			must(t, err)
		}
		if err := tx.Commit(cctx); err != nil {
			t.Fatalf("%s: COMMIT on the source did not return: %v (applier stats %+v)", what, err, r.a.Stats())
		}
		if after != nil {
			after(what)
		}
	}
	// Streamed: far beyond the source's 64kB, followed by nothing.
	commit("streamed transaction", `INSERT INTO big SELECT g, g % 10, repeat('x', 100) FROM generate_series(1, 20000) g`)
	// Streamed, with a subtransaction rolled back.
	commit("streamed transaction with a rollback",
		`SAVEPOINT a`,
		`UPDATE big SET payload = 'y' WHERE id <= 5000`,
		`ROLLBACK TO SAVEPOINT a`,
		`DELETE FROM big WHERE id > 15000`)
	// Small transactions one at a time, each waiting for the previous one.
	for i := range small {
		commit(fmt.Sprintf("small transaction %d", i), fmt.Sprintf(`INSERT INTO items VALUES (%d, %d, 'n')`, i, i))
	}
	commit("marker", `INSERT INTO marker VALUES (1)`)
}

// quietWatch follows the leader's quiet and busy stages, holds every commit until the stream is
// quiet, and records the transactions committed with synchronous_commit off.
type quietWatch struct {
	mu    sync.Mutex
	quiet bool
	ch    chan struct{} // closed when the stream goes quiet
	async []uint32
}

func (w *quietWatch) stage(ctx context.Context, stage string, x txnRef) error {
	w.mu.Lock()
	switch stage {
	case "quiet":
		if !w.quiet {
			w.quiet = true
			close(w.ch)
		}
	case "busy":
		if w.quiet {
			w.quiet = false
			w.ch = make(chan struct{})
		}
	case "async-commit":
		w.async = append(w.async, x.Xid)
	case "before-commit":
		ch := w.ch
		w.mu.Unlock()
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.mu.Unlock()
	return nil
}

// takeAsync returns the transactions committed with synchronous_commit off since the last call.
func (w *quietWatch) takeAsync() []uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	xs := w.async
	w.async = nil
	return xs
}

// syncSourceModes runs body for each mode and major version, with a source of its own whose
// synchronous_standby_names names the applier (syncName) while body runs, and cfg the applier's
// configuration (slot named after prefix and the mode).
func syncSourceModes(t *testing.T, prefix string, body func(t *testing.T, ctx context.Context, e *env, cfg Config)) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			// The source is a server of its own: synchronous_standby_names applies to every
			// commit on the server, the target's too.
			src, err := pgtest.Start(ctx, pgtest.Shared(t, major).Install(), pgtest.Options{Settings: map[string]string{
				"logical_decoding_work_mem": "64kB",
			}})
			must(t, err)
			t.Cleanup(func() { _ = src.Stop() })
			dst := pgtest.Shared(t, major)
			for _, mode := range []Mode{Buffered, Eager, Parallel} {
				t.Run(mode.String(), func(t *testing.T) {
					srcDB, dstDB := pgtest.NewDatabase(t, src), pgtest.NewDatabase(t, dst)
					e := &env{srv: src, src: src.ConnString(srcDB), dst: dst.ConnString(dstDB), repl: src.ReplicationConnString(srcDB), slot: prefix + "_" + mode.String()}
					must(t, pgtest.Exec(ctx, e.src, append(append([]string{}, schema...),
						`CREATE PUBLICATION pub FOR ALL TABLES`,
						`SELECT pg_create_logical_replication_slot('`+e.slot+`', 'pgoutput')`)...))
					must(t, pgtest.Exec(ctx, e.dst, schema...))
					cfg := e.config(t, mode)
					cfg.Source.ConnString += " application_name=" + syncName
					// Commits wait for the applier only while it runs: setting up and cleaning up
					// (CREATE and DROP DATABASE) do not.
					must(t, pgtest.Exec(ctx, src.ConnString("postgres"), `ALTER SYSTEM SET synchronous_standby_names = '`+syncName+`'`, `SELECT pg_reload_conf()`))
					t.Cleanup(func() {
						must(t, pgtest.Exec(context.Background(), src.ConnString("postgres"), `ALTER SYSTEM RESET synchronous_standby_names`, `SELECT pg_reload_conf()`))
					})
					body(t, ctx, e, cfg)
				})
			}
		})
	}
}

// waitSync waits until the source counts the applier as its synchronous standby: from then on
// every commit waits for it.
func waitSync(t *testing.T, ctx context.Context, dsn string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer conn.Close(context.Background())
	for {
		var n int
		must(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND sync_state = 'sync'`, syncName).Scan(&n))
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the applier never became the source's synchronous standby: %v", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
