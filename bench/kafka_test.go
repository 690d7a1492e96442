package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// BenchmarkKafkaDebezium runs `pgreorder kafka` and Debezium's PostgreSQL connector (3.6.1.Final,
// in Kafka Connect 4.4.0 standalone, as its users run it: connect-standalone.sh's JVM options,
// plugin.name=pgoutput, the JSON converter with schemas off, every other setting its default)
// against the same PostgreSQL 18 server and the same single KRaft broker, taking turns, each
// contender its own slot and topic prefix. Topics are created beforehand, alike for both
// (one partition, message.timestamp.type=LogAppendTime). A consumer reading with
// isolation.level=read_committed counts what each delivered. Four cases:
//
//   - bigtxn: one INSERT of ROWS rows in one transaction, into an empty published table (the
//     contender already streaming): COMMIT returned → the last event readable; the contender's
//     CPU (utime+stime of its process, /proc) from the INSERT to then; its peak RSS (VmHWM)
//     over its whole run; the publisher's spill_bytes for its slot (pg_stat_replication_slots);
//   - snapshot: the contender started on the pgbench tables at SCALE (100,000 accounts a unit:
//     1M rows at 10), its initial copy (pgreorder) or snapshot (Debezium, snapshot.mode
//     initial): start of the process → the last copied row readable, and the CPU until then;
//   - pgbench: right after, pgbench (TPC-B-like, CLIENTS clients, SECONDS seconds, -n) on those
//     tables: events delivered per second (4 per pgbench transaction, counted from the load's
//     start to the last one readable), the end-to-end lag of each event (source.ts_ms, the
//     commit time, to the record's log append time) at p50 and p99, the contender's CPU over
//     the same span, and pgbench's own tps (the contender shares the machine with the load);
//   - catchup: then the contender is stopped (SIGTERM), the same load runs again into its slot,
//     and the contender is started again: the rate at which it delivers that backlog, from its
//     first record to its last (its capacity, which the live load may not reach), and the time
//     from its start to the last.
//
// With both contenders on the machine's 2 cores beside PostgreSQL, pgbench and the broker,
// every figure includes the contention it causes; the machine's load average is logged before
// and after.
//
// The Debezium side runs from jars bench/debezium/install fetches with Maven (into
// /opt/pgreorder/debezium as root, ~/.cache/pgreorder/debezium otherwise; the benchmark runs it
// when they are missing). It needs PGREORDER_BENCH_KAFKA=1, a JDK 17, Maven, pgbench, a Kafka
// broker (internal/testing/kafkatest) and PostgreSQL 18 (the newest installed otherwise):
//
//	PGREORDER_BENCH_KAFKA=1 go test -v -run '^$' -bench KafkaDebezium -benchtime 1x -timeout 60m ./bench/
//
// Sizes (PGREORDER_BENCH_FULL=1 selects the larger value of each):
//
//	PGREORDER_BENCH_KAFKA_ROWS     rows of the big transaction (100000; 1000000)
//	PGREORDER_BENCH_KAFKA_SCALE    pgbench scale (1; 10: 1M accounts to snapshot)
//	PGREORDER_BENCH_KAFKA_SECONDS  pgbench duration (10; 60)
//	PGREORDER_BENCH_KAFKA_CLIENTS  pgbench clients (32; 32)
//	PGREORDER_BENCH_KAFKA_ROUNDS   rounds, each contender once a case per round, in turn (1; 1)
//
// Selection, to iterate on one case (a full run sets none of them):
//
//	PGREORDER_BENCH_KAFKA_CASES        cases to run, comma-separated (bigtxn,snapshot,pgbench,catchup);
//	                                   pgbench and catchup run the snapshot first (it makes
//	                                   the contender stream the pgbench tables) and report it
//	PGREORDER_BENCH_KAFKA_CONTENDERS   contenders, comma-separated (pgreorder,debezium)
//	PGREORDER_BENCH_KAFKA_ARGS         more arguments for pgreorder kafka, space-separated
//
// The pgbench case measures two lags per event: from its commit (source.ts_ms) to its log append
// time (the broker wrote it), and from its commit to its receipt by the read_committed consumer
// (it became readable: for pgreorder after its Kafka transaction committed; the consumer's fetch
// returns within 50ms of that).
//
// PGREORDER_BENCH_KAFKA_PERF=1 attaches `perf record` to each pgreorder process and logs the top
// of its report when it stops (a diagnosis: perf's own work is on the machine too).
func BenchmarkKafkaDebezium(b *testing.B) {
	if os.Getenv("PGREORDER_BENCH_KAFKA") != "1" {
		b.Skip("set PGREORDER_BENCH_KAFKA=1 to run the Debezium comparison (minutes)")
	}
	rows := envSize(b, "PGREORDER_BENCH_KAFKA_ROWS", 1_000_000, 100_000)
	scale := envSize(b, "PGREORDER_BENCH_KAFKA_SCALE", 10, 1)
	seconds := envSize(b, "PGREORDER_BENCH_KAFKA_SECONDS", 60, 10)
	clients := envSize(b, "PGREORDER_BENCH_KAFKA_CLIENTS", 32, 32)
	rounds := envSize(b, "PGREORDER_BENCH_KAFKA_ROUNDS", 1, 1)
	cases := envList(b, "PGREORDER_BENCH_KAFKA_CASES", []string{"bigtxn", "snapshot", "pgbench", "catchup"})
	contenders := envList(b, "PGREORDER_BENCH_KAFKA_CONTENDERS", []string{"pgreorder", "debezium"})
	pgbench, err := findPgbench()
	if err != nil {
		b.Skip(err)
	}
	installs := pgtest.FindInstalls()
	if len(installs) == 0 {
		b.Skip("no PostgreSQL server installed; " + pgtest.HowToInstall)
	}
	in := installs[len(installs)-1]
	for _, i := range installs {
		if i.Major == 18 {
			in = i
		}
	}
	kafka := kafkatest.Start(b, 1)
	dbz, err := installDebezium()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	bin, err := buildPgreorder(dir)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, in, pgtest.Options{Settings: map[string]string{
		"logical_decoding_work_mem": "64MB", // the server's default
		"shared_buffers":            "128MB",
		"max_wal_size":              "4GB",
		"max_connections":           "100",
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("%v; Kafka %s (one KRaft node); Debezium from %s; pgbench %s; load average before: %s", in, kafkatest.Version, dbz, pgbench, bytes.TrimSpace(load))
	admin := srv.ConnString("postgres")
	if err := pgtest.Exec(ctx, admin, "CREATE DATABASE bench"); err != nil {
		b.Fatal(err)
	}
	db := srv.ConnString("bench")
	if err := pgtest.Exec(ctx, db, append(tpcbSchema(int(scale)),
		"CREATE TABLE big (id int PRIMARY KEY, v int)",
		"CREATE PUBLICATION pub_big FOR TABLE big",
		"CREATE PUBLICATION pub_tpcb FOR TABLE pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history")...); err != nil {
		b.Fatal(err)
	}
	kb := &kafkaBench{b: b, srv: srv, kafka: kafka, bin: bin, dbz: dbz, dir: dir, pgbench: pgbench,
		rows: rows, scale: scale, seconds: seconds, clients: clients, args: strings.Fields(os.Getenv("PGREORDER_BENCH_KAFKA_ARGS"))}
	live, catchup := slices.Contains(cases, "pgbench"), slices.Contains(cases, "catchup")
	if live || catchup {
		if !slices.Contains(cases, "snapshot") {
			cases = append(cases, "snapshot")
		}
	}
	results := map[string][]kafkaResult{}
	for r := range rounds {
		for i := range contenders {
			c := contenders[(i+int(r))%len(contenders)]
			if slices.Contains(cases, "bigtxn") {
				res, err := kb.bigTxn(ctx, c)
				if err != nil {
					b.Fatalf("bigtxn, %s: %v", c, err)
				}
				results["bigtxn/"+c] = append(results["bigtxn/"+c], res)
			}
			if !slices.Contains(cases, "snapshot") {
				continue
			}
			snap, load, catch, err := kb.snapshotAndLoad(ctx, c, live, catchup)
			if err != nil {
				b.Fatalf("snapshot and pgbench, %s: %v", c, err)
			}
			results["snapshot/"+c] = append(results["snapshot/"+c], snap)
			if live {
				results["pgbench/"+c] = append(results["pgbench/"+c], load)
			}
			if catchup {
				results["catchup/"+c] = append(results["catchup/"+c], catch)
			}
		}
	}
	for _, cs := range []string{"bigtxn", "snapshot", "pgbench", "catchup"} {
		if !slices.Contains(cases, cs) {
			continue
		}
		name := map[string]string{
			"bigtxn":   fmt.Sprintf("case=bigtxn/rows=%s", rowsName(rows)),
			"snapshot": fmt.Sprintf("case=snapshot/rows=%s", rowsName(100_000*scale)),
			"pgbench":  fmt.Sprintf("case=pgbench/clients=%d/seconds=%d", clients, seconds),
			"catchup":  fmt.Sprintf("case=catchup/clients=%d/seconds=%d", clients, seconds),
		}[cs]
		for _, c := range contenders {
			rs := results[cs+"/"+c]
			b.Run(name+"/impl="+c, func(b *testing.B) {
				for range b.N {
				}
				reportKafka(b, cs, median(rs))
			})
		}
	}
	load, _ = os.ReadFile("/proc/loadavg")
	b.Logf("load average after: %s", bytes.TrimSpace(load))
}

// kafkaResult is one measured run of a contender; zero fields are not measured in its case.
type kafkaResult struct {
	last       time.Duration // bigtxn: COMMIT → last event; snapshot: start → last row
	cpu        time.Duration
	rss        int64 // VmHWM, bytes
	spill      int64 // bigtxn: spill_bytes of the slot
	eventsPerS float64
	lagP50     time.Duration // commit → log append time
	lagP99     time.Duration
	visP50     time.Duration // commit → received by the read_committed consumer
	visP99     time.Duration
	tps        float64
	events     int64
}

func reportKafka(b *testing.B, cs string, r kafkaResult) {
	b.ReportMetric(float64(r.cpu.Milliseconds()), "cpu-ms")
	b.ReportMetric(float64(r.rss), "peak-rss-bytes")
	switch cs {
	case "bigtxn":
		b.ReportMetric(float64(r.last.Milliseconds()), "last-ms")
		b.ReportMetric(float64(r.spill), "spill-bytes")
	case "snapshot":
		b.ReportMetric(float64(r.last.Milliseconds()), "snapshot-ms")
	case "pgbench":
		b.ReportMetric(r.eventsPerS, "events/s")
		b.ReportMetric(float64(r.lagP50.Milliseconds()), "lag-p50-ms")
		b.ReportMetric(float64(r.lagP99.Milliseconds()), "lag-p99-ms")
		b.ReportMetric(float64(r.visP50.Milliseconds()), "visible-p50-ms")
		b.ReportMetric(float64(r.visP99.Milliseconds()), "visible-p99-ms")
		if r.events > 0 {
			b.ReportMetric(float64(r.cpu.Microseconds())/float64(r.events), "cpu-ms/1000-events")
		}
		b.ReportMetric(r.tps, "pgbench-tps")
		b.ReportMetric(float64(r.events), "events")
	case "catchup":
		b.ReportMetric(r.eventsPerS, "events/s")
		b.ReportMetric(float64(r.last.Milliseconds()), "start-to-last-ms")
		b.ReportMetric(float64(r.events), "events")
		if r.events > 0 {
			b.ReportMetric(float64(r.cpu.Microseconds())/float64(r.events), "cpu-ms/1000-events")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// median returns the run whose main figure is the median (the only one with one round).
func median(rs []kafkaResult) kafkaResult {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(x, y kafkaResult) int {
		if x.eventsPerS != y.eventsPerS {
			if x.eventsPerS < y.eventsPerS {
				return -1
			}
			return 1
		}
		return int(x.last - y.last)
	})
	return rs[len(rs)/2]
}

type kafkaBench struct {
	b                             *testing.B
	srv                           *pgtest.Server
	kafka                         *kafkatest.Cluster
	bin, dbz, dir, pgbench        string
	rows, scale, seconds, clients int64
	args                          []string // more arguments for pgreorder (PGREORDER_BENCH_KAFKA_ARGS)
	runs                          int
}

// session is one contender's process, on its own slot and topic prefix.
type session struct {
	kind, slot, prefix string
	proc               *process
	started            time.Time
	tally              *tally
	rest               int // Kafka Connect's REST port (Debezium)
	lastCheck          time.Time
	pub, dir           string
	tables             []string
	launches           int
	perf               *perfRecorder // perf record attached to pgreorder (PGREORDER_BENCH_KAFKA_PERF)
}

// failed returns an error once the contender's process exited, or, for Debezium, once Kafka
// Connect reports its connector or task failed (the worker itself goes on running).
func (s *session) failed(ctx context.Context) error {
	if err := s.proc.failed(ctx); err != nil {
		return err
	}
	if s.rest == 0 || time.Since(s.lastCheck) < time.Second {
		return nil
	}
	s.lastCheck = time.Now()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/connectors/%s/status", s.rest, s.slot))
	if err != nil {
		return nil // not listening yet
	}
	defer resp.Body.Close()
	var st struct {
		Connector struct {
			State, Trace string
		}
		Tasks []struct {
			State, Trace string
		}
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		return nil
	}
	if st.Connector.State == "FAILED" {
		return fmt.Errorf("Debezium connector failed: %s", st.Connector.Trace)
	}
	for _, t := range st.Tasks {
		if t.State == "FAILED" {
			return fmt.Errorf("Debezium task failed: %s", t.Trace)
		}
	}
	return nil
}

func (kb *kafkaBench) pid(s *session) int { return s.proc.cmd.Process.Pid }

// start starts contender kind on publication pub, topics for tables pre-created, and a
// read_committed consumer of them.
func (kb *kafkaBench) start(ctx context.Context, kind, pub string, tables []string, parseFrom int64) (*session, error) {
	kb.runs++
	s := &session{kind: kind, slot: fmt.Sprintf("bench_%s_%d", kind, kb.runs), prefix: fmt.Sprintf("b%d%s", kb.runs, kind[:3])}
	dir := filepath.Join(kb.dir, s.slot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var topics []string
	for _, t := range tables {
		topics = append(topics, s.prefix+".public."+t)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kb.kafka.Addrs()...))
	if err != nil {
		return nil, err
	}
	appendTime := "LogAppendTime"
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, 1, 1, map[string]*string{"message.timestamp.type": &appendTime}, topics...)
	cl.Close()
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("creating topics: %w", err)
	}
	s.tally, err = consume(kb.kafka.Addrs(), topics, parseFrom)
	if err != nil {
		return nil, err
	}
	s.pub, s.dir, s.tables = pub, dir, tables
	if err := kb.launch(s); err != nil {
		s.tally.close()
		return nil, err
	}
	return s, nil
}

// launch starts the contender's process (again, after stopProcess: on the same slot, topics and
// Kafka Connect offsets file, resuming where it stopped).
func (kb *kafkaBench) launch(s *session) (err error) {
	s.launches++
	host := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=bench sslmode=disable", kb.srv.Port())
	s.started = time.Now()
	s.rest = 0
	switch s.kind {
	case "pgreorder":
		args := append([]string{"kafka", "-source", host, "-slot", s.slot, "-publication", s.pub,
			"-kafka-brokers", kb.kafka.Seeds(), "-kafka-topic-prefix", s.prefix, "-progress", "0"}, kb.args...)
		s.proc, err = startProcess(kb.bin, args, s.dir, filepath.Join(s.dir, fmt.Sprintf("pgreorder-%d.log", s.launches)), nil)
	case "debezium":
		s.proc, err = kb.startConnect(s.dir, s, s.pub, s.tables)
	}
	if err == nil && s.kind == "pgreorder" && os.Getenv("PGREORDER_BENCH_KAFKA_PERF") == "1" {
		var perr error
		if s.perf, perr = startPerf(kb.pid(s), filepath.Join(s.dir, fmt.Sprintf("perf-%d.data", s.launches))); perr != nil {
			kb.b.Log(perr)
		}
	}
	return err
}

// perfReport stops perf record and logs the top of its report.
func (kb *kafkaBench) perfReport(s *session) {
	if s.perf == nil {
		return
	}
	top, err := s.perf.stop(25)
	s.perf = nil
	if err != nil {
		kb.b.Log(err)
		return
	}
	kb.b.Logf("perf, pgreorder launch %d of slot %s:\n%s", s.launches, s.slot, top)
}

// stopProcess stops the contender's process (SIGTERM, a clean stop).
func (kb *kafkaBench) stopProcess(ctx context.Context, s *session) error {
	kb.perfReport(s)
	wasRunning := s.proc.failed(ctx) == nil
	err := s.proc.stop(ctx)
	if s.kind == "pgreorder" && wasRunning {
		if data, rerr := os.ReadFile(s.proc.logPath); rerr == nil {
			for line := range strings.Lines(string(data)) {
				if strings.Contains(line, "msg=stopped") {
					kb.b.Logf("pgreorder %s: %s", s.slot, strings.TrimSpace(line))
				}
			}
		}
	}
	if err != nil && s.kind == "debezium" && s.proc.cmd.ProcessState != nil && s.proc.cmd.ProcessState.ExitCode() == 143 {
		err = nil // the JVM's exit status after SIGTERM, once its shutdown hooks ran
	}
	return err
}

// startConnect writes the worker's and the connector's properties and starts Kafka Connect
// standalone with the JVM options of connect-standalone.sh. The connector captures the tables
// of the publication (table.include.list; it snapshots every table of the database otherwise).
func (kb *kafkaBench) startConnect(dir string, s *session, pub string, tables []string) (*process, error) {
	port, err := freeTCPPort()
	if err != nil {
		return nil, err
	}
	s.rest = port
	worker := fmt.Sprintf(`bootstrap.servers=%s
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter.schemas.enable=false
offset.storage.file.filename=%s
offset.flush.interval.ms=10000
plugin.path=%s
listeners=http://127.0.0.1:%d
`, kb.kafka.Seeds(), filepath.Join(dir, "connect.offsets"), filepath.Join(kb.dbz, "plugins"), port)
	connector := fmt.Sprintf(`name=%s
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
plugin.name=pgoutput
database.hostname=127.0.0.1
database.port=%d
database.user=postgres
database.password=unused
database.dbname=bench
topic.prefix=%s
slot.name=%s
publication.name=%s
publication.autocreate.mode=disabled
table.include.list=public.%s
snapshot.mode=initial
`, s.slot, kb.srv.Port(), s.prefix, s.slot, pub, strings.Join(tables, ",public."))
	// As Kafka's connect-log4j2 configuration: INFO to the console (properties: the worker has
	// no YAML parser).
	log4j := "appender.out.type = Console\nappender.out.name = STDOUT\nappender.out.layout.type = PatternLayout\n" +
		"appender.out.layout.pattern = [%d] %p %m (%c)%n\nrootLogger.level = INFO\nrootLogger.appenderRef.out.ref = STDOUT\n"
	for name, text := range map[string]string{"worker.properties": worker, "connector.properties": connector, "log4j2.properties": log4j} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	args := []string{"-Xms256M", "-Xmx2G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
		"-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent", "-XX:MaxInlineLevel=15",
		"-Djava.awt.headless=true", "-Dlog4j2.configurationFile=" + filepath.Join(dir, "log4j2.properties"),
		"-cp", filepath.Join(kb.dbz, "connect", "*"), "org.apache.kafka.connect.cli.ConnectStandalone",
		filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties")}
	return startProcess("java", args, dir, filepath.Join(dir, fmt.Sprintf("connect-%d.log", s.launches)), nil)
}

// stop stops the contender and its consumer and drops its slot.
func (kb *kafkaBench) stop(ctx context.Context, s *session) error {
	err := kb.stopProcess(ctx, s)
	s.tally.close()
	// The contender's walsender may not have exited yet.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var qerr error
	dropped := pgtest.Until(wctx, func() bool {
		var n string
		n, qerr = querySingle(ctx, kb.srv.ConnString("bench"), fmt.Sprintf(
			"SELECT count(pg_drop_replication_slot(slot_name)) || '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%[1]s') FROM pg_replication_slots WHERE slot_name = '%[1]s' AND NOT active", s.slot))
		return qerr != nil || n == "1/1" || strings.HasSuffix(n, "/0")
	})
	if qerr != nil {
		return qerr
	}
	if !dropped {
		return fmt.Errorf("slot %s still active after the contender stopped", s.slot)
	}
	return err
}

// waitCount waits until the consumer counted n records, and returns when it received the last.
func (kb *kafkaBench) waitCount(ctx context.Context, s *session, n int64, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		got, at := s.tally.count()
		if got >= n {
			return at, nil
		}
		if err := s.failed(ctx); err != nil {
			return time.Time{}, err
		}
		if err := s.tally.failed(); err != nil {
			return time.Time{}, err
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s delivered %d of %d records in %v; its output ends:\n%s", s.kind, got, n, limit, s.proc.tail())
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (kb *kafkaBench) bigTxn(ctx context.Context, kind string) (kafkaResult, error) {
	var r kafkaResult
	db := kb.srv.ConnString("bench")
	if err := pgtest.Exec(ctx, db, "TRUNCATE big", "CHECKPOINT"); err != nil {
		return r, err
	}
	s, err := kb.start(ctx, kind, "pub_big", []string{"big"}, -1)
	if err != nil {
		return r, err
	}
	defer kb.stop(context.WithoutCancel(ctx), s)
	// Streaming: the slot exists and a first row went through.
	if err := kb.waitSlot(ctx, s); err != nil {
		return r, err
	}
	if err := pgtest.Exec(ctx, db, "INSERT INTO big VALUES (0, 0)"); err != nil {
		return r, err
	}
	if _, err := kb.waitCount(ctx, s, 1, 5*time.Minute); err != nil {
		return r, err
	}
	cpu0, err := procCPU(kb.pid(s))
	if err != nil {
		return r, err
	}
	if err := pgtest.Exec(ctx, db, fmt.Sprintf("INSERT INTO big SELECT g, g FROM generate_series(1, %d) g", kb.rows)); err != nil {
		return r, err
	}
	committed := time.Now()
	last, err := kb.waitCount(ctx, s, kb.rows+1, 20*time.Minute)
	if err != nil {
		return r, err
	}
	r.last = last.Sub(committed)
	cpu1, err := procCPU(kb.pid(s))
	if err != nil {
		return r, err
	}
	r.cpu = cpu1 - cpu0
	if r.rss, err = procHWM(kb.pid(s)); err != nil {
		return r, err
	}
	// The walsender reports the slot's statistics after each decoded transaction.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var qerr error
	pgtest.Until(wctx, func() bool {
		var v string
		if v, qerr = querySingle(ctx, db, fmt.Sprintf("SELECT spill_bytes || ',' || total_txns FROM pg_stat_replication_slots WHERE slot_name = '%s'", s.slot)); qerr != nil {
			return true
		}
		var total int64
		fmt.Sscanf(v, "%d,%d", &r.spill, &total)
		return total >= 2
	})
	if qerr != nil {
		return r, qerr
	}
	kb.b.Logf("bigtxn %s: COMMIT → last event %v, CPU %v, peak RSS %d MB, spill %d B", kind, r.last.Round(time.Millisecond), r.cpu.Round(time.Millisecond), r.rss>>20, r.spill)
	return r, kb.stop(ctx, s)
}

// snapshotAndLoad runs the snapshot case, then the pgbench case if live, then the catchup case if
// catchup.
func (kb *kafkaBench) snapshotAndLoad(ctx context.Context, kind string, live, catchup bool) (snap, load, catch kafkaResult, err error) {
	db := kb.srv.ConnString("bench")
	if err := pgtest.Exec(ctx, db, tpcbReset...); err != nil {
		return snap, load, catch, err
	}
	copied := 100_000*kb.scale + 10*kb.scale + kb.scale // accounts, tellers, branches; no history
	s, err := kb.start(ctx, kind, "pub_tpcb", []string{"pgbench_branches", "pgbench_tellers", "pgbench_accounts", "pgbench_history"}, copied)
	if err != nil {
		return snap, load, catch, err
	}
	defer kb.stop(context.WithoutCancel(ctx), s)
	last, err := kb.waitCount(ctx, s, copied, 20*time.Minute)
	if err != nil {
		return snap, load, catch, err
	}
	snap.last = last.Sub(s.started)
	pid := kb.pid(s)
	if snap.cpu, err = procCPU(pid); err != nil {
		return snap, load, catch, err
	}
	if snap.rss, err = procHWM(pid); err != nil {
		return snap, load, catch, err
	}
	s.tally.mu.Lock()
	first := s.tally.first.Sub(s.started)
	s.tally.mu.Unlock()
	kb.b.Logf("snapshot %s: %d rows, start → first row %v → last row %v, CPU %v, peak RSS %d MB", kind, copied,
		first.Round(time.Millisecond), snap.last.Round(time.Millisecond), snap.cpu.Round(time.Millisecond), snap.rss>>20)

	// The load, once the contender streams.
	if err := kb.waitSlot(ctx, s); err != nil {
		return snap, load, catch, err
	}
	var txns int64
	if live {
		if load, txns, err = kb.live(ctx, s, copied); err != nil {
			return snap, load, catch, err
		}
	}
	if !catchup {
		return snap, load, catch, kb.stop(ctx, s)
	}
	catch, err = kb.catchUp(ctx, s, copied, txns)
	if err != nil {
		return snap, load, catch, err
	}
	return snap, load, catch, kb.stop(ctx, s)
}

// live runs the pgbench case on s, which streams the tables after copying copied rows, and
// returns its result and the transactions pgbench made.
func (kb *kafkaBench) live(ctx context.Context, s *session, copied int64) (load kafkaResult, txns int64, err error) {
	db := kb.srv.ConnString("bench")
	kind, pid := s.kind, kb.pid(s)
	cpu0, err := procCPU(pid)
	if err != nil {
		return load, 0, err
	}
	t0 := time.Now()
	out, err := kb.runPgbench(ctx)
	if err != nil {
		return load, txns, err
	}
	if m := regexp.MustCompile(`tps = ([0-9.]+)`).FindStringSubmatch(out); m != nil {
		load.tps, _ = strconv.ParseFloat(m[1], 64)
	}
	n, err := querySingle(ctx, db, "SELECT count(*) FROM pgbench_history")
	if err != nil {
		return load, txns, err
	}
	txns, _ = strconv.ParseInt(n, 10, 64)
	load.events = 4 * txns
	last, err := kb.waitCount(ctx, s, copied+load.events, 20*time.Minute)
	if err != nil {
		return load, txns, err
	}
	span := last.Sub(t0)
	load.eventsPerS = float64(load.events) / span.Seconds()
	cpu1, err := procCPU(pid)
	if err != nil {
		return load, txns, err
	}
	load.cpu = cpu1 - cpu0
	if load.rss, err = procHWM(pid); err != nil {
		return load, txns, err
	}
	load.lagP50, load.lagP99, load.visP50, load.visP99 = s.tally.lags()
	kb.b.Logf("pgbench %s: %d transactions (%.0f tps), %d events in %v after the load's start: %.0f events/s, lag p50 %v p99 %v "+
		"(commit → log append time), visible p50 %v p99 %v (commit → read_committed consumer), CPU %v (%.1f ms per 1,000 events), peak RSS %d MB",
		kind, txns, load.tps, load.events, span.Round(time.Millisecond), load.eventsPerS, load.lagP50, load.lagP99, load.visP50, load.visP99,
		load.cpu.Round(time.Millisecond), float64(load.cpu.Microseconds())/float64(max(load.events, 1)), load.rss>>20)
	return load, txns, nil
}

// catchUp runs the catchup case on s, whose consumer has counted copied rows and the events of
// txns pgbench transactions.
func (kb *kafkaBench) catchUp(ctx context.Context, s *session, copied, txns int64) (catch kafkaResult, err error) {
	db := kb.srv.ConnString("bench")
	kind := s.kind

	// Catch-up: the contender stopped, a backlog made by the same load, the contender started
	// again on its slot; its rate from the first record of the backlog to the last.
	if err := kb.stopProcess(ctx, s); err != nil {
		return catch, err
	}
	if _, err := kb.runPgbench(ctx); err != nil {
		return catch, err
	}
	n, err := querySingle(ctx, db, "SELECT count(*) FROM pgbench_history")
	if err != nil {
		return catch, err
	}
	all, _ := strconv.ParseInt(n, 10, 64)
	catch.events = 4 * (all - txns)
	had, _ := s.tally.count()
	s.tally.mark(had + 1)
	if err := kb.launch(s); err != nil {
		return catch, err
	}
	last, err := kb.waitCount(ctx, s, copied+4*all, 20*time.Minute)
	if err != nil {
		return catch, err
	}
	firstAt := s.tally.marked()
	catch.eventsPerS = float64(catch.events) / last.Sub(firstAt).Seconds()
	catch.last = last.Sub(s.started)
	if catch.cpu, err = procCPU(kb.pid(s)); err != nil {
		return catch, err
	}
	if catch.rss, err = procHWM(kb.pid(s)); err != nil {
		return catch, err
	}
	// The walsender's CPU (it decodes the backlog for the contender) since it started.
	var walsender time.Duration
	if v, err := querySingle(ctx, db, fmt.Sprintf("SELECT active_pid FROM pg_replication_slots WHERE slot_name = '%s'", s.slot)); err == nil {
		if pid, err := strconv.Atoi(v); err == nil {
			walsender, _ = procCPU(pid)
		}
	}
	kb.b.Logf("catch-up %s: %d events; start → first %v → last %v: %.0f events/s from first to last, CPU %v (from the start; the walsender's %v), peak RSS %d MB",
		kind, catch.events, firstAt.Sub(s.started).Round(time.Millisecond), catch.last.Round(time.Millisecond), catch.eventsPerS,
		catch.cpu.Round(time.Millisecond), walsender.Round(time.Millisecond), catch.rss>>20)
	return catch, nil
}

// waitSlot waits until the contender's walsender streams from its slot.
func (kb *kafkaBench) waitSlot(ctx context.Context, s *session) error {
	for {
		v, err := querySingle(ctx, kb.srv.ConnString("bench"), fmt.Sprintf(
			"SELECT count(*) FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = '%s' AND r.state = 'streaming'", s.slot))
		if err != nil {
			return err
		}
		if v == "1" {
			return nil
		}
		if err := s.failed(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never streamed from slot %s: %w; its output ends:\n%s", s.kind, s.slot, ctx.Err(), s.proc.tail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (kb *kafkaBench) runPgbench(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, kb.pgbench, "-n", "-c", strconv.FormatInt(kb.clients, 10), "-j", "2",
		"-T", strconv.FormatInt(kb.seconds, 10), "-h", "127.0.0.1", "-p", strconv.Itoa(kb.srv.Port()), "-U", "postgres", "bench")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pgbench: %v\n%s", err, out)
	}
	return string(out), nil
}

// tally is a read_committed consumer's count of what it received.
type tally struct {
	cl     *kgo.Client
	done   chan struct{}
	mu     sync.Mutex
	n      int64
	first  time.Time // when the first record was received
	lastAt time.Time
	err    error
	from   int64 // records from this index on have their lag measured (-1: none)
	markN  int64 // the record whose arrival is noted (mark), 1-based
	markAt time.Time
	lagMS  []int64 // log append time - source.ts_ms
	visMS  []int64 // receipt (readable to read_committed) - source.ts_ms
}

func consume(brokers, topics []string, parseFrom int64) (*tally, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// A fetch that finds nothing readable returns within 50ms, so that records a commit
		// makes readable are seen within that (the default wait is 5s).
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return nil, err
	}
	t := &tally{cl: cl, done: make(chan struct{}), from: parseFrom}
	go func() {
		defer close(t.done)
		for {
			fs := cl.PollFetches(context.Background())
			if fs.IsClientClosed() {
				return
			}
			now := time.Now()
			t.mu.Lock()
			fs.EachError(func(topic string, p int32, err error) {
				if t.err == nil {
					t.err = fmt.Errorf("consuming %s/%d: %w", topic, p, err)
				}
			})
			fs.EachRecord(func(r *kgo.Record) {
				if r.Value == nil {
					return
				}
				if t.from >= 0 && t.n >= t.from {
					if ts, ok := sourceTsMs(r.Value); ok {
						t.lagMS = append(t.lagMS, r.Timestamp.UnixMilli()-ts)
						t.visMS = append(t.visMS, now.UnixMilli()-ts)
					}
				}
				if t.n == 0 {
					t.first = now
				}
				t.n++
				if t.n == t.markN {
					t.markAt = now
				}
			})
			t.lastAt = now
			t.mu.Unlock()
		}
	}()
	return t, nil
}

func (t *tally) count() (int64, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n, t.lastAt
}

// mark notes when the n-th record arrives (marked).
func (t *tally) mark(n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.markN, t.markAt = n, time.Time{}
}

func (t *tally) marked() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.markAt
}

func (t *tally) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// lags returns the percentiles of the lags measured: to the log append time, and to receipt.
func (t *tally) lags() (p50, p99, visP50, visP99 time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p50, p99 = percentiles(t.lagMS)
	visP50, visP99 = percentiles(t.visMS)
	return p50, p99, visP50, visP99
}

// percentiles returns the 50th and 99th percentiles of ms, milliseconds.
func percentiles(ms []int64) (p50, p99 time.Duration) {
	if len(ms) == 0 {
		return 0, 0
	}
	l := slices.Clone(ms)
	slices.Sort(l)
	at := func(q float64) time.Duration { return time.Duration(l[int(q*float64(len(l)-1))]) * time.Millisecond }
	return at(0.50), at(0.99)
}

func (t *tally) close() {
	t.cl.Close()
	<-t.done
}

// sourceTsMs returns source.ts_ms of a Debezium-style event: the first "ts_ms" after "source".
func sourceTsMs(v []byte) (int64, bool) {
	i := bytes.Index(v, []byte(`"source":{`))
	if i < 0 {
		return 0, false
	}
	j := bytes.Index(v[i:], []byte(`"ts_ms":`))
	if j < 0 {
		return 0, false
	}
	rest := v[i+j+len(`"ts_ms":`):]
	k := 0
	for k < len(rest) && rest[k] >= '0' && rest[k] <= '9' {
		k++
	}
	n, err := strconv.ParseInt(string(rest[:k]), 10, 64)
	return n, err == nil
}

// envList returns the comma-separated values of environment variable name, each one of valid,
// or valid when it is not set.
func envList(b testing.TB, name string, valid []string) []string {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return valid
	}
	var l []string
	for x := range strings.SplitSeq(v, ",") {
		if x = strings.TrimSpace(x); x == "" {
			continue
		}
		if !slices.Contains(valid, x) {
			b.Fatalf("%s=%q: %q is not one of %s", name, v, x, strings.Join(valid, ","))
		}
		l = append(l, x)
	}
	return l
}

// procCPU returns the user and system CPU time of process pid (its threads included).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime or stime", pid)
	}
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// procHWM returns the peak resident set size of process pid (VmHWM), in bytes.
func procHWM(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// installDebezium runs bench/debezium/install and returns the folder it printed last.
func installDebezium() (string, error) {
	cmd := exec.Command("bash", filepath.Join("debezium", "install"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("bench/debezium/install: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// findPgbench returns a pgbench command: on the PATH, or in a Debian PostgreSQL folder.
func findPgbench() (string, error) {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	if len(m) > 0 {
		return m[len(m)-1], nil
	}
	return "", fmt.Errorf("no pgbench command (apt-get install postgresql-client)")
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
