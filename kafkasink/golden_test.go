package kafkasink_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// The golden workload (testdata/debezium): setup.sql makes the tables and the rows copied at the
// start, changes.sql the changes streamed after. Debezium's records of it are in
// testdata/debezium/debezium-schemas.jsonl (JsonConverter with schemas.enable=true, topic prefix
// "golden") and debezium-plain.jsonl (schemas off, prefix "plain"), captured once by
//
//	PGREORDER_CAPTURE_DEBEZIUM=1 go test -run TestCaptureDebezium -v ./kafkasink/
//
// which runs Debezium 3.6.1.Final's PostgreSQL connector in Kafka Connect (from the jars
// bench/debezium/install fetches) on PostgreSQL 18.
const (
	goldenDir     = "testdata/debezium"
	captureEnv    = "PGREORDER_CAPTURE_DEBEZIUM"
	goldenMajor   = 18
	endMarkPrefix = "golden-end"
)

// goldenRecord is one Kafka record as the golden files hold it.
type goldenRecord struct {
	Topic   string          `json:"topic"`
	Key     json.RawMessage `json:"key"`
	Value   json.RawMessage `json:"value"`
	Headers []goldenHeader  `json:"headers,omitempty"`
}

type goldenHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// sqlBlocks returns the transactions of a workload file: blocks separated by blank lines, with
// comment lines dropped.
func sqlBlocks(t *testing.T, name string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(goldenDir, name))
	require.NoError(t, err)
	var blocks []string
	var cur strings.Builder
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			blocks = append(blocks, s)
		}
		cur.Reset()
	}
	for line := range strings.Lines(string(data)) {
		switch trimmed := strings.TrimSpace(line); {
		case trimmed == "":
			flush()
		case strings.HasPrefix(trimmed, "--"):
		default:
			cur.WriteString(line)
		}
	}
	flush()
	return blocks
}

// runBlocks runs each block as one transaction (a simple query of several statements is one).
func runBlocks(t *testing.T, ctx context.Context, dsn string, blocks []string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, b := range blocks {
		_, err := conn.Exec(ctx, b, pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err, b)
	}
}

// recorder collects every record of the topics of some prefixes, in the order of each
// partition (the golden topics have one), read committed.
type recorder struct {
	cl     *kgo.Client
	mu     sync.Mutex
	recs   []*kgo.Record
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

func record(t *testing.T, c *kafkatest.Cluster, prefixes ...string) *recorder {
	t.Helper()
	var alts []string
	for _, p := range prefixes {
		alts = append(alts, strings.ReplaceAll(p, ".", `\.`))
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.ConsumeRegex(),
		kgo.ConsumeTopics(`^(`+strings.Join(alts, "|")+`)\..*`),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(500*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder{cl: cl, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			r.mu.Lock()
			fs.EachError(func(topic string, p int32, err error) {
				if ctx.Err() == nil && r.err == nil {
					r.err = fmt.Errorf("reading %s/%d: %w", topic, p, err)
				}
			})
			fs.EachRecord(func(rec *kgo.Record) { r.recs = append(r.recs, rec) })
			r.mu.Unlock()
		}
	}()
	t.Cleanup(r.close)
	return r
}

func (r *recorder) close() {
	r.cancel()
	<-r.done
	r.cl.Close()
}

// wait waits until ok holds of the records read so far, or fails t after limit; failed, when not
// nil, is checked meanwhile.
func (r *recorder) wait(t *testing.T, what string, limit time.Duration, failed func() error, ok func([]*kgo.Record) bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		r.mu.Lock()
		done, err := ok(r.recs), r.err
		r.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return
		}
		if failed != nil {
			if err := failed(); err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not after %v", what, limit)
		}
		time.Sleep(100 * time.Millisecond) // the poll's interval (ok and failed may be costly); limit bounds it
	}
}

// records returns the records of the topics of prefix, topic by topic (sorted), each in its
// order.
func (r *recorder) records(prefix string) []goldenRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []goldenRecord
	for _, rec := range r.recs {
		if !strings.HasPrefix(rec.Topic, prefix+".") {
			continue
		}
		g := goldenRecord{Topic: rec.Topic, Key: rawJSON(rec.Key), Value: rawJSON(rec.Value)}
		for _, h := range rec.Headers {
			g.Headers = append(g.Headers, goldenHeader{Key: h.Key, Value: string(h.Value)})
		}
		out = append(out, g)
	}
	slices.SortStableFunc(out, func(a, b goldenRecord) int { return strings.Compare(a.Topic, b.Topic) })
	return out
}

// rawJSON returns b as JSON: itself when it is valid JSON, null for nil, else a JSON string.
func rawJSON(b []byte) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	if json.Valid(b) {
		var buf bytes.Buffer
		if json.Compact(&buf, b) == nil {
			return buf.Bytes()
		}
	}
	s, _ := json.Marshal(string(b))
	return s
}

// countOps counts the records of prefix's topics whose value has op.
func countOps(recs []*kgo.Record, prefix, op string) int {
	n := 0
	needle := []byte(`"op":"` + op + `"`)
	for _, r := range recs {
		if strings.HasPrefix(r.Topic, prefix+".") && bytes.Contains(r.Value, needle) {
			n++
		}
	}
	return n
}

// hasEndMark reports whether prefix's message topic has the workload's end mark.
func hasEndMark(recs []*kgo.Record, prefix string) bool {
	for _, r := range recs {
		if r.Topic == prefix+".message" && bytes.Contains(r.Key, []byte(endMarkPrefix)) {
			return true
		}
	}
	return false
}

// endMark is the last transaction of a golden run: a message every consumer waits for.
const endMark = "SELECT pg_logical_emit_message(false, '" + endMarkPrefix + "', 'end')"

// snapshotRows is the number of rows setup.sql leaves for the copy.
const snapshotRows = 8

func writeGolden(t *testing.T, name string, recs []goldenRecord) {
	t.Helper()
	var buf bytes.Buffer
	for _, r := range recs {
		line, err := json.Marshal(r)
		require.NoError(t, err)
		buf.Write(line)
		buf.WriteByte('\n')
	}
	require.NoError(t, os.WriteFile(filepath.Join(goldenDir, name), buf.Bytes(), 0o644))
}

func readGolden(t *testing.T, name string) []goldenRecord {
	t.Helper()
	f, err := os.Open(filepath.Join(goldenDir, name))
	require.NoError(t, err)
	defer f.Close()
	var out []goldenRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r goldenRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		out = append(out, r)
	}
	require.NoError(t, sc.Err())
	return out
}

// TestCaptureDebezium captures Debezium's records of the golden workload into testdata (see
// goldenDir). It runs only when asked: Debezium is fetched from Maven Central, and the capture
// is committed.
func TestCaptureDebezium(t *testing.T) {
	if os.Getenv(captureEnv) != "1" {
		t.Skip("set " + captureEnv + "=1 to capture Debezium's golden records (minutes; rewrites testdata/debezium)")
	}
	kafkatest.Check(t)
	out, err := exec.Command("bash", "../bench/debezium/install").Output()
	require.NoError(t, err)
	dbz := strings.TrimSpace(string(out[bytes.LastIndexByte(bytes.TrimSpace(out), '\n')+1:]))
	ctx := pgtest.Context(t, 10*time.Minute)
	srv := pgtest.Shared(t, goldenMajor)
	c := kafkatest.Start(t, 1)
	db := pgtest.NewDatabase(t, srv)
	runBlocks(t, ctx, srv.ConnString(db), sqlBlocks(t, "setup.sql"))

	rec := record(t, c, "golden", "plain")
	connector := func(name string, schemas bool) map[string]string {
		return map[string]string{
			"name":                              name,
			"connector.class":                   "io.debezium.connector.postgresql.PostgresConnector",
			"tasks.max":                         "1",
			"plugin.name":                       "pgoutput",
			"database.hostname":                 "127.0.0.1",
			"database.port":                     fmt.Sprint(srv.Port()),
			"database.user":                     "postgres",
			"database.password":                 "unused",
			"database.dbname":                   db,
			"topic.prefix":                      name,
			"slot.name":                         name,
			"publication.name":                  "golden",
			"publication.autocreate.mode":       "disabled",
			"snapshot.mode":                     "initial",
			"skipped.operations":                "none",
			"provide.transaction.metadata":      "true",
			"topic.creation.default.partitions": "1",
			"topic.creation.default.replication.factor": "1",
			"key.converter":                  "org.apache.kafka.connect.json.JsonConverter",
			"value.converter":                "org.apache.kafka.connect.json.JsonConverter",
			"key.converter.schemas.enable":   fmt.Sprint(schemas),
			"value.converter.schemas.enable": fmt.Sprint(schemas),
			// JsonConverter writes a column's default in place of NULL unless told not to: the
			// faithful form, and what pgreorder writes.
			"key.converter.replace.null.with.default":   "false",
			"value.converter.replace.null.with.default": "false",
		}
	}
	k := kafkatest.StartConnect(t, c, kafkatest.ConnectOptions{
		ClassPath:  []string{filepath.Join(dbz, "connect", "*")},
		PluginPath: filepath.Join(dbz, "plugins"),
		Worker:     map[string]string{"topic.creation.enable": "true"},
		Connectors: []map[string]string{connector("golden", true), connector("plain", false)},
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Kafka Connect's log:\n%s", k.LogTail())
		}
	})
	failed := func() error { return errorsJoin(k.Failed(ctx, "golden"), k.Failed(ctx, "plain")) }
	rec.wait(t, "Debezium's snapshots", 3*time.Minute, failed, func(recs []*kgo.Record) bool {
		return countOps(recs, "golden", "r") >= snapshotRows && countOps(recs, "plain", "r") >= snapshotRows
	})
	// Debezium streams from the snapshot's slot once the snapshot is done: wait until both slots
	// are active, so that the changes are not read as part of the snapshot.
	waitSlotsActive(t, ctx, srv.ConnString(db), "golden", "plain")
	runBlocks(t, ctx, srv.ConnString(db), append(sqlBlocks(t, "changes.sql"), endMark))
	rec.wait(t, "the end mark", 3*time.Minute, failed, func(recs []*kgo.Record) bool {
		return hasEndMark(recs, "golden") && hasEndMark(recs, "plain")
	})
	writeGolden(t, "debezium-schemas.jsonl", rec.records("golden"))
	writeGolden(t, "debezium-plain.jsonl", rec.records("plain"))
	t.Logf("captured %d and %d records", len(rec.records("golden")), len(rec.records("plain")))
}

func errorsJoin(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// waitSlotsActive waits until every slot named is in use by a walsender.
func waitSlotsActive(t *testing.T, ctx context.Context, dsn string, slots ...string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for {
		var n int
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = ANY($1)", slots).Scan(&n))
		if n == len(slots) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("slots %v not active: %v", slots, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// goldenRun is one run of the golden workload through a Sink: its prefix and records, topic by
// topic in the order of each topic's single partition, as the golden files hold them.
type goldenRun struct {
	prefix  string
	records []goldenRecord
}

// runGolden runs the golden workload on a fresh database of srv through two Sinks, one writing
// keys and values with Connect schemas and one without, and returns their records (the offsets
// topics left out).
func runGolden(t *testing.T, ctx context.Context, c *kafkatest.Cluster, srv *pgtest.Server) (schemas, plain goldenRun) {
	t.Helper()
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	runBlocks(t, ctx, dsn, sqlBlocks(t, "setup.sql"))
	schemas.prefix, plain.prefix = newPrefix(t), newPrefix(t)
	rec := record(t, c, schemas.prefix, plain.prefix)
	for _, run := range []struct {
		prefix string
		format kafkasink.RecordFormat
	}{{schemas.prefix, kafkasink.FormatJSONSchema}, {plain.prefix, kafkasink.FormatJSON}} {
		cfg := changefeed.Config{Replication: replication.Config{ConnString: dsn, Slot: run.prefix, Publications: []string{"golden"},
			Messages: true, Buffer: reorderbuffer.Config{WorkMem: 64 << 10}}, Logger: testLogger}
		start(t, ctx, cfg, kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: run.prefix, Tombstones: true, KeyFormat: run.format,
			ValueFormat: run.format, Format: format.Config{Server: run.prefix}})
	}
	rec.wait(t, "the copies", 2*time.Minute, nil, func(recs []*kgo.Record) bool {
		return countOps(recs, schemas.prefix, "r") >= snapshotRows && countOps(recs, plain.prefix, "r") >= snapshotRows
	})
	runBlocks(t, ctx, dsn, append(sqlBlocks(t, "changes.sql"), endMark))
	rec.wait(t, "the end mark", 2*time.Minute, nil, func(recs []*kgo.Record) bool {
		return hasEndMark(recs, schemas.prefix) && hasEndMark(recs, plain.prefix)
	})
	keep := func(prefix string) []goldenRecord {
		var out []goldenRecord
		for _, r := range rec.records(prefix) {
			if r.Topic != prefix+".offsets" {
				out = append(out, r)
			}
		}
		return out
	}
	schemas.records, plain.records = keep(schemas.prefix), keep(plain.prefix)
	// What the masks hide: source.db is the database's name, read from the connection; copied
	// rows carry the snapshot's LSN.
	for _, r := range plain.records {
		var ev struct {
			Op     string `json:"op"`
			Source struct {
				DB  string  `json:"db"`
				LSN *uint64 `json:"lsn"`
			} `json:"source"`
		}
		if r.Value == nil || string(r.Value) == "null" || strings.HasSuffix(r.Topic, ".message") {
			continue
		}
		require.NoError(t, json.Unmarshal(r.Value, &ev))
		require.Equal(t, db, ev.Source.DB, "source.db of %s", r.Value)
		require.NotNil(t, ev.Source.LSN, "source.lsn of %s", r.Value)
	}
	return schemas, plain
}

// The differences the golden comparison allows between Debezium's records and ours; each is
// masked by normalize, and docs/kafka.md lists them for users.
//
//   - source.connector and source.version name the producer ("postgresql" and Debezium's version;
//     "pgreorder" and ours).
//   - Debezium's __debezium.context.* headers name its connector, task and run; we write none.
//   - source.snapshot: Debezium marks the first and last copied rows (first,
//     first_in_data_collection, last_in_data_collection, last); every row we copy says "true"
//     (the copy is parallel: which row is last is known only at the end).
//   - source.txId of a copied row: Debezium's snapshot transaction has one (it calls
//     txid_current()); our copy reads an exported snapshot and has none: null.
//   - source.sequence of a streamed change: Debezium's "[lastCommitLsn, lsn]"; ours null: we keep
//     no LSN per change, only the transaction's commit LSN (source.lsn).
//   - A delete from a table without a key is followed, in Debezium, by a tombstone with a null
//     key, which log compaction cannot use (and a compacted topic refuses); we write none.
//   - Debezium's PREFIX.transaction topic (provide.transaction.metadata) is not written: our
//     events always carry the transaction block, and a read_committed consumer sees each source
//     transaction whole.
//
// Values that differ from one run to the next are masked too: times, transaction ids, LSNs, the
// database's name.

// normalize returns the records of a golden run with the allowed differences masked, the topic
// prefix replaced by "golden", and the topics left out that only Debezium writes.
func normalize(t *testing.T, prefix string, recs []goldenRecord) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, r := range recs {
		topic := "golden" + strings.TrimPrefix(r.Topic, prefix)
		if topic == "golden.transaction" {
			continue
		}
		var headers []goldenHeader
		for _, h := range r.Headers {
			if !strings.HasPrefix(h.Key, "__debezium.context.") {
				headers = append(headers, h)
			}
		}
		key, value := normalizeJSON(t, prefix, r.Key, false), normalizeJSON(t, prefix, r.Value, false)
		if key == "null" && value == "null" {
			continue // a tombstone of a table without key
		}
		line, err := json.MarshalIndent(map[string]any{"key": json.RawMessage(key), "value": json.RawMessage(value), "headers": headers}, "", "  ")
		require.NoError(t, err)
		out[topic] = append(out[topic], string(line))
	}
	return out
}

// normalizeJSON returns a record's key or value, or a Connect schema (isSchema), masked.
func normalizeJSON(t *testing.T, prefix string, raw json.RawMessage, isSchema bool) string {
	t.Helper()
	if len(raw) == 0 {
		return "null"
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), string(raw))
	if isSchema {
		v = renamePrefix(v, prefix)
	} else if m, ok := v.(map[string]any); ok {
		if p, ok := m["payload"]; ok {
			m["payload"] = maskEvent(p)
			m["schema"] = renamePrefix(m["schema"], prefix)
		} else {
			v = maskEvent(m)
		}
	}
	b, err := json.Marshal(canonNumbers(v))
	require.NoError(t, err)
	return string(b)
}

// maskEvent masks what differs by run and what the comparison allows in an event's value.
func maskEvent(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	for _, k := range []string{"ts_ms", "ts_us", "ts_ns"} {
		if _, ok := m[k]; ok {
			m[k] = "<time>"
		}
	}
	if tx, ok := m["transaction"].(map[string]any); ok {
		tx["id"] = "<xid:lsn>"
	}
	src, ok := m["source"].(map[string]any)
	if !ok {
		return m
	}
	switch src["snapshot"] {
	case "first", "first_in_data_collection", "last_in_data_collection", "last":
		src["snapshot"] = "true"
	case nil:
		src["snapshot"] = "false" // what JsonConverter writes by default: the field's default
	}
	for k, mask := range map[string]string{"version": "<version>", "connector": "<connector>", "name": "<name>", "db": "<db>",
		"ts_ms": "<time>", "ts_us": "<time>", "ts_ns": "<time>", "txId": "<txid>", "lsn": "<lsn>", "sequence": "<sequence>"} {
		if src[k] != nil || k == "txId" && src["snapshot"] != "false" || k == "sequence" {
			src[k] = mask
		}
	}
	return m
}

// renamePrefix replaces the run's topic prefix with "golden" in Connect schema names.
func renamePrefix(v any, prefix string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "name" && strings.HasPrefix(s, prefix+".") {
				v[k] = "golden" + strings.TrimPrefix(s, prefix)
			} else {
				v[k] = renamePrefix(x, prefix)
			}
		}
	case []any:
		for i, x := range v {
			v[i] = renamePrefix(x, prefix)
		}
	}
	return v
}

// canonNumbers writes every JSON number in one form (Jackson writes 1.0E300 and 0.0, Go 1e+300
// and 0), so that equal numbers compare equal.
func canonNumbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		var r big.Rat
		if _, ok := r.SetString(string(v)); ok {
			return "num:" + r.RatString()
		}
		return "num:" + string(v)
	case map[string]any:
		for k, x := range v {
			v[k] = canonNumbers(x)
		}
	case []any:
		for i, x := range v {
			v[i] = canonNumbers(x)
		}
	}
	return v
}

// TestDebeziumGolden: the golden workload's records through pgreorder equal Debezium's (captured
// in testdata), field for field, with and without Connect schemas: the same topics, keys,
// headers, and values (before, after, op, source, transaction), but for the differences listed
// above normalize.
func TestDebeziumGolden(t *testing.T) {
	c := kafkatest.Shared(t)
	srv := pgtest.Shared(t, goldenMajor)
	ctx := pgtest.Context(t, 5*time.Minute)
	schemas, plain := runGolden(t, ctx, c, srv)
	for _, run := range []struct {
		name   string
		ours   goldenRun
		golden string
	}{{"schemas", schemas, "debezium-schemas.jsonl"}, {"plain", plain, "debezium-plain.jsonl"}} {
		t.Run(run.name, func(t *testing.T) {
			want := normalize(t, strings.TrimSuffix(strings.SplitN(readGolden(t, run.golden)[0].Topic, ".", 2)[0], "."), readGolden(t, run.golden))
			got := normalize(t, run.ours.prefix, run.ours.records)
			require.ElementsMatch(t, slices.Collect(maps.Keys(want)), slices.Collect(maps.Keys(got)), "topics")
			failures := 0
			for _, topic := range slices.Sorted(maps.Keys(want)) {
				w, g := want[topic], got[topic]
				for i := range min(len(w), len(g)) {
					if !assert.Equal(t, w[i], g[i], "topic %s, record %d of %d (Debezium's first)", topic, i+1, len(w)) {
						failures++
					}
					if failures >= 8 {
						t.FailNow()
					}
				}
				assert.Len(t, g, len(w), "records of topic %s", topic)
			}
		})
	}
	// Kafka Connect makes of our records what it makes of Debezium's: the same Structs, schemas
	// and headers, read by JsonConverter (schemas.enable=true) in a sink.
	t.Run("connect", func(t *testing.T) {
		golden := readGolden(t, "debezium-schemas.jsonl")
		prefix := newPrefix(t)
		theirTopics := produceGolden(t, ctx, c, golden, prefix)
		var ourTopics []string
		for _, r := range schemas.records {
			if !slices.Contains(ourTopics, r.Topic) {
				ourTopics = append(ourTopics, r.Topic)
			}
		}
		got := connectRecords(t, c, append(theirTopics, ourTopics...), len(golden)+len(schemas.records))
		want, ours := normalizeConnect(t, prefix, got), normalizeConnect(t, schemas.prefix, got)
		require.ElementsMatch(t, slices.Collect(maps.Keys(want)), slices.Collect(maps.Keys(ours)), "topics")
		for _, topic := range slices.Sorted(maps.Keys(want)) {
			require.Equal(t, want[topic], ours[topic], "topic %s: what Connect made of Debezium's records and of ours", topic)
		}
	})
}

// normalizeConnect returns what Connect made of the records of the topics of prefix, masked as
// normalize masks the records, by topic.
func normalizeConnect(t *testing.T, prefix string, got map[string][]connectRecord) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for topic, recs := range got {
		rest, ok := strings.CutPrefix(topic, prefix+".")
		if !ok || rest == "transaction" {
			continue
		}
		for _, r := range recs {
			if r.Key.isNull() && r.Value.isNull() {
				continue // a tombstone of a table without key (Debezium's)
			}
			var headers []connectHeader
			for _, h := range r.Headers {
				if !strings.HasPrefix(h.Key, "__debezium.context.") {
					headers = append(headers, h)
				}
			}
			norm := func(d connectData) map[string]any {
				schema, err := json.Marshal(d.Schema)
				require.NoError(t, err)
				return map[string]any{"schema": json.RawMessage(normalizeJSON(t, prefix, schema, true)),
					"value": json.RawMessage(normalizeJSON(t, prefix, d.Value, false))}
			}
			line, err := json.MarshalIndent(map[string]any{"key": norm(r.Key), "value": norm(r.Value), "headers": headers}, "", "  ")
			require.NoError(t, err)
			out["golden."+rest] = append(out["golden."+rest], string(line))
		}
	}
	return out
}
