package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// BenchmarkConflictDetection measures what conflict detection costs the target: a TPC-B-like
// load runs on the publisher (replicated by apply, Parallel) and another on the target's own
// tables at the same time, for a fixed time, with detection off, on, and on with update_deleted
// retention (tombstones). It reports the target's local TPS, the publisher's, and the apply lag:
// the time the Applier took, once both loads stopped, to apply what was left. It never runs in
// CI:
//
//	PGREORDER_BENCH_CONFLICTS=1 go test -run '^$' -bench ConflictDetection -benchtime 1x -timeout 30m ./bench/
//
// Sizes (PGREORDER_BENCH_FULL=1 selects the larger value of each):
//
//	PGREORDER_BENCH_CONFLICTS_SCALE    pgbench scale on both sides (1; 10)
//	PGREORDER_BENCH_CONFLICTS_CLIENTS  clients on each side (2; 8)
//	PGREORDER_BENCH_CONFLICTS_SECONDS  load duration (10; 60)
func BenchmarkConflictDetection(b *testing.B) {
	if os.Getenv("PGREORDER_BENCH_CONFLICTS") != "1" {
		b.Skip("set PGREORDER_BENCH_CONFLICTS=1 to run (it starts two servers and loads them for minutes)")
	}
	scale := int(envSize(b, "PGREORDER_BENCH_CONFLICTS_SCALE", 10, 1))
	clients := int(envSize(b, "PGREORDER_BENCH_CONFLICTS_CLIENTS", 8, 2))
	secs := envSize(b, "PGREORDER_BENCH_CONFLICTS_SECONDS", 60, 10)
	var in pgtest.Install
	for _, i := range pgtest.FindInstalls() {
		in = i // the newest
	}
	if in.Major == 0 {
		b.Skip("no PostgreSQL installed")
	}
	ctx := context.Background()
	settings := map[string]string{"track_commit_timestamp": "on", "max_wal_size": "4GB", "checkpoint_timeout": "30min"}
	pub, err := pgtest.Start(ctx, in, pgtest.Options{Settings: settings})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Stop()
	sub, err := pgtest.Start(ctx, in, pgtest.Options{Settings: settings})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Stop()
	cases := []struct {
		name string
		cc   conflict.Config
	}{
		{"detection=off", conflict.Config{Off: true}},
		{"detection=on", conflict.Config{}},
		{"detection=on/retention=5s", conflict.Config{Retention: 5 * time.Second}},
	}
	for n, c := range cases {
		b.Run(fmt.Sprintf("pg=%d/scale=%d/clients=%d+%d/%s", in.Major, scale, clients, clients, c.name), func(b *testing.B) {
			for range b.N {
				db := "conflicts" + strconv.Itoa(n)
				r, err := conflictRun(ctx, b, pub, sub, db, scale, clients, time.Duration(secs)*time.Second, c.cc)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.localTPS, "target-local-tps")
				b.ReportMetric(r.pubTPS, "publisher-tps")
				b.ReportMetric(r.catchUp.Seconds(), "catch-up-s")
				b.ReportMetric(float64(r.conflicts), "conflicts")
				b.Logf("%s: target local %.0f tps, publisher %.0f tps, apply caught up %.1fs after the load, %d conflicts, stats %+v",
					c.name, r.localTPS, r.pubTPS, r.catchUp.Seconds(), r.conflicts, r.stats)
			}
		})
	}
}

type conflictResult struct {
	localTPS, pubTPS float64
	catchUp          time.Duration
	conflicts        int64
	stats            apply.Stats
}

// conflictRun loads fresh databases db on both servers, starts the Applier, runs both loads for
// d, and waits for the Applier to apply everything.
func conflictRun(ctx context.Context, b *testing.B, pub, sub *pgtest.Server, db string, scale, clients int, d time.Duration,
	cc conflict.Config) (conflictResult, error) {
	var res conflictResult
	for _, s := range []*pgtest.Server{pub, sub} {
		if err := pgtest.DropDatabase(ctx, s, db); err != nil {
			return res, err
		}
		if err := pgtest.Exec(ctx, s.ConnString("postgres"), "CREATE DATABASE "+db); err != nil {
			return res, err
		}
	}
	if err := pgtest.Exec(ctx, pub.ConnString(db), append(tpcbSchema(scale),
		"CREATE PUBLICATION pub FOR TABLE pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history, bench_marker",
		"SELECT pg_create_logical_replication_slot('"+db+"', 'pgoutput')")...); err != nil {
		return res, err
	}
	// The target: the replicated tables, loaded as an initial copy would be, committed with the
	// Applier's origin (rows of another origin would each be an update_origin_differs on their
	// first update), and its own pgbench tables in schema local.
	origin := "bench_" + db
	replicated := append([]string{"SELECT pg_replication_origin_create('" + origin + "')",
		"SELECT pg_replication_origin_session_setup('" + origin + "')"}, tpcbSchema(scale)...)
	replicated = append(replicated, "SELECT pg_replication_origin_session_reset()")
	local := append([]string{"CREATE SCHEMA local", "SET search_path = local"}, tpcbSchema(scale)...)
	if err := pgtest.Exec(ctx, sub.ConnString(db), append(replicated, local...)...); err != nil {
		return res, err
	}
	cfg := apply.Config{
		Source:    replication.Config{ConnString: pub.ReplicationConnString(db), Slot: db, Publications: []string{"pub"}},
		Target:    sub.ConnString(db),
		Mode:      apply.Parallel,
		Origin:    origin,
		Conflicts: cc,
	}
	a, err := apply.New(cfg)
	if err != nil {
		return res, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() {
		stop()
		<-done
		_ = pgtest.Exec(context.Background(), sub.ConnString(db), "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname LIKE 'bench_"+db+"%'")
	}()
	localDSN := sub.ConnString(db) + " options='-csearch_path=local'"
	var pubTxns, localTxns atomic.Int64
	loadCtx, endLoad := context.WithTimeout(ctx, d)
	defer endLoad()
	var wg sync.WaitGroup
	errs := make(chan error, 2*clients)
	for i := range 2 * clients {
		dsn, count := pub.ConnString(db), &pubTxns
		if i >= clients {
			dsn, count = localDSN, &localTxns
		}
		wg.Go(func() {
			if err := timedTPCB(loadCtx, dsn, scale, uint64(i), count); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	loadEnd := time.Now()
	res.pubTPS = float64(pubTxns.Load()) / d.Seconds()
	res.localTPS = float64(localTxns.Load()) / d.Seconds()
	if err := pgtest.Exec(ctx, pub.ConnString(db), "INSERT INTO bench_marker VALUES (1)"); err != nil {
		return res, err
	}
	for {
		v, err := queryRow(ctx, sub.ConnString(db), "SELECT count(*) FROM public.bench_marker")
		if err != nil {
			return res, err
		}
		if v[0] == "1" {
			break
		}
		select {
		case err := <-done:
			return res, fmt.Errorf("apply stopped: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	res.catchUp = time.Since(loadEnd)
	res.stats = a.Stats()
	for _, ct := range conflict.Types() {
		res.conflicts += res.stats.Conflicts(ct)
	}
	return res, nil
}

// timedTPCB runs TPC-B-like transactions on one connection until ctx is done, counting them.
func timedTPCB(ctx context.Context, dsn string, scale int, seed uint64, n *atomic.Int64) error {
	c, err := pgconn.Connect(context.Background(), dsn)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	l := tpcbLoad{scale: scale}
	rng := rand.New(rand.NewPCG(seed, 42))
	var sql strings.Builder
	for ctx.Err() == nil {
		sql.Reset()
		l.txn(&sql, rng)
		if _, err := c.Exec(context.Background(), sql.String()).ReadAll(); err != nil {
			return err
		}
		n.Add(1)
	}
	return nil
}
