package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// The live apply benchmarks (apply_test.go) replicate from a publisher server into a subscriber
// server, both throwaway servers of the same PostgreSQL install. This file holds the pair and
// the SQL helpers they share.

// appName is the application_name every contender's replication connection uses, and so the
// publisher's synchronous_standby_names in the synchronous benchmark: PostgreSQL's subscriber
// connects with its subscription's name (the subscription is always called appName), ours with
// the application_name of its -source connection string.
const appName = "applybench"

// benchDB is the database the benchmarks use on both servers.
const benchDB = "bench"

// pair is a publisher and a subscriber server. It is started on first use (so that a -bench
// pattern that selects none of its cases starts nothing) and stopped by close.
type pair struct {
	tb       testing.TB // the benchmark or test that owns the pair: logs go there
	install  pgtest.Install
	settings map[string]string // publisher settings besides the common ones
	setup    func(ctx context.Context, p *pair) error

	once     sync.Once
	err      error
	pub, sub *pgtest.Server
	tmp      string // logs of our applier, its binary

	buildOnce sync.Once
	binary    string
	buildErr  error

	runs int // runs made: names each run's slot

	subPostmaster int // the subscriber's postmaster PID: its CPU time is the target's
}

func newPair(tb testing.TB, in pgtest.Install, pubSettings map[string]string, setup func(context.Context, *pair) error) *pair {
	return &pair{tb: tb, install: in, settings: pubSettings, setup: setup}
}

// commonSettings are both servers' settings: room for big transactions without checkpoints in
// the middle of a measurement. pgtest's defaults apply otherwise, with PostgreSQL's durability
// (fsync, full_page_writes) unless PGREORDER_BENCH_APPLY_FSYNC=0: see durable and BENCHMARKS.md.
func commonSettings() map[string]string {
	return map[string]string{
		"shared_buffers":                  "128MB",
		"max_wal_size":                    "4GB",
		"checkpoint_timeout":              "30min",
		"max_worker_processes":            "16",
		"max_logical_replication_workers": "8",
	}
}

// durable says whether both servers keep PostgreSQL's durability settings (fsync and
// full_page_writes on), so that the WAL flushes a subscriber waits for cost what they cost on a
// real server: always, unless PGREORDER_BENCH_APPLY_FSYNC=0 (quicker runs while developing,
// and comparisons with figures measured without them).
func durable() bool { return os.Getenv(envApplyFsync) != "0" }

// get starts the servers and runs the setup on the first call, and fails tb if that failed.
func (p *pair) get(tb testing.TB) *pair {
	tb.Helper()
	p.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		p.tmp, p.err = os.MkdirTemp("", "pgreorder-applybench-")
		if p.err != nil {
			return
		}
		pubSettings := commonSettings()
		for k, v := range p.settings {
			pubSettings[k] = v
		}
		if p.pub, p.err = pgtest.Start(ctx, p.install, pgtest.Options{Settings: pubSettings, Durable: durable()}); p.err != nil {
			return
		}
		subSettings := commonSettings()
		// PostgreSQL 15's launcher starts no apply worker within this interval (5s by default) of
		// the last start of any, so that every run (a new subscription, or one enabled again
		// after the backlog) would wait for it; 16+ count it per subscription, after failures.
		subSettings["wal_retrieve_retry_interval"] = "100ms"
		if p.sub, p.err = pgtest.Start(ctx, p.install, pgtest.Options{Settings: subSettings, Durable: durable()}); p.err != nil {
			return
		}
		p.tb.Logf("publisher and subscriber: %v", p.install)
		if p.err = pgtest.Exec(ctx, p.pubAdmin("postgres"), "CREATE DATABASE "+benchDB); p.err != nil {
			return
		}
		if p.err = pgtest.Exec(ctx, p.sub.ConnString("postgres"), "CREATE DATABASE "+benchDB); p.err != nil {
			return
		}
		if p.err = p.setup(ctx, p); p.err != nil {
			return
		}
		p.subPostmaster, p.err = postmasterPID(ctx, p.sub.ConnString(benchDB))
	})
	if p.err != nil {
		tb.Fatalf("server pair: %v", p.err)
	}
	return p
}

func (p *pair) major() int { return p.install.Major }

// close stops the servers and removes the temporary folder.
func (p *pair) close() {
	for _, s := range []*pgtest.Server{p.sub, p.pub} {
		if s != nil {
			if err := s.Stop(); err != nil {
				p.tb.Errorf("stopping server: %v", err)
			}
		}
	}
	if p.tmp != "" {
		os.RemoveAll(p.tmp)
	}
}

// pubAdmin is a connection string for the publisher whose commits never wait for a synchronous
// standby: setup and reset run while no subscriber is connected.
func (p *pair) pubAdmin(db string) string {
	return p.pub.ConnString(db) + " options='-c synchronous_commit=local'"
}

// pubSource is the connection string a contender replicates from.
func (p *pair) pubSource() string {
	return p.pubReplication() + " application_name=" + appName
}

// pubReplication is how the subscribers reach the publisher for its stream: over its Unix
// socket, or with PGREORDER_BENCH_APPLY_TCP=1 over TCP to 127.0.0.1, as a subscriber on another
// machine would.
func (p *pair) pubReplication() string {
	if os.Getenv(envApplyTCP) != "" {
		return p.pub.TCPConnString(benchDB)
	}
	return p.pub.ConnString(benchDB)
}

// run is one replication of the publication into the subscriber by one contender: its slot
// lives from the contender's first start to its drop.
type run struct {
	p       *pair
	slot    string
	workMem string // the applier's memory limit, for ours (-work-mem)
	first   bool   // the next start is the first: it creates the slot

	endpos     string // the backlog's end LSN, once made: where the limit stops
	cpuProfile string // when set, our applier's next start writes its CPU profile there
}

func (p *pair) newRun(workMem string) *run {
	p.runs++
	return &run{p: p, slot: fmt.Sprintf("%s_%d", appName, p.runs), workMem: workMem, first: true}
}

// contender is one subscriber under test. Adding one to a benchmark is one line in its list.
type contender interface {
	// name is the contender's name in benchmark names (sub=NAME).
	name() string
	// supports returns why the contender cannot run against PostgreSQL major, or nil.
	supports(major int) error
	// start begins replicating the publication pub of the publisher's bench database into the
	// subscriber's bench database, through slot r.slot (created on the first start) and as
	// application_name appName. It may return before the replication connection is up.
	start(ctx context.Context, r *run) (applying, error)
	// drop removes everything the contender made for r: subscription, slot.
	drop(ctx context.Context, r *run) error
}

// applying is a started contender.
type applying interface {
	// failed returns why the contender stopped applying on its own, or nil while it applies.
	failed(ctx context.Context) error
	// stop stops applying; the slot and the target's progress stay, so a new start resumes.
	stop(ctx context.Context) error
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL's own subscriber

// native is a subscription named appName with the given streaming mode.
type native struct {
	streaming string // off, on, parallel, or best: parallel on 16 and later, on before
	label     string // the name, when not native-STREAMING
}

func (n native) name() string {
	if n.label != "" {
		return n.label
	}
	return "native-" + n.streaming
}

func (n native) supports(major int) error {
	if n.streaming == "parallel" && major < 16 {
		return fmt.Errorf("streaming = parallel needs PostgreSQL 16 or later (this is %d)", major)
	}
	return nil
}

func (n native) start(ctx context.Context, r *run) (applying, error) {
	var sql string
	if r.first {
		streaming := n.streaming
		if streaming == "best" {
			streaming = "on"
			if r.p.major() >= 16 {
				streaming = "parallel"
			}
		}
		sql = fmt.Sprintf("CREATE SUBSCRIPTION %s CONNECTION %s PUBLICATION pub WITH (slot_name = %s, copy_data = false, streaming = %s)",
			appName, quoteLiteral(r.p.pubReplication()), quoteLiteral(r.slot), streaming)
	} else {
		sql = "ALTER SUBSCRIPTION " + appName + " ENABLE"
	}
	if err := pgtest.Exec(ctx, r.p.sub.ConnString(benchDB), sql); err != nil {
		return nil, err
	}
	r.first = false
	return nativeApplying{r}, nil
}

type nativeApplying struct{ r *run }

func (a nativeApplying) failed(ctx context.Context) error {
	v, err := queryRow(ctx, a.r.p.sub.ConnString(benchDB),
		"SELECT apply_error_count FROM pg_stat_subscription_stats WHERE subname = "+quoteLiteral(appName))
	if err != nil || len(v) == 0 || v[0] == "0" {
		return err
	}
	return fmt.Errorf("the subscription's apply worker failed %s times; subscriber log:\n%s", v[0], logErrors(a.r.p.sub))
}

func (a nativeApplying) stop(ctx context.Context) error {
	if err := pgtest.Exec(ctx, a.r.p.sub.ConnString(benchDB), "ALTER SUBSCRIPTION "+appName+" DISABLE"); err != nil {
		return err
	}
	return waitSlotInactive(ctx, a.r)
}

func (n native) drop(ctx context.Context, r *run) error {
	return dropNative(ctx, r.p, r.slot)
}

// dropNative drops the subscription if there is one, and the slot.
func dropNative(ctx context.Context, p *pair, slot string) error {
	sub := p.sub.ConnString(benchDB)
	exists, err := queryRow(ctx, sub, "SELECT 1 FROM pg_subscription WHERE subname = "+quoteLiteral(appName))
	if err != nil {
		return err
	}
	if len(exists) > 0 {
		if err := pgtest.Exec(ctx, sub, "DROP SUBSCRIPTION "+appName); err != nil {
			// The slot could not be dropped (e.g. still in use): detach it and drop it below.
			if err := pgtest.Exec(ctx, sub, "ALTER SUBSCRIPTION "+appName+" DISABLE",
				"ALTER SUBSCRIPTION "+appName+" SET (slot_name = NONE)", "DROP SUBSCRIPTION "+appName); err != nil {
				return err
			}
		}
	}
	return dropSlot(ctx, p, slot)
}

// ---------------------------------------------------------------------------------------------
// Our applier: `pgreorder apply`, built from this module once per benchmark run.

type pgreorderApply struct {
	mode    string   // buffered, eager, parallel
	workers int      // -workers, when > 0
	extra   []string // more flags; the contender is skipped when the binary refuses the first
	binary  string   // a pgreorder binary built elsewhere, or "" for this module's
	label   string   // the name, when not pgreorder-MODE[-WORKERS]
}

func (o pgreorderApply) name() string {
	if o.label != "" {
		return o.label
	}
	name := "pgreorder-" + o.mode
	if o.workers > 0 {
		name += fmt.Sprintf("-%d", o.workers)
	}
	return name
}

func (o pgreorderApply) supports(int) error { return nil }

func (o pgreorderApply) start(ctx context.Context, r *run) (applying, error) {
	bin, err := r.p.pgreorderBinary()
	if o.binary != "" {
		bin, err = o.binary, nil
	}
	if err != nil {
		return nil, err
	}
	args := []string{"apply",
		"-source", r.p.pubSource(),
		"-target", r.p.sub.ConnString(benchDB),
		"-slot", r.slot,
		"-publication", "pub",
		"-mode", o.mode,
		"-work-mem", r.workMem,
	}
	if o.workers > 0 {
		args = append(args, "-workers", fmt.Sprint(o.workers))
	}
	args = append(args, o.extra...)
	if r.first {
		args = append(args, "-create-slot")
	}
	if r.cpuProfile != "" { // a catch-up's first start only creates the slot: the next overwrites it
		args = append(args, "-cpuprofile", r.cpuProfile)
		if os.Getenv(envApplyMemProfile) != "" {
			args = append(args, "-memprofile", strings.TrimSuffix(r.cpuProfile, ".pprof")+".allocs.pprof")
		}
	}
	logPath := filepath.Join(r.p.tmp, fmt.Sprintf("%s-%s.log", r.slot, o.name()))
	pr, err := startProcess(bin, args, r.p.tmp, logPath, nil)
	if err != nil {
		return nil, err
	}
	r.first = false
	return pr, nil
}

// probe returns why the binary cannot run the contender (a flag of extra it does not know), or
// nil.
func (o pgreorderApply) probe(p *pair) error {
	if len(o.extra) == 0 {
		return nil
	}
	bin, err := p.pgreorderBinary()
	if o.binary != "" {
		bin, err = o.binary, nil
	}
	if err != nil {
		return err
	}
	return probeFlag(bin, o.extra[0], o.extra[1:]...)
}

func (o pgreorderApply) drop(ctx context.Context, r *run) error { return dropSlot(ctx, r.p, r.slot) }

// pgreorderBinary builds ./cmd/pgreorder into the pair's temporary folder on first use.
func (p *pair) pgreorderBinary() (string, error) {
	p.buildOnce.Do(func() {
		p.binary, p.buildErr = buildPgreorder(p.tmp)
		switch {
		case p.buildErr != nil:
		case os.Getenv(envBin) != "":
			p.tb.Logf("pgreorder: %s (%s)", p.binary, envBin)
		default:
			p.tb.Logf("built %s", p.binary)
		}
	})
	return p.binary, p.buildErr
}

// ---------------------------------------------------------------------------------------------
// Publisher-side helpers

// dropSlot terminates the walsender holding the slot, if any, and drops it, if it exists.
func dropSlot(ctx context.Context, p *pair, slot string) error {
	lit := quoteLiteral(slot)
	return pgtest.Exec(ctx, p.pubAdmin(benchDB),
		"SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots WHERE slot_name = "+lit+" AND active_pid IS NOT NULL",
		"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = "+lit)
}

// dropLeftovers removes what a failed run may have left: the subscription and every slot of
// the benchmark.
func dropLeftovers(ctx context.Context, p *pair) error {
	if err := dropNative(ctx, p, ""); err != nil {
		return err
	}
	return pgtest.Exec(ctx, p.pubAdmin(benchDB),
		"SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots WHERE slot_name LIKE '"+appName+"%' AND active_pid IS NOT NULL",
		"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE '"+appName+"%'")
}

// walsenderState returns the application_name, state and sync_state of the walsender that
// holds the slot, or nothing when none does.
func walsenderState(ctx context.Context, conn *pgconn.PgConn, slot string) ([]string, error) {
	return connRow(ctx, conn, "SELECT r.application_name, r.state, r.sync_state FROM pg_replication_slots s "+
		"JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = "+quoteLiteral(slot))
}

// waitConnected waits until a walsender holds the run's slot for application_name appName, in
// state streaming, and, when sync, is the publisher's synchronous standby.
func waitConnected(ctx context.Context, r *run, a applying, sync bool) error {
	conn, err := pgconn.Connect(ctx, r.p.pubAdmin(benchDB))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(time.Minute)
	var last []string
	for {
		if last, err = walsenderState(ctx, conn, r.slot); err != nil {
			return err
		}
		if len(last) == 3 && last[0] == appName && last[1] == "streaming" && (!sync || last[2] == "sync") {
			return nil
		}
		if err := a.failed(ctx); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			if len(last) == 0 {
				return fmt.Errorf("after a minute no walsender holds slot %s", r.slot)
			}
			return fmt.Errorf("after a minute the walsender of slot %s has application_name %q, state %s, sync_state %s; want %q, streaming%s",
				r.slot, last[0], last[1], last[2], appName, map[bool]string{true: ", sync"}[sync])
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitSlotInactive waits until no walsender holds the run's slot.
func waitSlotInactive(ctx context.Context, r *run) error {
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := queryRow(ctx, r.p.pubAdmin(benchDB), "SELECT active FROM pg_replication_slots WHERE slot_name = "+quoteLiteral(r.slot))
		if err != nil {
			return err
		}
		if len(v) == 0 || v[0] == "f" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s still active a minute after the subscriber stopped", r.slot)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// slotStats is the publisher's pg_stat_replication_slots row of a slot.
type slotStats struct {
	spillBytes, streamBytes, streamCount, totalTxns int64
}

// readSlotStats reads a slot's statistics; call it after the walsender exited (it reports
// them as it goes and on exit) and before the slot is dropped (which drops them).
func readSlotStats(ctx context.Context, p *pair, slot string) (slotStats, error) {
	var st slotStats
	v, err := queryRow(ctx, p.pubAdmin(benchDB), "SELECT spill_bytes, stream_bytes, stream_count, total_txns "+
		"FROM pg_stat_replication_slots WHERE slot_name = "+quoteLiteral(slot))
	if err != nil || len(v) == 0 {
		return st, err
	}
	_, err = fmt.Sscan(strings.Join(v, " "), &st.spillBytes, &st.streamBytes, &st.streamCount, &st.totalTxns)
	return st, err
}

// setPublisherSetting sets a reloadable server setting on the publisher and waits until new
// sessions see it.
func setPublisherSetting(ctx context.Context, p *pair, name, value string) error {
	admin := p.pubAdmin("postgres")
	v, err := queryRow(ctx, admin, "SHOW "+name)
	if err != nil {
		return err
	}
	if len(v) == 1 && v[0] == value {
		return nil
	}
	if err := pgtest.Exec(ctx, admin, fmt.Sprintf("ALTER SYSTEM SET %s = %s", name, quoteLiteral(value)), "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pgtest.Until(wctx, func() bool {
		var v []string
		if v, err = queryRow(ctx, admin, "SHOW "+name); err != nil {
			return true
		}
		err = fmt.Errorf("publisher: %s did not become %s after a reload", name, value)
		if len(v) == 1 && v[0] == value {
			err = nil
		}
		return err == nil
	})
	return err
}

// ---------------------------------------------------------------------------------------------
// SQL helpers (simple protocol, text results)

// queryRow connects, runs one query and returns its first row as text (nil with no row).
func queryRow(ctx context.Context, connString, sql string) ([]string, error) {
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	return connRow(ctx, conn, sql)
}

// connRow runs sql (one or more statements) on conn and returns the first row of the last
// statement that returns rows, as text (nil with no row).
func connRow(ctx context.Context, conn *pgconn.PgConn, sql string) ([]string, error) {
	rs, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%w (in %q)", err, sql)
	}
	i := len(rs) - 1
	for i >= 0 && len(rs[i].FieldDescriptions) == 0 {
		i--
	}
	if i < 0 || len(rs[i].Rows) == 0 {
		return nil, nil
	}
	row := rs[i].Rows[0]
	out := make([]string, len(row))
	for i, c := range row {
		out[i] = string(c)
	}
	return out, nil
}

func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// logErrors returns the ERROR lines at the end of a server's log, for failure messages.
func logErrors(s *pgtest.Server) string {
	data, err := os.ReadFile(filepath.Join(s.SocketDir(), "server.log"))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		if bytes.Contains(line, []byte("ERROR")) || bytes.Contains(line, []byte("FATAL")) {
			out = append(out, string(line))
		}
	}
	if len(out) > 10 {
		out = out[len(out)-10:]
	}
	return strings.Join(out, "\n")
}
