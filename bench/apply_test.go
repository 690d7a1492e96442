package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// The live apply benchmarks replicate into a second PostgreSQL server, PostgreSQL's own
// subscriber and `pgreorder apply` one at a time against the same server pair. They take
// minutes, so they run only when asked:
//
//	PGREORDER_BENCH_APPLY=1 go test -run '^$' -bench Apply -benchtime 1x -timeout 60m ./bench/
//
// Sizes (PGREORDER_BENCH_FULL=1 selects the larger value of each):
//
//	PGREORDER_BENCH_APPLY_ROWS   rows of the synchronous bulk insert (100000; 5000000, the published size)
//	PGREORDER_BENCH_APPLY_SCALE  pgbench scale of the catch-up tables (10; 100)
//	PGREORDER_BENCH_APPLY_TXNS   transactions per client in the catch-up backlog (250; 10000)
//
// Both servers run with PostgreSQL's durability settings, fsync and full_page_writes on (pgtest's
// servers have them off); PGREORDER_BENCH_APPLY_FSYNC=0 turns them off, for quicker runs while
// developing and for comparisons with figures measured so. Subscribers keep the settings
// PostgreSQL's subscription uses: their commits with synchronous_commit off, acknowledged once
// flushed. PGREORDER_BENCH_APPLY_CPUPROFILE=DIR writes the CPU profile of each pgreorder
// catch-up, and of each run of ApplySync (-cpuprofile), into DIR.
// PGREORDER_BENCH_APPLY_BASELINE=PATH adds to the catch-up the contender pgreorder-buffered-baseline: `PATH apply -mode buffered`, another build of
// pgreorder (an earlier commit, say), measured in the same run as this one; and to ApplySync
// pgreorder-eager-baseline and pgreorder-buffered-baseline, the same build's two modes.
//
// PGREORDER_BENCH_APPLY_TCP=1 connects the subscribers (ours, the native subscription and
// pg_recvlogical) to the publisher over TCP to 127.0.0.1 instead of its Unix socket.
//
// PGREORDER_BENCH_APPLY_WORKERS=N[,N...] sets the worker counts of the catch-up's parallel
// contenders, pgreorder-parallel-N and pgreorder-parallel-N-relaxed (4 when unset).
// PGREORDER_BENCH_BIN=PATH starts that pgreorder binary instead of building ./cmd/pgreorder, so
// that a test binary (go test -c) runs the benchmarks where there is no go command.
//
// PGREORDER_BENCH_APPLY_RUNS=N repeats each case N times (1 by default): in ApplySync as N
// rounds of every subscriber in turn, reporting the median; in ApplyCatchup as N runs of each
// subscriber, reporting the mean of the middle runs (the highest and lowest tenth left out, as
// PostgreSQL's authors took the middle 8 of 10). Every run is logged. Prefer it to
// -benchtime Nx, with which the testing package makes one more run first, to choose N, and
// throws its figure away.
const (
	envApply      = "PGREORDER_BENCH_APPLY"
	envApplyRows  = "PGREORDER_BENCH_APPLY_ROWS"
	envApplyScale = "PGREORDER_BENCH_APPLY_SCALE"
	envApplyTxns  = "PGREORDER_BENCH_APPLY_TXNS"
	envApplyRuns  = "PGREORDER_BENCH_APPLY_RUNS"
	envApplyFsync = "PGREORDER_BENCH_APPLY_FSYNC"
	envApplyBase  = "PGREORDER_BENCH_APPLY_BASELINE"
	envApplyTCP   = "PGREORDER_BENCH_APPLY_TCP"

	envApplyWorkers = "PGREORDER_BENCH_APPLY_WORKERS"

	envApplyProfile = "PGREORDER_BENCH_APPLY_CPUPROFILE"
	// envApplyMemProfile, set with envApplyProfile, adds each applier's allocations profile
	// (-memprofile, which builds older than it lack: so not by default).
	envApplyMemProfile = "PGREORDER_BENCH_APPLY_MEMPROFILE"
	envApplyRollback   = "PGREORDER_BENCH_APPLY_ROLLBACK"
	// envApplyWalsenderPerf=1 attaches perf record to the source's walsender during each catch-up
	// (and each run of ApplySync) and logs the top of its report: a diagnosis (perf runs on the same cores), not a figure.
	envApplyWalsenderPerf = "PGREORDER_BENCH_APPLY_WALSENDER_PERF"
	// envApplyTargetPerf=1 records every CPU with perf during each catch-up and logs the top of
	// the report of the subscriber server's processes (the target's backends, or PostgreSQL's
	// apply workers) alive at its end: a diagnosis, not a figure.
	envApplyTargetPerf = "PGREORDER_BENCH_APPLY_TARGET_PERF"
)

// tpcbClients is the number of concurrent sessions making the catch-up backlog.
const tpcbClients = 32

// syncContenders are the subscribers of BenchmarkApplySync, in the order they run in each case.
// Eager with -synchronous-commit is the latency its durable default is measured against.
var syncContenders = []contender{
	native{streaming: "parallel"},
	native{streaming: "on"},
	pgreorderApply{mode: "eager"},
	pgreorderApply{mode: "eager", extra: []string{"-synchronous-commit"}, label: "pgreorder-eager-synccommit"},
	pgreorderApply{mode: "buffered"},
}

// syncSubscribers are syncContenders, and with PGREORDER_BENCH_APPLY_BASELINE also the baseline
// build's eager and buffered modes, in the same rounds.
func syncSubscribers() []contender {
	bin := os.Getenv(envApplyBase)
	if bin == "" {
		return syncContenders
	}
	return append(slices.Clone(syncContenders),
		pgreorderApply{mode: "eager", binary: bin, label: "pgreorder-eager-baseline"},
		pgreorderApply{mode: "buffered", binary: bin, label: "pgreorder-buffered-baseline"})
}

// syncRatios are reported on the line of num, when den ran in the same case: num's median
// time / den's.
var syncRatios = []struct{ num, den, unit string }{
	{"native-parallel", "native-on", "parallel/on"}, // PostgreSQL's own before/after
	{"pgreorder-eager", "native-parallel", "eager/native-parallel"},
	{"pgreorder-eager", "pgreorder-buffered", "eager/buffered"},
	{"pgreorder-eager", "pgreorder-eager-synccommit", "eager/synccommit"}, // the durable default's cost
}

// catchupContenders are the subscribers of BenchmarkApplyCatchup: the limit first and the
// native worker second, the two our times are compared with.
func catchupContenders(b testing.TB) []contender {
	cs := []contender{
		recvLogical{},
		native{streaming: "best", label: nativeName}, // parallel on 16+, on before; one apply worker (no transaction of the backlog streams)
		pgreorderApply{mode: "buffered"},
		pgreorderApply{mode: "eager"},
	}
	for _, n := range applyWorkers(b) {
		cs = append(cs, pgreorderApply{mode: "parallel", workers: n},
			pgreorderApply{mode: "parallel", workers: n, extra: []string{"-commit-order", "relaxed"},
				label: fmt.Sprintf("pgreorder-parallel-%d-relaxed", n)})
	}
	return cs
}

// applyWorkers returns PGREORDER_BENCH_APPLY_WORKERS's worker counts (a comma-separated list;
// 4 when unset): the catch-up runs parallel and relaxed parallel with each.
func applyWorkers(b testing.TB) []int {
	b.Helper()
	v := os.Getenv(envApplyWorkers)
	if v == "" {
		return []int{4}
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || slices.Contains(out, n) {
			b.Fatalf("%s=%q: want distinct positive worker counts separated by commas, as 4,8", envApplyWorkers, v)
		}
		out = append(out, n)
	}
	return out
}

// limitName and nativeName are the contenders the catch-up's ratios divide by.
const limitName, nativeName = "limit", "native"

// prober is a contender that can tell, before a run, that the pair cannot run it.
type prober interface{ probe(p *pair) error }

// readsOnlyContender applies nothing (the limit).
type readsOnlyContender interface{ readsOnly() }

// catchupSubscribers are catchupContenders, and with PGREORDER_BENCH_APPLY_BASELINE the
// baseline build's buffered mode and parallel modes (commit order kept), each right after ours:
// pgreorder-buffered-baseline, pgreorder-parallel-N-baseline.
func catchupSubscribers(b testing.TB) []contender {
	cs := catchupContenders(b)
	bin := os.Getenv(envApplyBase)
	if bin == "" {
		return cs
	}
	var out []contender
	for _, c := range cs {
		out = append(out, c)
		o, ok := c.(pgreorderApply)
		if !ok || len(o.extra) > 0 || (o.mode != "buffered" && o.mode != "parallel") {
			continue
		}
		o.binary, o.label = bin, o.name()+"-baseline"
		out = append(out, o)
	}
	return out
}

// BenchmarkApplySync reproduces the measurement of PostgreSQL 16's parallel apply of streamed
// transactions: under synchronous logical replication (the publisher's
// synchronous_standby_names names the subscriber, so COMMIT returns once the subscriber
// reported a flush position at or past it), the publisher's SQL time of one transaction
// inserting N rows into test(c int) (with PGREORDER_BENCH_APPLY_ROLLBACK=1 also the cases
// where the last 10, 20, 30 or 50% are rolled back to a savepoint), at the publisher's
// logical_decoding_work_mem 64kB, 256kB and 64MB.
//
// Subscribers: a subscription with streaming = parallel (16+: applied by a parallel worker as
// it arrives) and on (the subscriber spools to a file and applies at commit), and `pgreorder
// apply -mode eager` and `-mode buffered` with -work-mem equal to the publisher's setting. Each
// run starts from empty tables and a new slot, connects the subscriber, waits until it is the
// synchronous standby, and times the transaction from BEGIN to the return of COMMIT; then
// checks the subscriber holds exactly the rows kept. A case makes PGREORDER_BENCH_APPLY_RUNS
// rounds, each running every subscriber once in turn, and reports each one's median. Metrics:
// sql-ms (publisher SQL time), the CPU time each process spent during the transaction
// (backend-cpu-ms, walsender-cpu-ms, target-cpu-ms, applier-cpu-ms, sub-cpu-ms: medians; see
// syncCPU), the slot's pub-spill-bytes, pub-stream-bytes and pub-streams
// (pg_stat_replication_slots, last round), and the syncRatios. Every subscriber of a case runs
// whichever of them -bench selects: the rounds alternate between all of them.
func BenchmarkApplySync(b *testing.B) {
	requireApply(b)
	rows := envSize(b, envApplyRows, 5_000_000, 100_000)
	rounds := int(envSize(b, envApplyRuns, 1, 1))
	pcts := []int{0}
	if os.Getenv(envApplyRollback) == "1" {
		pcts = []int{0, 10, 20, 30, 50}
	}
	for _, in := range applyInstalls(b) {
		b.Run(fmt.Sprintf("pg=%d", in.Major), func(b *testing.B) {
			p := newPair(b, in, syncSettings(), setupSync)
			defer p.close()
			for _, wm := range workMems {
				for _, pct := range pcts {
					b.Run(fmt.Sprintf("rows=%s/workmem=%s/rollback=%d%%", rowsName(rows), wm.name, pct), func(b *testing.B) {
						p := p.get(b)
						// Rounds: every contender once per round, in turn, so that a slow spell of the
						// machine falls on all of them.
						runs := map[string][]syncRun{}
						contenders := syncSubscribers()
						for round := range rounds {
							for _, c := range contenders {
								if c.supports(in.Major) != nil {
									continue
								}
								r, err := syncRunOnce(p, c, rows, wm.name, pct)
								if err != nil {
									b.Fatalf("%s: %v", c.name(), err)
								}
								b.Logf("round %d, %s: %v, publisher spilled %d B, streamed %d B in %d blocks, %v", round+1, c.name(),
									r.d.Round(time.Millisecond), r.st.spillBytes, r.st.streamBytes, r.st.streamCount, r.cpu)
								if r.walsenderPerf != "" {
									b.Logf("the walsender's perf report (self time by symbol):\n%s", r.walsenderPerf)
								}
								runs[c.name()] = append(runs[c.name()], r)
							}
						}
						times := map[string]float64{}
						for name, rs := range runs {
							times[name] = medianOf(syncMillis(rs))
						}
						for _, c := range contenders {
							b.Run("sub="+c.name(), func(b *testing.B) {
								if err := c.supports(in.Major); err != nil {
									b.Skip(err)
								}
								ms := reportSync(b, runs[c.name()])
								for _, r := range syncRatios {
									if r.num == c.name() && times[r.den] > 0 {
										b.ReportMetric(ms/times[r.den], r.unit)
									}
								}
							})
						}
					})
				}
			}
		})
	}
}

// syncSettings are the publisher's settings of the synchronous benchmark.
func syncSettings() map[string]string {
	return map[string]string{
		"synchronous_standby_names": appName,
		"logical_decoding_work_mem": "64kB", // set per case
	}
}

// setupSync creates test(c int) on both servers and publishes it.
func setupSync(ctx context.Context, p *pair) error {
	if err := pgtest.Exec(ctx, p.pubAdmin(benchDB), "CREATE TABLE test (c int)", "CREATE PUBLICATION pub FOR TABLE test"); err != nil {
		return err
	}
	return pgtest.Exec(ctx, p.sub.ConnString(benchDB), "CREATE TABLE test (c int)")
}

// syncSQL is the timed transaction: rows inserted, of which all but kept rolled back to a
// savepoint when kept < rows.
func syncSQL(rows, kept int64) string {
	if kept == rows {
		return fmt.Sprintf("BEGIN; INSERT INTO test SELECT generate_series(1, %d); COMMIT", rows)
	}
	return fmt.Sprintf("BEGIN; INSERT INTO test SELECT generate_series(1, %d); SAVEPOINT s1; "+
		"INSERT INTO test SELECT generate_series(%d, %d); ROLLBACK TO SAVEPOINT s1; COMMIT", kept, kept+1, rows)
}

// syncRun is one run of the synchronous benchmark: the publisher's SQL time, the slot's
// statistics and the CPU time each process spent while the transaction ran.
type syncRun struct {
	d             time.Duration
	st            slotStats
	cpu           syncCPU
	walsenderPerf string // the top of the walsender's perf report (PGREORDER_BENCH_APPLY_WALSENDER_PERF)
}

// syncCPU is the CPU time spent from the transaction's start to its COMMIT's return: the
// publisher's backend running it and the walsender streaming it (to the nanosecond), the
// subscriber server (all its processes: the target's backends, or PostgreSQL's apply workers)
// and our applier process (zero for a native subscriber, which runs inside the subscriber
// server), in clock ticks.
type syncCPU struct{ backend, walsender, target, applier time.Duration }

func (c syncCPU) String() string {
	return fmt.Sprintf("CPU backend %v walsender %v target %v applier %v",
		c.backend.Round(time.Millisecond), c.walsender.Round(time.Millisecond),
		c.target.Round(time.Millisecond), c.applier.Round(time.Millisecond))
}

// syncRunOnce makes one run of a case with contender c.
func syncRunOnce(p *pair, c contender, rows int64, workMem string, pct int) (syncRun, error) {
	kept := rows * int64(100-pct) / 100
	return syncOnce(p, c, workMem, syncSQL(rows, kept), kept)
}

// reportSync reports a contender's runs of one case: the median SQL time (sql-ms), the median
// CPU time of each process while it ran (backend-cpu-ms, walsender-cpu-ms, target-cpu-ms,
// applier-cpu-ms, and sub-cpu-ms: target and applier) and the last run's slot statistics; it
// returns the median SQL time.
func reportSync(b *testing.B, runs []syncRun) float64 {
	t := medianOf(syncMillis(runs))
	b.ReportMetric(0, "ns/op") // setup included: meaningless
	b.ReportMetric(t, "sql-ms")
	for _, m := range []struct {
		unit string
		of   func(syncCPU) time.Duration
	}{
		{"backend-cpu-ms", func(c syncCPU) time.Duration { return c.backend }},
		{"walsender-cpu-ms", func(c syncCPU) time.Duration { return c.walsender }},
		{"target-cpu-ms", func(c syncCPU) time.Duration { return c.target }},
		{"applier-cpu-ms", func(c syncCPU) time.Duration { return c.applier }},
		{"sub-cpu-ms", func(c syncCPU) time.Duration { return c.target + c.applier }},
	} {
		ms := make([]float64, len(runs))
		for i, r := range runs {
			ms[i] = float64(m.of(r.cpu).Microseconds()) / 1000
		}
		b.ReportMetric(medianOf(ms), m.unit)
	}
	if len(runs) > 0 {
		st := runs[len(runs)-1].st
		b.ReportMetric(float64(st.spillBytes), "pub-spill-bytes")
		b.ReportMetric(float64(st.streamBytes), "pub-stream-bytes")
		b.ReportMetric(float64(st.streamCount), "pub-streams")
	}
	return t
}

// syncMillis are the runs' SQL times in milliseconds.
func syncMillis(runs []syncRun) []float64 {
	ms := make([]float64, len(runs))
	for i, r := range runs {
		ms[i] = float64(r.d.Microseconds()) / 1000
	}
	return ms
}

// medianOf is the middle value of xs (the mean of the two middle ones for an even count), 0 for
// none.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// syncProfiles numbers the CPU profiles of BenchmarkApplySync's runs (envApplyProfile): one per
// run of each of our contenders. The runs are made one at a time.
var syncProfiles int

// syncOnce makes one run: reset, start the contender, time the transaction, check, stop.
func syncOnce(p *pair, c contender, workMem, sql string, kept int64) (run syncRun, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+time.Duration(kept)*time.Millisecond)
	defer cancel()
	if err := dropLeftovers(ctx, p); err != nil {
		return run, err
	}
	if err := pgtest.Exec(ctx, p.pubAdmin(benchDB), "TRUNCATE test", "CHECKPOINT"); err != nil {
		return run, err
	}
	if err := pgtest.Exec(ctx, p.sub.ConnString(benchDB), "TRUNCATE test", "CHECKPOINT"); err != nil {
		return run, err
	}
	if err := setPublisherSetting(ctx, p, "logical_decoding_work_mem", workMem); err != nil {
		return run, err
	}
	r := p.newRun(workMem)
	if dir := os.Getenv(envApplyProfile); dir != "" {
		if _, ok := c.(pgreorderApply); ok {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return run, err
			}
			syncProfiles++
			r.cpuProfile = filepath.Join(dir, fmt.Sprintf("sync-%s-%s-%03d.pprof", workMem, c.name(), syncProfiles))
		}
	}
	defer func() {
		if derr := c.drop(context.WithoutCancel(ctx), r); derr != nil && err == nil {
			err = fmt.Errorf("dropping: %w", derr)
		}
	}()
	a, err := c.start(ctx, r)
	if err != nil {
		return run, err
	}
	stopped := false
	defer func() {
		if !stopped {
			a.stop(context.WithoutCancel(ctx))
		}
	}()
	if err := waitConnected(ctx, r, a, true); err != nil {
		return run, err
	}
	conn, err := pgconn.Connect(ctx, p.pub.ConnString(benchDB)+" options='-c synchronous_commit=on'")
	if err != nil {
		return run, err
	}
	defer conn.Close(context.Background())
	v, err := connRow(ctx, conn, "SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = "+quoteLiteral(r.slot))
	if err != nil {
		return run, err
	}
	walsender, _ := strconv.Atoi(v[0])
	if walsender == 0 {
		return run, fmt.Errorf("slot %s has no walsender", r.slot)
	}
	var perf *perfRecorder
	if os.Getenv(envApplyWalsenderPerf) == "1" {
		if perf, err = startPerf(walsender, filepath.Join(p.tmp, r.slot+"-walsender.perf")); err != nil {
			return run, err
		}
		defer func() {
			if perf != nil {
				perf.stop(0)
			}
		}()
	}
	cpu0, err := syncCPUNow(p, a, int(conn.PID()), walsender)
	if err != nil {
		return run, err
	}
	t0 := time.Now()
	err = execWatching(ctx, conn, sql, a)
	run.d = time.Since(t0)
	if err != nil {
		return run, err
	}
	if perf != nil {
		if run.walsenderPerf, err = perf.stop(25); err != nil {
			return run, err
		}
		perf = nil
	}
	cpu1, err := syncCPUNow(p, a, int(conn.PID()), walsender)
	if err != nil {
		return run, err
	}
	run.cpu = syncCPU{cpu1.backend - cpu0.backend, cpu1.walsender - cpu0.walsender, cpu1.target - cpu0.target, cpu1.applier - cpu0.applier}
	got, err := queryRow(ctx, p.sub.ConnString(benchDB), "SELECT count(*), coalesce(sum(c::bigint), 0) FROM test")
	if err != nil {
		return run, err
	}
	if want := []string{strconv.FormatInt(kept, 10), strconv.FormatInt(kept*(kept+1)/2, 10)}; !slices.Equal(got, want) {
		return run, fmt.Errorf("when COMMIT returned, the subscriber had count, sum = %v, want %v", got, want)
	}
	stopped = true
	if err := a.stop(ctx); err != nil {
		return run, err
	}
	if err := waitSlotInactive(ctx, r); err != nil {
		return run, err
	}
	run.st, err = readSlotStats(ctx, p, r.slot)
	return run, err
}

// syncCPUNow reads the CPU time each process of a synchronous run has used so far: the
// publisher's backend, the walsender, the subscriber server and the applier a.
func syncCPUNow(p *pair, a applying, backend, walsender int) (c syncCPU, err error) {
	if c.backend, err = pgtest.RunTime(backend); err != nil {
		return c, fmt.Errorf("the publisher's backend's CPU time: %w", err)
	}
	if c.walsender, err = pgtest.RunTime(walsender); err != nil {
		return c, fmt.Errorf("the walsender's CPU time: %w", err)
	}
	if c.target, err = serverCPU(p.subPostmaster); err != nil {
		return c, fmt.Errorf("the subscriber's CPU time: %w", err)
	}
	if ct, ok := a.(cpuTimer); ok {
		if c.applier, err = ct.cpu(); err != nil {
			return c, fmt.Errorf("the applier's CPU time: %w", err)
		}
	}
	return c, nil
}

// execWatching runs sql on conn, and cancels it if the contender stops applying meanwhile (the
// COMMIT would otherwise wait for it forever).
func execWatching(ctx context.Context, conn *pgconn.PgConn, sql string, a applying) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, sql).ReadAll()
		done <- err
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if err := a.failed(ctx); err != nil {
				cancel()
				<-done
				return fmt.Errorf("while the publisher waited for it: %w", err)
			}
		}
	}
}

// BenchmarkApplyCatchup reproduces the measurement of the proposed parallel apply of
// independent transactions: the time a subscriber takes to catch up with a backlog of
// transactions made by 32 concurrent clients while it was stopped, for four workloads
// (catchupLoads: pgbench's, with hot rows; pgbench's simple-update and spread, without;
// identity-full, a table replicated by its whole old row).
//
// Each run resets the tables on both servers, starts the contender (creating its slot) and
// stops it once connected, makes the backlog (txns per client, then one marker transaction),
// starts the contender again and polls every 20ms until the slot's confirmed_flush_lsn passes
// the marker's change (catchup-s; the subscriber has applied and acknowledged the whole
// backlog) and until the marker row is visible on the subscriber (visible-s); then checks that
// both servers hold the same rows. Subscribers: the limit (pg_recvlogical reading the backlog
// into /dev/null, applying nothing), PostgreSQL's apply worker, and `pgreorder apply -mode
// buffered`, `-mode eager`, `-mode parallel -workers 4` (PGREORDER_BENCH_APPLY_WORKERS), and the
// same with `-commit-order relaxed` (skipped when the binary has no such flag).
//
// Metrics: catchup-s, visible-s, apply-txn/s (backlog transactions / catchup-s), x-limit and
// x-native (catchup-s / the limit's, / the native worker's, of the same case), cpu-ms/txn (CPU
// time of the subscriber server, all its processes, and of the applier process, from the start
// to the catch-up, per backlog transaction; target-cpu-ms/txn and applier-cpu-ms/txn are its
// two parts; walsender-cpu-ms/txn, apart, is the source's walsender's for the same span) and
// cpu-x-native, speedup-vs-native (native / ours), applier-rss-MB (the peak
// resident set of the subscriber's own process, ours and the limit's, from its start to the
// catch-up: VmHWM), and the backlog's backlog-s, backlog-txn/s and backlog-wal-MB. With PGREORDER_BENCH_APPLY_CPUPROFILE=DIR, each pgreorder
// catch-up writes its applier's CPU profile to DIR/pgNN-LOAD-SUB.pprof, and with
// PGREORDER_BENCH_APPLY_MEMPROFILE=1 its allocations profile to DIR/pgNN-LOAD-SUB.allocs.pprof.
func BenchmarkApplyCatchup(b *testing.B) {
	requireApply(b)
	scale := int(envSize(b, envApplyScale, 100, 10))
	txns := int(envSize(b, envApplyTxns, 10_000, 250))
	for _, in := range applyInstalls(b) {
		b.Run(fmt.Sprintf("pg=%d", in.Major), func(b *testing.B) {
			for _, load := range catchupLoads(scale, tpcbClients, txns) {
				clients, txns := load.size()
				b.Run(fmt.Sprintf("%s/clients=%d/txns=%d", load.name(), clients, txns), func(b *testing.B) {
					p := newPair(b, in, map[string]string{"logical_decoding_work_mem": "64MB"}, load.setup)
					defer p.close()
					results := map[string]catchupFigures{}
					for _, c := range catchupSubscribers(b) {
						b.Run("sub="+c.name(), func(b *testing.B) {
							if err := c.supports(in.Major); err != nil {
								b.Skip(err)
							}
							p := p.get(b)
							if pr, ok := c.(prober); ok {
								if err := pr.probe(p); err != nil {
									b.Skip(err)
								}
							}
							profile := ""
							if dir := os.Getenv(envApplyProfile); dir != "" {
								if _, ok := c.(pgreorderApply); ok {
									if err := os.MkdirAll(dir, 0o755); err != nil {
										b.Fatal(err)
									}
									profile = filepath.Join(dir, fmt.Sprintf("pg%d-%s-%s.pprof", in.Major, strings.TrimPrefix(load.name(), "load="), c.name()))
								}
							}
							f := benchCatchup(b, p, c, load, profile)
							results[c.name()] = f
							if lim := results[limitName]; c.name() != limitName && lim.catchup > 0 {
								b.ReportMetric(f.catchup/lim.catchup, "x-limit")
							}
							if nat := results[nativeName]; c.name() != nativeName && nat.catchup > 0 {
								b.ReportMetric(f.catchup/nat.catchup, "x-native")
								b.ReportMetric(nat.catchup/f.catchup, "speedup-vs-native")
								if nat.cpu > 0 {
									b.ReportMetric(f.cpu/nat.cpu, "cpu-x-native")
								}
							}
						})
					}
				})
			}
		})
	}
}

// catchupResult is one catch-up run.
type catchupResult struct {
	catchup, visible, backlog time.Duration
	targetCPU, applierCPU     time.Duration // from the start to the catch-up
	walsenderCPU              time.Duration // the source's walsender, from its start to the catch-up (0: not read)
	walsenderPerf             string        // the top of its perf report (PGREORDER_BENCH_APPLY_WALSENDER_PERF)
	targetPerf                string        // the top of the subscriber server's (PGREORDER_BENCH_APPLY_TARGET_PERF)
	applierRSS                int64         // the applier's peak resident set, bytes (0: not a process of ours)
	walBytes                  int64
	stats                     slotStats
}

// catchupFigures are a contender's reported catch-up time (s) and CPU per transaction (ms).
type catchupFigures struct{ catchup, cpu float64 }

func benchCatchup(b *testing.B, p *pair, c contender, load catchupLoad, profile string) catchupFigures {
	var catchup, visible, backlog, walMB, targetCPU, applierCPU, walsenderCPU []float64
	var rss int64
	for i := range b.N * int(envSize(b, envApplyRuns, 1, 1)) {
		load = load.withSeed(seed + uint64(i))
		prof := profile
		if i > 0 {
			prof = "" // the first run's
		}
		res, err := catchupOnce(p, c, load, prof)
		if err != nil {
			b.Fatalf("%s: %v", c.name(), err)
		}
		b.Logf("run %d (seed %d): backlog %v (%.1f MB of WAL), caught up in %v, marker visible after %v, CPU target %v applier %v walsender %v",
			i+1, seed+uint64(i), res.backlog.Round(time.Millisecond), float64(res.walBytes)/1e6, res.catchup.Round(time.Millisecond),
			res.visible.Round(time.Millisecond), res.targetCPU, res.applierCPU, res.walsenderCPU)
		if res.targetPerf != "" {
			b.Logf("run %d, the subscriber server's perf report (self time by symbol):\n%s", i+1, res.targetPerf)
		}
		if res.walsenderPerf != "" {
			b.Logf("run %d, the walsender's perf report (self time by symbol):\n%s", i+1, res.walsenderPerf)
		}
		catchup = append(catchup, res.catchup.Seconds())
		visible = append(visible, res.visible.Seconds())
		backlog = append(backlog, res.backlog.Seconds())
		walMB = append(walMB, float64(res.walBytes)/1e6)
		targetCPU = append(targetCPU, res.targetCPU.Seconds())
		applierCPU = append(applierCPU, res.applierCPU.Seconds())
		walsenderCPU = append(walsenderCPU, res.walsenderCPU.Seconds())
		rss = max(rss, res.applierRSS)
	}
	if profile != "" {
		b.Logf("applier CPU profile: %s", profile)
	}
	clients, txns := load.size()
	n := float64(clients*txns + 1)
	t := middleMean(catchup)
	tc, ac := middleMean(targetCPU)*1000/n, middleMean(applierCPU)*1000/n
	b.ReportMetric(0, "ns/op") // setup and backlog included: meaningless
	b.ReportMetric(t, "catchup-s")
	if _, ok := c.(readsOnlyContender); !ok {
		b.ReportMetric(middleMean(visible), "visible-s")
	}
	b.ReportMetric(n/t, "apply-txn/s")
	b.ReportMetric(tc+ac, "cpu-ms/txn")
	b.ReportMetric(tc, "target-cpu-ms/txn")
	b.ReportMetric(ac, "applier-cpu-ms/txn")
	if ws := middleMean(walsenderCPU) * 1000 / n; ws > 0 {
		b.ReportMetric(ws, "walsender-cpu-ms/txn") // the source's: not in cpu-ms/txn
	}
	if rss > 0 {
		b.ReportMetric(float64(rss)/(1<<20), "applier-rss-MB")
	}
	b.ReportMetric(middleMean(backlog), "backlog-s")
	b.ReportMetric(n/middleMean(backlog), "backlog-txn/s")
	b.ReportMetric(middleMean(walMB), "backlog-wal-MB")
	return catchupFigures{catchup: t, cpu: tc + ac}
}

// cpuTimer is a started contender whose own process's CPU time can be read.
type cpuTimer interface{ cpu() (time.Duration, error) }

// rssReader is a started contender whose own process's peak resident set can be read.
type rssReader interface{ peakRSS() (int64, error) }

func catchupOnce(p *pair, c contender, load catchupLoad, profile string) (res catchupResult, err error) {
	clients, txns := load.size()
	n := time.Duration(clients * txns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+n*10*time.Millisecond)
	defer cancel()
	_, readsOnly := c.(readsOnlyContender)
	pubAdmin, sub := p.pubAdmin(benchDB), p.sub.ConnString(benchDB)
	if err := dropLeftovers(ctx, p); err != nil {
		return res, err
	}
	if err := pgtest.Exec(ctx, pubAdmin, load.reset()...); err != nil {
		return res, err
	}
	if err := pgtest.Exec(ctx, sub, load.reset()...); err != nil {
		return res, err
	}
	r := p.newRun("64MB")
	defer func() {
		if derr := c.drop(context.WithoutCancel(ctx), r); derr != nil && err == nil {
			err = fmt.Errorf("dropping: %w", derr)
		}
	}()
	// Start once, so that the slot exists, and stop: the backlog accumulates in the slot.
	a, err := c.start(ctx, r)
	if err != nil {
		return res, err
	}
	if err := waitConnected(ctx, r, a, false); err != nil {
		a.stop(context.WithoutCancel(ctx))
		return res, err
	}
	if err := a.stop(ctx); err != nil {
		return res, err
	}
	if err := waitSlotInactive(ctx, r); err != nil {
		return res, err
	}
	walStart, err := queryRow(ctx, pubAdmin, "SELECT pg_current_wal_lsn()")
	if err != nil {
		return res, err
	}
	if res.backlog, err = load.run(ctx, pubAdmin); err != nil {
		return res, fmt.Errorf("making the backlog: %w", err)
	}
	target, err := markEnd(ctx, pubAdmin)
	if err != nil {
		return res, err
	}
	wal, err := queryRow(ctx, pubAdmin, fmt.Sprintf("SELECT pg_current_wal_lsn(), pg_wal_lsn_diff(pg_current_wal_lsn(), '%s')::bigint", walStart[0]))
	if err != nil {
		return res, err
	}
	r.endpos = wal[0]
	res.walBytes, _ = strconv.ParseInt(wal[1], 10, 64)
	r.cpuProfile = profile

	pubConn, err := pgconn.Connect(ctx, pubAdmin)
	if err != nil {
		return res, err
	}
	defer pubConn.Close(context.Background())
	subConn, err := pgconn.Connect(ctx, sub)
	if err != nil {
		return res, err
	}
	defer subConn.Close(context.Background())
	// Whether the slot confirmed the marker, and the pid of the walsender streaming it.
	flushedSQL := fmt.Sprintf("SELECT confirmed_flush_lsn >= '%s', coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = %s",
		target, quoteLiteral(r.slot))

	cpu0, err := serverCPU(p.subPostmaster)
	if err != nil {
		return res, fmt.Errorf("the subscriber's CPU time: %w", err)
	}
	var targetPerf *perfRecorder
	if os.Getenv(envApplyTargetPerf) == "1" {
		if targetPerf, err = startPerf(0, filepath.Join(p.tmp, r.slot+"-target.perf")); err != nil {
			return res, err
		}
		defer func() {
			if targetPerf != nil {
				targetPerf.stop(0)
			}
		}()
	}
	t0 := time.Now()
	a, err = c.start(ctx, r)
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			a.stop(context.WithoutCancel(ctx))
		}
	}()
	if readsOnly {
		res.visible = -1 // nothing to see
	}
	var perf *perfRecorder
	defer func() {
		if perf != nil {
			perf.stop(0)
		}
	}()
	for res.catchup == 0 || res.visible == 0 {
		if res.catchup == 0 {
			v, err := connRow(ctx, pubConn, flushedSQL)
			if err != nil {
				return res, err
			}
			if perf == nil && len(v) == 2 && v[0] != "t" && os.Getenv(envApplyWalsenderPerf) == "1" {
				if pid, _ := strconv.Atoi(v[1]); pid > 0 {
					if perf, err = startPerf(pid, filepath.Join(p.tmp, r.slot+"-walsender.perf")); err != nil {
						return res, err
					}
				}
			}
			if len(v) == 2 && v[0] == "t" {
				res.catchup = time.Since(t0)
				// The walsender started with this run's connection: its CPU time is all this
				// catch-up's decoding and sending. Gone already (the limit exits at its end
				// position), it is not counted.
				if pid, _ := strconv.Atoi(v[1]); pid > 0 {
					if _, self, _, err := procTimes(pid); err == nil {
						res.walsenderCPU = self
					}
				}
				if perf != nil {
					if res.walsenderPerf, err = perf.stop(20); err != nil {
						return res, err
					}
					perf = nil
				}
				cpu1, err := serverCPU(p.subPostmaster)
				if err != nil {
					return res, fmt.Errorf("the subscriber's CPU time: %w", err)
				}
				res.targetCPU = cpu1 - cpu0
				if targetPerf != nil {
					pids, err := children(p.subPostmaster)
					if err != nil {
						return res, err
					}
					if res.targetPerf, err = targetPerf.stop(30, pids...); err != nil {
						return res, err
					}
					targetPerf = nil
				}
				if ct, ok := a.(cpuTimer); ok {
					if res.applierCPU, err = ct.cpu(); err != nil {
						return res, fmt.Errorf("the applier's CPU time: %w", err)
					}
				}
				if rr, ok := a.(rssReader); ok {
					if res.applierRSS, err = rr.peakRSS(); err != nil {
						return res, fmt.Errorf("the applier's peak RSS: %w", err)
					}
				}
			}
		}
		if res.visible == 0 {
			v, err := connRow(ctx, subConn, "SELECT count(*) FROM bench_marker")
			if err != nil {
				return res, err
			}
			if len(v) == 1 && v[0] == "1" {
				res.visible = time.Since(t0)
			}
		}
		if res.catchup != 0 && res.visible != 0 {
			break
		}
		if err := a.failed(ctx); err != nil {
			return res, err
		}
		if d, ok := a.(interface{ done() bool }); ok && d.done() && res.catchup == 0 {
			// Exited at its end position: it has sent its last position.
			if v, err := connRow(ctx, pubConn, flushedSQL); err != nil || len(v) != 2 || v[0] != "t" {
				return res, fmt.Errorf("%s stopped at %s, but the slot's confirmed flush position did not pass %s (%v)", c.name(), r.endpos, target, err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("not caught up after %v: %w", time.Since(t0).Round(time.Second), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if readsOnly {
		res.visible = 0
	} else {
		want, err := connRow(ctx, pubConn, load.fingerprint())
		if err != nil {
			return res, err
		}
		got, err := connRow(ctx, subConn, load.fingerprint())
		if err != nil {
			return res, err
		}
		if !slices.Equal(got, want) {
			return res, fmt.Errorf("caught up, but the subscriber's tables differ from the publisher's:\n got %q\nwant %q", got, want)
		}
	}
	stopped = true
	if err := a.stop(ctx); err != nil {
		return res, err
	}
	if err := waitSlotInactive(ctx, r); err != nil {
		return res, err
	}
	res.stats, err = readSlotStats(ctx, p, r.slot)
	return res, err
}

// requireApply skips b unless PGREORDER_BENCH_APPLY=1.
func requireApply(b testing.TB) {
	b.Helper()
	if os.Getenv(envApply) != "1" {
		b.Skipf("live apply benchmark: takes minutes; set %s=1 to run it", envApply)
	}
}

// applyInstalls returns the oldest and the newest PostgreSQL installed (every one with
// PGREORDER_BENCH_FULL=1; PGREORDER_PG_VERSIONS restricts them).
func applyInstalls(b testing.TB) []pgtest.Install {
	b.Helper()
	installs := pgtest.FindInstalls()
	if len(installs) == 0 {
		pgtest.Unavailable(b, "no PostgreSQL server installed")
	}
	if !*full && len(installs) > 2 {
		installs = []pgtest.Install{installs[0], installs[len(installs)-1]}
	}
	return installs
}

// envSize returns the positive integer in the environment variable name, or fullSize with
// PGREORDER_BENCH_FULL=1, or reduced.
func envSize(b testing.TB, name string, fullSize, reduced int64) int64 {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return size(fullSize, reduced)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// middleMean is the mean of xs without its lowest and highest tenth (the middle 8 of 10 runs);
// with fewer than 10 values, the mean of all.
func middleMean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := len(s) / 10
	s = s[k : len(s)-k]
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return sum / float64(len(s))
}
