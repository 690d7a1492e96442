package kafkasink_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// The print sink (testdata/connect): a Kafka Connect sink connector whose task appends to a file
// one JSON line per record, saying what Connect's converters made of it.
const (
	printSinkSources   = "testdata/connect"
	printSinkConnector = "pgreorder.connect.PrintSinkConnector"
)

// connectRecord is what Kafka Connect made of one Kafka record, as the print sink renders the
// SinkRecord its converters (JsonConverter with schemas.enable=true for the key and the value,
// SimpleHeaderConverter for the headers) gave it.
type connectRecord struct {
	Topic     string          `json:"topic"`
	Partition int32           `json:"partition"`
	Offset    int64           `json:"offset"`
	Key       connectData     `json:"key"`
	Value     connectData     `json:"value"`
	Headers   []connectHeader `json:"headers"`
	// Line is the print sink's line, whole.
	Line json.RawMessage `json:"-"`
}

// connectData is a key or a value as Connect data: its schema, nil when it has none (a null key
// or value, a tombstone), and the value, rendered as JSON: a Struct as an object of its fields in
// the schema's order (a null field null, even when its schema has a default), an array as an
// array, a map as an array of [key, value] pairs sorted by key, bytes as base64, a BigDecimal
// (Decimal) as its plain string, a java.util.Date (Date, Time, Timestamp) as epoch milliseconds,
// NaN and infinite floats as the strings "NaN", "Infinity", "-Infinity", other primitives as
// themselves.
type connectData struct {
	Schema *connectSchema  `json:"schema"`
	Value  json.RawMessage `json:"value"`
}

// connectSchema is a Connect schema: Type is Connect's name of the type (Schema.Type.getName:
// "int32", "float64", "struct", ...; JsonConverter's JSON says "double" and "float" for float64
// and float32), Name the logical type's or the struct's name; Default, rendered as a value is, is
// absent (nil) when it has none.
type connectSchema struct {
	Type       string            `json:"type"`
	Name       string            `json:"name,omitempty"`
	Version    *int              `json:"version,omitempty"`
	Parameters map[string]string `json:"parameters,omitempty"`
	Optional   bool              `json:"optional"`
	Default    json.RawMessage   `json:"default,omitempty"`
	Doc        string            `json:"doc,omitempty"`
	Fields     []connectField    `json:"fields,omitempty"` // a struct's, in order
	Items      *connectSchema    `json:"items,omitempty"`  // an array's
	Keys       *connectSchema    `json:"keys,omitempty"`   // a map's
	Values     *connectSchema    `json:"values,omitempty"` // a map's
}

type connectField struct {
	Name   string        `json:"name"`
	Index  int           `json:"index"`
	Schema connectSchema `json:"schema"`
}

// connectHeader is a header as Connect data: the schema type and name SimpleHeaderConverter
// inferred from the bytes ("" when none), and the value written back as a string (nil when null).
type connectHeader struct {
	Key   string  `json:"key"`
	Type  string  `json:"type"`
	Name  string  `json:"name"`
	Value *string `json:"value"`
}

// isNull reports whether d is null (a null key, a tombstone's value, a null field).
func (d connectData) isNull() bool {
	return len(d.Value) == 0 || string(d.Value) == "null"
}

// field returns field name of a struct d: its schema and its value. It returns the zero
// connectData (no schema, no value) when d is no struct, is null or has no such field.
func (d connectData) field(name string) connectData {
	if d.Schema == nil || d.Schema.Type != "struct" || d.isNull() {
		return connectData{}
	}
	for _, f := range d.Schema.Fields {
		if f.Name == name {
			var m map[string]json.RawMessage
			if json.Unmarshal(d.Value, &m) != nil {
				return connectData{}
			}
			return connectData{Schema: &f.Schema, Value: m[name]}
		}
	}
	return connectData{}
}

// header returns the record's header key, or nil.
func (r connectRecord) header(key string) *connectHeader {
	for i := range r.Headers {
		if r.Headers[i].Key == key {
			return &r.Headers[i]
		}
	}
	return nil
}

var printSinks atomic.Int64

// connectRecords runs the print sink (testdata/connect) in a Kafka Connect worker of its own
// (standalone, kafkatest.StartConnect) over the topics of cluster c, from their start, read
// committed, and returns what Connect made of their records, per topic in order (by partition,
// then offset), once the sink has written want records in all (all it has written by then: want
// or more; the caller checks the count). The worker converts keys and
// values with JsonConverter, schemas.enable=true and replace.null.with.default=false (as
// Debezium's golden records were made), headers with SimpleHeaderConverter, and
// errors.tolerance=none: a record that does not convert fails the task, and t with the worker's
// log. It skips t (fails it with PGREORDER_REQUIRE_KAFKA=1) without a Connect worker or javac,
// which compiles the sink against kafkatest.ConnectLib(). The worker is gone when it returns.
func connectRecords(t *testing.T, c *kafkatest.Cluster, topics []string, want int) map[string][]connectRecord {
	t.Helper()
	kafkatest.CheckConnect(t)
	javac, err := exec.LookPath("javac")
	if err != nil {
		if os.Getenv(kafkatest.EnvRequire) == "1" {
			t.Fatalf("no javac command to compile the print sink (%s=1); %s", kafkatest.EnvRequire, kafkatest.HowToInstall)
		}
		t.Skipf("no javac command to compile the print sink; %s", kafkatest.HowToInstall)
	}
	ctx := pgtest.Context(t, 3*time.Minute)
	dir := t.TempDir()
	classes := filepath.Join(dir, "classes")
	srcs, err := filepath.Glob(filepath.Join(printSinkSources, "*.java"))
	require.NoError(t, err)
	require.NotEmpty(t, srcs)
	args := append([]string{"-nowarn", "-encoding", "UTF-8", "-d", classes, "-cp", filepath.Join(kafkatest.ConnectLib(), "*")}, srcs...)
	out, err := exec.CommandContext(ctx, javac, args...).CombinedOutput()
	require.NoError(t, err, "compiling the print sink: %s", out)
	// Found by the ServiceLoader, whatever the worker's plugin.discovery.
	services := filepath.Join(classes, "META-INF", "services")
	require.NoError(t, os.MkdirAll(services, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(services, "org.apache.kafka.connect.sink.SinkConnector"), []byte(printSinkConnector+"\n"), 0o644))

	file := filepath.Join(dir, "records.jsonl")
	start := time.Now()
	// The consumer group is connect-NAME: unique, as the cluster may be shared.
	name := fmt.Sprintf("print-%d-%d", os.Getpid(), printSinks.Add(1))
	k := kafkatest.StartConnect(t, c, kafkatest.ConnectOptions{
		ClassPath: []string{filepath.Join(kafkatest.ConnectLib(), "*"), classes},
		Worker: map[string]string{
			"key.converter":                             "org.apache.kafka.connect.json.JsonConverter",
			"value.converter":                           "org.apache.kafka.connect.json.JsonConverter",
			"key.converter.schemas.enable":              "true",
			"value.converter.schemas.enable":            "true",
			"key.converter.replace.null.with.default":   "false",
			"value.converter.replace.null.with.default": "false",
			"header.converter":                          "org.apache.kafka.connect.storage.SimpleHeaderConverter",
			"consumer.isolation.level":                  "read_committed",
			"consumer.auto.offset.reset":                "earliest",
			"consumer.fetch.max.wait.ms":                "100",
		},
		Connectors: []map[string]string{{
			"name":             name,
			"connector.class":  printSinkConnector,
			"tasks.max":        "1",
			"topics":           strings.Join(topics, ","),
			"file":             file,
			"errors.tolerance": "none",
		}},
	})
	defer k.Stop()
	started := time.Since(start)

	var lines [][]byte
	for {
		if err := k.Failed(ctx, name); err != nil {
			t.Fatalf("the print sink failed after %d of %d records: %v\nKafka Connect's log:\n%s", len(lines), want, err, k.LogTail())
		}
		lines = completeLines(t, file)
		if len(lines) >= want {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the print sink wrote %d of %d records: %v\nKafka Connect's log:\n%s", len(lines), want, context.Cause(ctx), k.LogTail())
		case <-time.After(100 * time.Millisecond):
		}
	}

	t.Logf("Kafka Connect converted %d records in %v (worker started in %v)", len(lines), time.Since(start).Round(time.Millisecond), started.Round(time.Millisecond))
	byTopic := map[string][]connectRecord{}
	for _, line := range lines {
		var r connectRecord
		require.NoError(t, json.Unmarshal(line, &r), "%s", line)
		r.Line = line
		byTopic[r.Topic] = append(byTopic[r.Topic], r)
	}
	for _, recs := range byTopic {
		slices.SortStableFunc(recs, func(a, b connectRecord) int {
			return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
		})
	}
	return byTopic
}

// completeLines returns the lines of the file that end with a newline (none when it is absent).
func completeLines(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var lines [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<26)
	for sc.Scan() {
		lines = append(lines, slices.Clone(sc.Bytes()))
	}
	require.NoError(t, sc.Err())
	return lines
}

// produceGolden writes the golden records into fresh topics of c, one partition each, their
// prefix "golden" replaced by prefix: key and value bytes as the golden file has them
// (compact JSON; nil for null), headers too. It returns the topics, sorted.
func produceGolden(t *testing.T, ctx context.Context, c *kafkatest.Cluster, golden []goldenRecord, prefix string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.MetadataMinAge(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	var topics []string
	var recs []*kgo.Record
	for _, g := range golden {
		topic, ok := strings.CutPrefix(g.Topic, "golden.")
		require.True(t, ok, g.Topic)
		topic = prefix + "." + topic
		if !slices.Contains(topics, topic) {
			topics = append(topics, topic)
		}
		r := &kgo.Record{Topic: topic, Key: jsonBytes(t, g.Key), Value: jsonBytes(t, g.Value)}
		for _, h := range g.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
		}
		recs = append(recs, r)
	}
	slices.Sort(topics)
	res, err := kadm.NewClient(cl).CreateTopics(ctx, 1, 1, nil, topics...)
	require.NoError(t, err)
	require.NoError(t, res.Error())
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
	return topics
}

// jsonBytes returns raw compacted, or nil for null.
func jsonBytes(t *testing.T, raw json.RawMessage) []byte {
	t.Helper()
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var buf bytes.Buffer
	require.NoError(t, json.Compact(&buf, raw))
	return buf.Bytes()
}

// jsonSchema is a schema as JsonConverter writes it with schemas.enable=true.
type jsonSchema struct {
	Type       string            `json:"type"`
	Optional   bool              `json:"optional"`
	Name       string            `json:"name"`
	Version    *int              `json:"version"`
	Parameters map[string]string `json:"parameters"`
	Default    json.RawMessage   `json:"default"`
	Doc        string            `json:"doc"`
	Field      string            `json:"field"`
	Fields     []jsonSchema      `json:"fields"`
	Items      *jsonSchema       `json:"items"`
	Keys       *jsonSchema       `json:"keys"`
	Values     *jsonSchema       `json:"values"`
}

// connectSchema returns the Connect schema JsonConverter reads from s.
func (s *jsonSchema) connectSchema(t *testing.T) *connectSchema {
	t.Helper()
	if s == nil {
		return nil
	}
	c := &connectSchema{Type: s.Type, Name: s.Name, Version: s.Version, Parameters: s.Parameters, Optional: s.Optional, Doc: s.Doc}
	switch s.Type {
	case "float":
		c.Type = "float32"
	case "double":
		c.Type = "float64"
	}
	for i, f := range s.Fields {
		c.Fields = append(c.Fields, connectField{Name: f.Field, Index: i, Schema: *f.connectSchema(t)})
	}
	c.Items, c.Keys, c.Values = s.Items.connectSchema(t), s.Keys.connectSchema(t), s.Values.connectSchema(t)
	if len(s.Default) > 0 && string(s.Default) != "null" {
		d, err := json.Marshal(renderPayload(t, c, decodeJSON(t, s.Default)))
		require.NoError(t, err)
		c.Default = d
	}
	return c
}

// renderPayload returns what the print sink renders of payload, a value of schema s as
// JsonConverter writes it (decoded by decodeJSON), once JsonConverter read it back.
func renderPayload(t *testing.T, s *connectSchema, payload any) any {
	t.Helper()
	if s == nil || payload == nil {
		return payload
	}
	switch s.Type {
	case "struct":
		m := payload.(map[string]any)
		out := map[string]any{}
		for _, f := range s.Fields {
			out[f.Name] = renderPayload(t, &f.Schema, m[f.Name])
		}
		return out
	case "array":
		out := []any{}
		for _, v := range payload.([]any) {
			out = append(out, renderPayload(t, s.Items, v))
		}
		return out
	case "map":
		// JsonConverter writes a map of string keys as an object, others as [key, value] pairs;
		// the print sink renders [key, value] pairs sorted by key.
		var pairs [][]any
		switch m := payload.(type) {
		case map[string]any:
			for k, v := range m {
				pairs = append(pairs, []any{renderPayload(t, s.Keys, k), renderPayload(t, s.Values, v)})
			}
		case []any:
			for _, p := range m {
				kv := p.([]any)
				pairs = append(pairs, []any{renderPayload(t, s.Keys, kv[0]), renderPayload(t, s.Values, kv[1])})
			}
		}
		slices.SortFunc(pairs, func(a, b []any) int {
			ka, _ := json.Marshal(a[0])
			kb, _ := json.Marshal(b[0])
			return bytes.Compare(ka, kb)
		})
		out := []any{}
		for _, p := range pairs {
			out = append(out, p)
		}
		return out
	case "bytes":
		if s.Name == "org.apache.kafka.connect.data.Decimal" {
			b, err := base64.StdEncoding.DecodeString(payload.(string))
			require.NoError(t, err)
			scale, err := strconv.Atoi(s.Parameters["scale"])
			require.NoError(t, err)
			return decimalString(b, scale)
		}
	case "float32", "float64":
		// Jackson writes NaN and the infinities as strings, which JsonConverter reads as 0.
		if _, ok := payload.(string); ok {
			return int64(0)
		}
	case "int32":
		if s.Name == "org.apache.kafka.connect.data.Date" {
			return payload.(int64) * 86400000
		}
	}
	return payload
}

// decimalString writes the big-endian two's complement unscaled value b of a Decimal of scale
// scale as BigDecimal.toPlainString does.
func decimalString(b []byte, scale int) string {
	v := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if scale <= 0 {
		return v.Mul(v, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-scale)), nil)).String()
	}
	neg := v.Sign() < 0
	digits := new(big.Int).Abs(v).String()
	if len(digits) <= scale {
		digits = strings.Repeat("0", scale-len(digits)+1) + digits
	}
	out := digits[:len(digits)-scale] + "." + digits[len(digits)-scale:]
	if neg {
		out = "-" + out
	}
	return out
}

// decodeJSON decodes raw with its numbers as int64 where they are integers, float64 otherwise,
// so that the same number written two ways compares equal.
func decodeJSON(t *testing.T, raw []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), "%s", raw)
	return numbers(t, v)
}

func numbers(t *testing.T, v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, err := v.Float64()
		require.NoError(t, err)
		if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return int64(f)
		}
		return f
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(t, e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(t, e)
		}
	}
	return v
}

// canonical returns v as decodeJSON decodes its JSON.
func canonical(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	return decodeJSON(t, raw)
}

// checkConverted checks that c is what JsonConverter makes of the key or value raw, as the
// golden file has it ({"schema":…,"payload":…}, or null): the schema it says, and its payload.
func checkConverted(t *testing.T, what string, raw json.RawMessage, c connectData) {
	t.Helper()
	if len(raw) == 0 || string(raw) == "null" {
		require.Nil(t, c.Schema, what)
		require.True(t, c.isNull(), "%s: %s", what, c.Value)
		return
	}
	var env struct {
		Schema  *jsonSchema     `json:"schema"`
		Payload json.RawMessage `json:"payload"`
	}
	require.NoError(t, json.Unmarshal(raw, &env), what)
	want := env.Schema.connectSchema(t)
	require.Equal(t, canonical(t, want), canonical(t, c.Schema), "%s: schema", what)
	require.Equal(t, canonical(t, renderPayload(t, want, decodeJSON(t, env.Payload))), decodeJSON(t, c.Value), "%s: value", what)
}

// TestConnectReadsDebeziumRecords runs Debezium's golden records (testdata/debezium, schemas
// on) through Kafka Connect's JsonConverter (connectRecords): every one converts, to the schema
// and the payload Debezium wrote (but for NaN and infinite floats), and some are checked by hand.
// The transaction metadata topic's records are included: they are Debezium's records too (a
// struct with an array of structs, no headers), and a sink reading them must convert them.
func TestConnectReadsDebeziumRecords(t *testing.T) {
	kafkatest.CheckConnect(t)
	ctx := pgtest.Context(t, 3*time.Minute)
	c := kafkatest.Shared(t)
	golden := readGolden(t, "debezium-schemas.jsonl")
	prefix := newPrefix(t)
	topics := produceGolden(t, ctx, c, golden, prefix)
	got := connectRecords(t, c, topics, len(golden))

	wantCount := map[string]int{}
	for _, g := range golden {
		wantCount[prefix+strings.TrimPrefix(g.Topic, "golden")]++
	}
	gotCount := map[string]int{}
	for topic, recs := range got {
		gotCount[topic] = len(recs)
	}
	require.Equal(t, wantCount, gotCount)

	// Every record is what Debezium wrote, but for floats: NaN and the infinities, which Jackson
	// writes as strings, read as 0.
	byTopic := map[string][]goldenRecord{}
	for _, g := range golden {
		topic := prefix + strings.TrimPrefix(g.Topic, "golden")
		byTopic[topic] = append(byTopic[topic], g)
	}
	for topic, recs := range got {
		for i, r := range recs {
			g := byTopic[topic][i]
			what := fmt.Sprintf("%s/%d", topic, r.Offset)
			checkConverted(t, what+" key", g.Key, r.Key)
			checkConverted(t, what+" value", g.Value, r.Value)
			require.Len(t, r.Headers, len(g.Headers), what)
			for j, h := range g.Headers {
				require.Equal(t, h.Key, r.Headers[j].Key, what)
				require.NotNil(t, r.Headers[j].Value, what)
				require.Equal(t, h.Value, *r.Headers[j].Value, "%s: header %s", what, h.Key)
			}
		}
	}

	types := got[prefix+".public.types"]
	require.Len(t, types, 10)
	// The first row copied.
	first := types[0].Value
	require.Equal(t, "golden.public.types.Envelope", first.Schema.Name)
	require.Equal(t, `"r"`, string(first.field("op").Value))
	after := first.field("after")
	n52 := after.field("n52")
	require.Equal(t, "bytes", n52.Schema.Type)
	require.Equal(t, "org.apache.kafka.connect.data.Decimal", n52.Schema.Name)
	require.Equal(t, map[string]string{"scale": "2", "connect.decimal.precision": "5"}, n52.Schema.Parameters)
	require.Equal(t, `"123.45"`, string(n52.Value))
	ts := after.field("ts")
	require.Equal(t, "int64", ts.Schema.Type)
	require.Equal(t, "io.debezium.time.MicroTimestamp", ts.Schema.Name)
	require.Equal(t, "1709210096789012", string(ts.Value))
	n := after.field("n")
	require.Equal(t, "io.debezium.data.VariableScaleDecimal", n.Schema.Name)
	require.Equal(t, `{"scale":9,"value":"J+QbMka+ybFuOYEV"}`, string(n.Value))
	require.Equal(t, `"3q2+7w=="`, string(after.field("by").Value))
	require.Equal(t, `[1,2,3]`, string(after.field("ai").Value))
	require.Equal(t, `["a","b c",null]`, string(after.field("at").Value))
	nn := after.field("nn")
	require.False(t, nn.Schema.Optional)
	require.Equal(t, `"x"`, string(nn.Schema.Default))
	taskID := types[0].header("__debezium.context.taskId")
	require.NotNil(t, taskID)
	require.Equal(t, "int8", taskID.Type) // SimpleHeaderConverter infers a type from the text
	// The row streamed with NaN and infinities: Connect reads them as 0.
	third := types[2].Value.field("after")
	require.Equal(t, "3", string(third.field("id").Value))
	require.Equal(t, "float32", third.field("f4").Schema.Type)
	require.Equal(t, "0.0", string(third.field("f4").Value))
	require.Equal(t, "0.0", string(third.field("f8").Value))
	// The last: a delete's tombstone, its key kept.
	tomb := types[9]
	require.Nil(t, tomb.Value.Schema)
	require.True(t, tomb.Value.isNull())
	require.Equal(t, `{"id":3}`, string(tomb.Key.Value))

	// A null field whose schema has a default stays null (replace.null.with.default=false).
	reqd := got[prefix+".public.reqd"]
	require.Len(t, reqd, 3)
	before := reqd[1].Value.field("before")
	bd := before.field("bd")
	require.Equal(t, "true", string(bd.Schema.Default))
	require.True(t, bd.isNull())
	require.Equal(t, `"1.50"`, string(before.field("n2").Schema.Default))

	// A primary key changed: the delete under the old key says the new one in a header, which
	// SimpleHeaderConverter reads as a map.
	fullpk := got[prefix+".public.fullpk"]
	var newkey *connectHeader
	for _, r := range fullpk {
		if h := r.header("__debezium.newkey"); h != nil && string(r.Value.field("op").Value) == `"d"` {
			newkey = h
			require.Equal(t, `{"id":100}`, string(r.Key.Value))
		}
	}
	require.NotNil(t, newkey)
	require.Equal(t, "map", newkey.Type)
	require.Equal(t, `{"id":101}`, *newkey.Value)

	// No key: null, without a schema.
	nokey := got[prefix+".public.nokey"]
	require.Nil(t, nokey[0].Key.Schema)
	require.True(t, nokey[0].Key.isNull())

	// Transaction metadata: an array of structs.
	txs := got[prefix+".transaction"]
	end := txs[len(txs)-1].Value
	require.Equal(t, `"END"`, string(end.field("status").Value))
	dc := end.field("data_collections")
	require.Equal(t, "array", dc.Schema.Type)
	require.Equal(t, "event.collection", dc.Schema.Items.Name)
	require.Equal(t, `[{"data_collection":"public.keyed","event_count":1},{"data_collection":"public.types","event_count":1}]`, string(dc.Value))
}
