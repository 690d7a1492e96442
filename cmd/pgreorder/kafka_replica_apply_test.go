package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// The replica applier of the Kafka replica tests: it applies Debezium change events (JSON
// converter, schemas off) to tables of a PostgreSQL database, one table per topic, as a consumer
// that keeps a copy of the source would, so that a test can check that the copy equals the
// source. TestKafkaReplicaGolden checks the applier against Debezium's own records of the golden
// workload (kafkasink/testdata/debezium); TestKafkaReplicaCrash (kafka_replica_test.go) applies
// what `pgreorder kafka` wrote while it was killed again and again.
//
// Semantics, per event (value):
//
//   - "r", "c": insert after. A "c" of a key change (header __debezium.oldkey) takes its
//     unavailable values (unchanged TOASTed values, which the server does not send) from the row
//     that the "d" of the old key (header __debezium.newkey) deleted: the replica's old value.
//   - "u": the row identified by the record key (a keyless table: the row equal to before) becomes
//     after; columns whose value is "__debezium_unavailable_value" (an unchanged TOASTed value)
//     keep the replica's value.
//   - "d": delete the row identified by the key (keyless: one row equal to before).
//   - "t": truncate the table.
//   - a tombstone (null value), a logical message ("m") and anything else without one of these
//     ops (transaction metadata) does nothing.
//
// The key's columns identify the row; before is never used for that in a keyed table: in a delete
// of a REPLICA IDENTITY DEFAULT table its other columns are placeholders. Where the source table
// is REPLICA IDENTITY FULL, before is the whole old row, and the applier checks it against the
// replica's row.
//
// What contradicts the source's history is an anomaly, collected (Anomalies) rather than fatal,
// and the applier goes on as a lenient consumer would: an update of a key the replica lacks
// inserts after (so a row whose key changed in a "u" is left behind, stale); a delete of a
// missing row does nothing; a "u" whose before or after names another key than the record's is
// noted (a key change must be a "d" of the old key and a "c" of the new). Malformed events (a
// column the table lacks, a value of the wrong JSON type) are errors.
//
// Values are converted back to PostgreSQL's text input as Debezium's default converters write
// them: integers and floats as numbers (NaN and ±Infinity as strings); bool; numeric(p,s) as the
// base64 of the big-endian two's-complement unscaled value, numeric without a typmod as
// {"scale":N,"value":base64} (a decimal string, as decimal.handling.mode=string gives, is taken
// too); date as days since 1970 (Debezium's ±infinity are its overflowed day numbers);
// timestamp as microseconds, timestamp(0..3) as milliseconds (±infinity as the JDBC driver's
// constants); time likewise; interval as microseconds (months of 30.4375 days; an ISO 8601
// string is taken too); bytea as base64; arrays as JSON arrays; timestamptz, timetz, uuid, json,
// jsonb, enums, text and every other type as the string itself. Debezium's conversions of
// interval (months and days become microseconds) and of numeric without typmod (trailing zeros
// dropped, NaN null) lose information: dbzDiff compares those columns by what survives
// (dbzRenderExpr).

// dbzUnavailable is Debezium's value for an unchanged TOASTed value the server did not send.
const dbzUnavailable = "__debezium_unavailable_value"

// dbzRecord is one Kafka record of change events.
type dbzRecord struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte // nil: a null key
	Value     []byte // nil: a tombstone
	Headers   [][2]string
}

// Debezium's headers of a key change: the delete of the old key names the new, the create of the
// new key names the old.
const (
	dbzHeaderNewKey = "__debezium.newkey"
	dbzHeaderOldKey = "__debezium.oldkey"
)

func (r *dbzRecord) header(key string) (string, bool) {
	for _, h := range r.Headers {
		if h[0] == key {
			return h[1], true
		}
	}
	return "", false
}

func (r *dbzRecord) String() string {
	return fmt.Sprintf("%s[%d]@%d key %s", r.Topic, r.Partition, r.Offset, dbzOrNull(r.Key))
}

func dbzOrNull(b []byte) string {
	if b == nil {
		return "null"
	}
	return string(b)
}

// dbzTopic is the topic of a table: PREFIX.SCHEMA.TABLE, characters other than letters, digits,
// '.', '_' and '-' replaced by '_'.
func dbzTopic(prefix, schema, table string) string {
	return prefix + "." + dbzTopicChars.ReplaceAllString(schema, "_") + "." + dbzTopicChars.ReplaceAllString(table, "_")
}

var dbzTopicChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// dbzKind is how a column's values are written in events.
type dbzKind int

const (
	dbzString    dbzKind = iota // the string is the value's text
	dbzInt                      // a JSON number
	dbzFloat                    // a JSON number, or "NaN", "Infinity", "-Infinity"
	dbzBool                     // true, false
	dbzNumeric                  // base64 dbzUnscaled value, or {"scale","value"}
	dbzBytea                    // base64
	dbzDate                     // days since 1970-01-01
	dbzTimestamp                // microseconds (milliseconds) since 1970-01-01 00:00
	dbzTime                     // microseconds (milliseconds) since midnight
	dbzInterval                 // microseconds
	dbzArray                    // a JSON array of the elements
)

// dbzColumn is a column of a table, as the applier converts its values.
type dbzColumn struct {
	name   string
	typ    string // format_type: the type to cast the text to
	kind   dbzKind
	scale  int        // numeric: the typmod's scale; -1: no typmod
	millis bool       // timestamp, time of precision 0 to 3: milliseconds
	noEq   bool       // the type has no equality operator (json, xml): compare texts
	elem   *dbzColumn // an array's element
}

// dbzColumns reads the columns of table (a quoted, qualified name) from conn's catalog.
func dbzColumns(ctx context.Context, conn *pgx.Conn, table string) ([]*dbzColumn, error) {
	rows, err := conn.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod),
		       b.typname::text, CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END,
		       b.typcategory::text, coalesce(e.typname::text, ''), coalesce(e.typtype::text, '')
		FROM pg_attribute a
		JOIN pg_type t ON t.oid = a.atttypid
		JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
		LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typcategory = 'A'
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, table)
	if err != nil {
		return nil, err
	}
	var cols []*dbzColumn
	for rows.Next() {
		var name, typ, base, category, elem, elemType string
		var typmod int
		if err := rows.Scan(&name, &typ, &base, &typmod, &category, &elem, &elemType); err != nil {
			return nil, err
		}
		c := dbzColumnOf(base, typmod)
		c.name, c.typ = name, typ
		if category == "A" {
			e := dbzColumnOf(elem, typmod)
			c.kind, c.elem = dbzArray, e
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("table %s has no columns", table)
	}
	return cols, nil
}

// dbzColumnOf returns how values of the type named typname (a base type) and typmod are
// written.
func dbzColumnOf(typname string, typmod int) *dbzColumn {
	c := &dbzColumn{scale: -1}
	switch typname {
	case "int2", "int4", "int8", "oid":
		c.kind = dbzInt
	case "float4", "float8":
		c.kind = dbzFloat
	case "bool":
		c.kind = dbzBool
	case "numeric":
		c.kind = dbzNumeric
		if typmod >= 4 {
			c.scale = (typmod - 4) & 0xffff
		}
	case "bytea":
		c.kind = dbzBytea
	case "date":
		c.kind = dbzDate
	case "timestamp":
		c.kind, c.millis = dbzTimestamp, typmod >= 0 && typmod <= 3
	case "time":
		c.kind, c.millis = dbzTime, typmod >= 0 && typmod <= 3
	case "interval":
		c.kind = dbzInterval
	case "json", "xml":
		c.noEq = true
	}
	return c
}

// Debezium's infinite dates and timestamps: PostgreSQL's infinite dates (INT32_MAX and INT32_MIN
// days since 2000) moved to 1970 in 32 bits, and the JDBC driver's infinite timestamps
// (PGStatement.DATE_POSITIVE_INFINITY and DATE_NEGATIVE_INFINITY), written as they are for a
// timestamp in microseconds and divided by 1000 for one in milliseconds (timestamp(0..3)).
const (
	dbzDateInfinity    = -2147472692
	dbzDateNegInfinity = -2147472691
	dbzTSInfinity      = 9223372036825200000
	dbzTSNegInfinity   = -9223372036832400000
)

var dbzDecimalText = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// text returns v, c's value in an event, in PostgreSQL's text input format; null for SQL NULL.
// An unavailable value is an error: the callers leave those columns out.
func (c *dbzColumn) text(v any) (s string, null bool, err error) {
	if v == nil {
		return "", true, nil
	}
	bad := func() (string, bool, error) {
		j, _ := json.Marshal(v)
		return "", false, fmt.Errorf("column %q (%s): unexpected value %s", c.name, c.typ, j)
	}
	if s, ok := v.(string); ok && s == dbzUnavailable {
		return "", false, fmt.Errorf("column %q: unavailable value where the whole value is needed", c.name)
	}
	switch c.kind {
	case dbzInt:
		if n, ok := v.(json.Number); ok {
			return n.String(), false, nil
		}
	case dbzFloat:
		switch x := v.(type) {
		case json.Number:
			return x.String(), false, nil
		case string:
			if x == "NaN" || x == "Infinity" || x == "-Infinity" {
				return x, false, nil
			}
		}
	case dbzBool:
		if b, ok := v.(bool); ok {
			return strconv.FormatBool(b), false, nil
		}
	case dbzNumeric:
		switch x := v.(type) {
		case map[string]any: // variable scale
			scale, ok1 := x["scale"].(json.Number)
			val, ok2 := x["value"].(string)
			sc, err := scale.Int64()
			if !ok1 || !ok2 || err != nil {
				return bad()
			}
			n, err := dbzUnscaled(val)
			if err != nil {
				return bad()
			}
			return dbzScaled(n, int(sc)), false, nil
		case string:
			// A decimal string (decimal.handling.mode=string) where it cannot be base64: with a
			// scale, PostgreSQL's text has a point; without a typmod Debezium writes an object.
			if x == "NaN" || dbzDecimalText.MatchString(x) && (c.scale < 0 || c.scale > 0 && strings.Contains(x, ".")) {
				return x, false, nil
			}
			if c.scale < 0 {
				return bad()
			}
			n, err := dbzUnscaled(x)
			if err != nil {
				return bad()
			}
			return dbzScaled(n, c.scale), false, nil
		case json.Number: // decimal.handling.mode=double
			return x.String(), false, nil
		}
	case dbzBytea:
		if s, ok := v.(string); ok {
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return bad()
			}
			return `\x` + hex.EncodeToString(b), false, nil
		}
	case dbzDate:
		switch x := v.(type) {
		case string: // "infinity", or a date's text
			return x, false, nil
		case json.Number:
			d, err := x.Int64()
			if err != nil {
				return bad()
			}
			switch d {
			case dbzDateInfinity:
				return "infinity", false, nil
			case dbzDateNegInfinity:
				return "-infinity", false, nil
			}
			return dbzDateText(time.Unix(d*86400, 0).UTC()), false, nil
		}
	case dbzTimestamp:
		switch x := v.(type) {
		case string:
			return x, false, nil
		case json.Number:
			n, err := x.Int64()
			if err != nil {
				return bad()
			}
			inf, neg := int64(dbzTSInfinity), int64(dbzTSNegInfinity)
			if c.millis {
				inf, neg = inf/1000, neg/1000
			}
			switch n {
			case inf:
				return "infinity", false, nil
			case neg:
				return "-infinity", false, nil
			}
			var ts time.Time
			if c.millis {
				ts = time.UnixMilli(n).UTC()
			} else {
				ts = time.UnixMicro(n).UTC()
			}
			s := dbzDateText(ts)
			bc := strings.HasSuffix(s, " BC")
			s = strings.TrimSuffix(s, " BC") + " " + ts.Format("15:04:05.999999")
			if bc {
				s += " BC"
			}
			return s, false, nil
		}
	case dbzTime:
		switch x := v.(type) {
		case string:
			return x, false, nil
		case json.Number:
			n, err := x.Int64()
			if err != nil || n < 0 {
				return bad()
			}
			if c.millis {
				n *= 1000
			}
			return dbzClock(n), false, nil
		}
	case dbzInterval:
		switch x := v.(type) {
		case string: // ISO 8601 (interval.handling.mode=string), which PostgreSQL reads
			return x, false, nil
		case json.Number:
			n, err := x.Int64()
			if err != nil {
				return bad()
			}
			if n < 0 {
				return "-" + dbzClock(-n), false, nil
			}
			return dbzClock(n), false, nil
		}
	case dbzArray:
		if a, ok := v.([]any); ok {
			return c.elem.arrayLiteral(a)
		}
	default:
		switch x := v.(type) {
		case string:
			return x, false, nil
		case map[string]any, []any: // a JSON value written as JSON rather than as its text
			j, err := json.Marshal(x)
			return string(j), false, err
		}
	}
	return bad()
}

// arrayLiteral writes elements of c's type as an array literal.
func (c *dbzColumn) arrayLiteral(elems []any) (string, bool, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		if sub, ok := e.([]any); ok {
			s, _, err := c.arrayLiteral(sub)
			if err != nil {
				return "", false, err
			}
			b.WriteString(s)
			continue
		}
		s, null, err := c.text(e)
		if err != nil {
			return "", false, err
		}
		if null {
			b.WriteString("NULL")
			continue
		}
		b.WriteByte('"')
		b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), false, nil
}

// dbzUnscaled decodes a big-endian two's-complement integer in base64.
func dbzUnscaled(b64 string) (*big.Int, error) {
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, err
	}
	n := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return n, nil
}

// dbzScaled writes n·10^-scale as a decimal.
func dbzScaled(n *big.Int, scale int) string {
	digits := new(big.Int).Abs(n).String()
	sign := ""
	if n.Sign() < 0 {
		sign = "-"
	}
	if scale <= 0 {
		if n.Sign() == 0 {
			return "0"
		}
		return sign + digits + strings.Repeat("0", -scale)
	}
	if len(digits) <= scale {
		digits = strings.Repeat("0", scale-len(digits)+1) + digits
	}
	return sign + digits[:len(digits)-scale] + "." + digits[len(digits)-scale:]
}

// dbzDateText writes t's date as PostgreSQL reads it, years before 1 as BC.
func dbzDateText(t time.Time) string {
	y, m, d := t.Date()
	if y <= 0 {
		return fmt.Sprintf("%04d-%02d-%02d BC", 1-y, m, d)
	}
	return fmt.Sprintf("%04d-%02d-%02d", y, m, d)
}

// dbzClock writes microseconds as H:MM:SS.ffffff (hours past 24 for an interval).
func dbzClock(us int64) string {
	s := fmt.Sprintf("%d:%02d:%02d", us/3_600_000_000, us/60_000_000%60, us/1_000_000%60)
	if f := us % 1_000_000; f != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%06d", f), "0")
	}
	return s
}

// dbzQuoteIdent quotes a name for SQL.
func dbzQuoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// dbzTableSpec names a table of both databases, and what the applier needs of the source's.
type dbzTableSpec struct {
	Schema, Name string
	Full         bool     // REPLICA IDENTITY FULL: before is the whole old row
	Key          []string // the columns of the primary key, else of a unique index of NOT NULL columns
}

func (s dbzTableSpec) ident() string { return dbzQuoteIdent(s.Schema) + "." + dbzQuoteIdent(s.Name) }

// dbzCreateReplica creates, in dst, a table with the columns of src's schema.name (its schema,
// and the enum types its columns use, if missing), with an index on the source's key columns,
// and returns what the source says of the table.
func dbzCreateReplica(ctx context.Context, src, dst *pgx.Conn, schema, name string) (dbzTableSpec, error) {
	spec := dbzTableSpec{Schema: schema, Name: name}
	ident := spec.ident()
	var replident string
	if err := src.QueryRow(ctx, `SELECT relreplident::text FROM pg_class WHERE oid = $1::regclass`, ident).Scan(&replident); err != nil {
		return spec, fmt.Errorf("%s: %w", ident, err)
	}
	spec.Full = replident == "f"
	err := src.QueryRow(ctx, `
		SELECT coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord)
		FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
		GROUP BY i.indexrelid, i.indisprimary
		HAVING bool_and(a.attnotnull)
		ORDER BY i.indisprimary DESC, i.indexrelid LIMIT 1), '{}')`, ident).Scan(&spec.Key)
	if err != nil {
		return spec, fmt.Errorf("%s: key: %w", ident, err)
	}
	// Enum types first.
	rows, err := src.Query(ctx, `
		SELECT DISTINCT n.nspname::text, t.typname::text,
		       (SELECT array_agg(enumlabel::text ORDER BY enumsortorder) FROM pg_enum WHERE enumtypid = t.oid)
		FROM pg_attribute a JOIN pg_type at ON at.oid = a.atttypid
		JOIN pg_type t ON t.oid IN (at.oid, at.typelem) AND t.typtype = 'e'
		JOIN pg_namespace n ON n.oid = t.typnamespace
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`, ident)
	if err != nil {
		return spec, err
	}
	type enum struct {
		schema, name string
		labels       []string
	}
	var enums []enum
	for rows.Next() {
		var e enum
		if err := rows.Scan(&e.schema, &e.name, &e.labels); err != nil {
			return spec, err
		}
		enums = append(enums, e)
	}
	if err := rows.Err(); err != nil {
		return spec, err
	}
	if _, err := dst.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+dbzQuoteIdent(schema)); err != nil {
		return spec, err
	}
	for _, e := range enums {
		var n int
		if err := dst.QueryRow(ctx, `SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
			WHERE n.nspname = $1 AND t.typname = $2`, e.schema, e.name).Scan(&n); err != nil {
			return spec, err
		}
		if n > 0 {
			continue
		}
		var create string
		if err := dst.QueryRow(ctx, `SELECT format('CREATE TYPE %I.%I AS ENUM (%s)', $1::text, $2::text,
			(SELECT string_agg(quote_literal(l), ', ' ORDER BY n) FROM unnest($3::text[]) WITH ORDINALITY AS u(l, n)))`,
			e.schema, e.name, e.labels).Scan(&create); err != nil {
			return spec, err
		}
		for _, sql := range []string{"CREATE SCHEMA IF NOT EXISTS " + dbzQuoteIdent(e.schema), create} {
			if _, err := dst.Exec(ctx, sql); err != nil {
				return spec, err
			}
		}
	}
	cols, err := dbzColumns(ctx, src, ident)
	if err != nil {
		return spec, err
	}
	var defs []string
	for _, c := range cols {
		defs = append(defs, dbzQuoteIdent(c.name)+" "+c.typ)
	}
	if _, err := dst.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (%s)", ident, strings.Join(defs, ", "))); err != nil {
		return spec, err
	}
	if len(spec.Key) > 0 {
		var keys []string
		for _, k := range spec.Key {
			keys = append(keys, dbzQuoteIdent(k))
		}
		if _, err := dst.Exec(ctx, fmt.Sprintf("CREATE INDEX ON %s (%s)", ident, strings.Join(keys, ", "))); err != nil {
			return spec, err
		}
	}
	return spec, nil
}

// dbzReplica applies change events to the tables of a replica database.
type dbzReplica struct {
	conn      *pgx.Conn
	tables    map[string]*dbzTable // by topic
	anomalies []string             // the first dbzMaxAnomalies
	nAnomaly  int
	// moved holds the rows deleted by a key change (a delete with header __debezium.newkey),
	// as their columns' texts, by topic and new key, until the create of the new key takes
	// from them the values it lacks (unchanged TOASTed values).
	moved map[string]map[string]*string
}

const dbzMaxAnomalies = 20

// dbzTable is a replica table and what was applied to it.
type dbzTable struct {
	dbzTableSpec
	topic  string
	cols   map[string]*dbzColumn
	order  map[string]int // column positions, for statements written the same way each time
	counts map[string]int // events applied, by op; "kept" counts unavailable values kept
}

func newDBZReplica(conn *pgx.Conn) *dbzReplica {
	return &dbzReplica{conn: conn, tables: map[string]*dbzTable{}, moved: map[string]map[string]*string{}}
}

// add makes the replica table of spec (which exists in the replica database) take the events of
// topic.
func (r *dbzReplica) add(ctx context.Context, topic string, spec dbzTableSpec) error {
	cols, err := dbzColumns(ctx, r.conn, spec.ident())
	if err != nil {
		return err
	}
	t := &dbzTable{dbzTableSpec: spec, topic: topic, cols: map[string]*dbzColumn{}, order: map[string]int{}, counts: map[string]int{}}
	for i, c := range cols {
		t.cols[c.name], t.order[c.name] = c, i
	}
	r.tables[topic] = t
	return nil
}

func (r *dbzReplica) anomaly(rec *dbzRecord, format string, args ...any) {
	r.nAnomaly++
	if len(r.anomalies) < dbzMaxAnomalies {
		r.anomalies = append(r.anomalies, rec.String()+": "+fmt.Sprintf(format, args...)+"\n      event: "+dbzShorten(string(rec.Value)))
	}
}

// Anomalies describes what contradicted the source's history, the first ones in full.
func (r *dbzReplica) Anomalies() string {
	if r.nAnomaly == 0 {
		return ""
	}
	s := fmt.Sprintf("%d anomalies applying the events:\n  %s", r.nAnomaly, strings.Join(r.anomalies, "\n  "))
	if r.nAnomaly > len(r.anomalies) {
		s += fmt.Sprintf("\n  ... and %d more", r.nAnomaly-len(r.anomalies))
	}
	return s
}

// counts describes what was applied to each table.
func (r *dbzReplica) counts() string {
	var lines []string
	for _, t := range r.tables {
		var parts []string
		for _, op := range slices.Sorted(maps.Keys(t.counts)) {
			parts = append(parts, fmt.Sprintf("%s=%d", op, t.counts[op]))
		}
		lines = append(lines, fmt.Sprintf("%s: %s", t.ident(), strings.Join(parts, " ")))
	}
	slices.Sort(lines)
	return strings.Join(lines, "; ")
}

// dbzEvent is what the applier reads of an event.
type dbzEvent struct {
	Before map[string]any `json:"before"`
	After  map[string]any `json:"after"`
	Op     string         `json:"op"`
}

// apply applies recs in their order, in one transaction of the replica database.
func (r *dbzReplica) apply(ctx context.Context, recs []dbzRecord) error {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for i := range recs {
		if err := r.applyOne(ctx, tx, &recs[i]); err != nil {
			return fmt.Errorf("%s: %w\nvalue: %s", recs[i].String(), err, recs[i].Value)
		}
	}
	return tx.Commit(ctx)
}

func dbzDecode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

// dbzStmt is a statement being written, with its arguments.
type dbzStmt struct {
	sql  strings.Builder
	args []any
}

// param adds c's value v as an argument and returns the expression of it, of c's type.
func (s *dbzStmt) param(c *dbzColumn, v any) (string, error) {
	text, null, err := c.text(v)
	if err != nil {
		return "", err
	}
	if null {
		s.args = append(s.args, nil)
	} else {
		s.args = append(s.args, text)
	}
	return fmt.Sprintf("$%d::text::%s", len(s.args), c.typ), nil
}

// columns returns the columns of row's fields, in the table's order.
func (t *dbzTable) columns(row map[string]any) ([]*dbzColumn, error) {
	var cols []*dbzColumn
	for name := range row {
		c, ok := t.cols[name]
		if !ok {
			return nil, fmt.Errorf("column %q is not in the replica table %s", name, t.ident())
		}
		cols = append(cols, c)
	}
	slices.SortFunc(cols, func(a, b *dbzColumn) int { return cmp.Compare(t.order[a.name], t.order[b.name]) })
	return cols, nil
}

func dbzIsUnavailable(v any) bool {
	s, ok := v.(string)
	return ok && s == dbzUnavailable
}

// keyCond writes the condition that picks key's row.
func (t *dbzTable) keyCond(s *dbzStmt, key map[string]any) error {
	cols, err := t.columns(key)
	if err != nil {
		return err
	}
	for i, c := range cols {
		if i > 0 {
			s.sql.WriteString(" AND ")
		}
		if key[c.name] == nil {
			s.sql.WriteString(dbzQuoteIdent(c.name) + " IS NULL")
			continue
		}
		p, err := s.param(c, key[c.name])
		if err != nil {
			return err
		}
		if c.noEq {
			fmt.Fprintf(&s.sql, "%s::text = %s::text", dbzQuoteIdent(c.name), p)
		} else {
			fmt.Fprintf(&s.sql, "%s = %s", dbzQuoteIdent(c.name), p)
		}
	}
	return nil
}

// rowCond writes the condition that a row equals row (an unavailable value equals anything):
// their values' texts are the same.
func (t *dbzTable) rowCond(s *dbzStmt, row map[string]any) error {
	cols, err := t.columns(row)
	if err != nil {
		return err
	}
	n := 0
	for _, c := range cols {
		if dbzIsUnavailable(row[c.name]) {
			continue
		}
		if n > 0 {
			s.sql.WriteString(" AND ")
		}
		n++
		p, err := s.param(c, row[c.name])
		if err != nil {
			return err
		}
		fmt.Fprintf(&s.sql, "%s::text IS NOT DISTINCT FROM %s::text", dbzQuoteIdent(c.name), p)
	}
	if n == 0 {
		s.sql.WriteString("true")
	}
	return nil
}

// setList writes "col = value, ..." of row, leaving out unavailable values (counted as kept).
func (t *dbzTable) setList(s *dbzStmt, row map[string]any) error {
	cols, err := t.columns(row)
	if err != nil {
		return err
	}
	n := 0
	for _, c := range cols {
		if dbzIsUnavailable(row[c.name]) {
			t.counts["kept"]++
			continue
		}
		if n > 0 {
			s.sql.WriteString(", ")
		}
		n++
		p, err := s.param(c, row[c.name])
		if err != nil {
			return err
		}
		fmt.Fprintf(&s.sql, "%s = %s", dbzQuoteIdent(c.name), p)
	}
	if n == 0 && len(cols) > 0 { // nothing to set: set a column to itself
		fmt.Fprintf(&s.sql, "%s = %[1]s", dbzQuoteIdent(cols[0].name))
	}
	return nil
}

func (r *dbzReplica) exec(ctx context.Context, tx pgx.Tx, s *dbzStmt) (int64, error) {
	tag, err := tx.Exec(ctx, s.sql.String(), s.args...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", s.sql.String(), err)
	}
	return tag.RowsAffected(), nil
}

// insert inserts row. An unavailable value is taken from old, the row of the old key of a key
// change, when given.
func (r *dbzReplica) insert(ctx context.Context, tx pgx.Tx, rec *dbzRecord, t *dbzTable, row map[string]any, old map[string]*string) error {
	cols, err := t.columns(row)
	if err != nil {
		return err
	}
	s := &dbzStmt{}
	var names, vals []string
	for _, c := range cols {
		var p string
		switch v, ok := old[c.name]; {
		case !dbzIsUnavailable(row[c.name]):
			if p, err = s.param(c, row[c.name]); err != nil {
				return err
			}
		case ok:
			t.counts["kept"]++
			s.args = append(s.args, v)
			p = fmt.Sprintf("$%d::text::%s", len(s.args), c.typ)
		default:
			r.anomaly(rec, "column %q of a new row is unavailable (and no delete of the old key said what it was): left null", c.name)
			continue
		}
		names, vals = append(names, dbzQuoteIdent(c.name)), append(vals, p)
	}
	fmt.Fprintf(&s.sql, "INSERT INTO %s (%s) VALUES (%s)", t.ident(), strings.Join(names, ", "), strings.Join(vals, ", "))
	_, err = r.exec(ctx, tx, s)
	return err
}

// sameKey reports whether row's key columns (those it has) hold key's values, and describes both.
func (t *dbzTable) sameKey(key, row map[string]any) (bool, string, string, error) {
	same := true
	var a, b []string
	cols, err := t.columns(key)
	if err != nil {
		return false, "", "", err
	}
	for _, c := range cols {
		v, ok := row[c.name]
		if !ok {
			continue
		}
		x, xnull, err1 := c.text(key[c.name])
		y, ynull, err2 := c.text(v)
		if err := errors.Join(err1, err2); err != nil {
			return false, "", "", err
		}
		same = same && x == y && xnull == ynull
		a, b = append(a, c.name+"="+x), append(b, c.name+"="+y)
	}
	return same, strings.Join(a, ","), strings.Join(b, ","), nil
}

func (r *dbzReplica) applyOne(ctx context.Context, tx pgx.Tx, rec *dbzRecord) error {
	if rec.Value == nil {
		if t := r.tables[rec.Topic]; t != nil {
			t.counts["tombstone"]++
		}
		return nil
	}
	var ev dbzEvent
	if err := dbzDecode(rec.Value, &ev); err != nil {
		return err
	}
	switch ev.Op {
	case "r", "c", "u", "d", "t":
	default:
		return nil // a message, transaction metadata
	}
	t := r.tables[rec.Topic]
	if t == nil {
		return fmt.Errorf("a change event on topic %s, which has no replica table", rec.Topic)
	}
	t.counts[ev.Op]++
	var key map[string]any
	if rec.Key != nil && string(rec.Key) != "null" {
		if err := dbzDecode(rec.Key, &key); err != nil {
			return fmt.Errorf("key: %w", err)
		}
	}
	switch ev.Op {
	case "r", "c":
		if ev.After == nil {
			return errors.New("no after")
		}
		var old map[string]*string
		if _, ok := rec.header(dbzHeaderOldKey); ok && ev.Op == "c" {
			id := rec.Topic + "\x00" + dbzCanonical(rec.Key)
			old = r.moved[id]
			delete(r.moved, id)
		}
		return r.insert(ctx, tx, rec, t, ev.After, old)
	case "t":
		_, err := tx.Exec(ctx, "TRUNCATE "+t.ident())
		return err
	case "u":
		if ev.After == nil {
			return errors.New("an update without after")
		}
		if key == nil {
			return r.keylessChange(ctx, tx, rec, t, ev)
		}
		if same, k, a, err := t.sameKey(key, ev.After); err != nil {
			return err
		} else if !same {
			r.anomaly(rec, "update whose after has key %s, the record key %s", a, k)
		}
		if ev.Before != nil {
			if same, k, b, err := t.sameKey(key, ev.Before); err != nil {
				return err
			} else if !same {
				r.anomaly(rec, "update changes the key from %s to %s: a key change must be a delete of the old key and a create of the new", b, k)
			}
		}
		s := &dbzStmt{}
		fmt.Fprintf(&s.sql, "UPDATE %s SET ", t.ident())
		if err := t.setList(s, ev.After); err != nil {
			return err
		}
		s.sql.WriteString(" WHERE ")
		if err := t.keyCond(s, key); err != nil {
			return err
		}
		full := t.Full && ev.Before != nil
		if full {
			s.sql.WriteString(" AND ")
			if err := t.rowCond(s, ev.Before); err != nil {
				return err
			}
		}
		n, err := r.exec(ctx, tx, s)
		if err != nil || n == 1 {
			return err
		}
		if n > 1 {
			r.anomaly(rec, "update of %d rows with key %s", n, rec.Key)
			return nil
		}
		if full { // the key's row, if any, is not before
			s := &dbzStmt{}
			fmt.Fprintf(&s.sql, "UPDATE %s SET ", t.ident())
			if err := t.setList(s, ev.After); err != nil {
				return err
			}
			s.sql.WriteString(" WHERE ")
			if err := t.keyCond(s, key); err != nil {
				return err
			}
			if n, err := r.exec(ctx, tx, s); err != nil {
				return err
			} else if n > 0 {
				r.anomaly(rec, "update whose before is not the replica's row of key %s", rec.Key)
				return nil
			}
		}
		r.anomaly(rec, "update of key %s, which the replica lacks: inserted", rec.Key)
		return r.insert(ctx, tx, rec, t, ev.After, nil)
	case "d":
		if key == nil {
			return r.keylessChange(ctx, tx, rec, t, ev)
		}
		if newKey, ok := rec.header(dbzHeaderNewKey); ok {
			if err := r.keepMoved(ctx, tx, t, key, rec.Topic+"\x00"+dbzCanonical([]byte(newKey))); err != nil {
				return err
			}
		}
		s := &dbzStmt{}
		fmt.Fprintf(&s.sql, "DELETE FROM %s WHERE ", t.ident())
		if err := t.keyCond(s, key); err != nil {
			return err
		}
		full := t.Full && ev.Before != nil
		if full {
			s.sql.WriteString(" AND ")
			if err := t.rowCond(s, ev.Before); err != nil {
				return err
			}
		}
		n, err := r.exec(ctx, tx, s)
		if err != nil || n == 1 {
			return err
		}
		if n > 1 {
			r.anomaly(rec, "delete of %d rows with key %s", n, rec.Key)
			return nil
		}
		if full {
			s := &dbzStmt{}
			fmt.Fprintf(&s.sql, "DELETE FROM %s WHERE ", t.ident())
			if err := t.keyCond(s, key); err != nil {
				return err
			}
			if n, err := r.exec(ctx, tx, s); err != nil {
				return err
			} else if n > 0 {
				r.anomaly(rec, "delete whose before is not the replica's row of key %s: deleted", rec.Key)
				return nil
			}
		}
		r.anomaly(rec, "delete of key %s, which the replica lacks", rec.Key)
		return nil
	}
	return nil
}

// keepMoved keeps the texts of the columns of key's row under id, for the create of the new key.
func (r *dbzReplica) keepMoved(ctx context.Context, tx pgx.Tx, t *dbzTable, key map[string]any, id string) error {
	s := &dbzStmt{}
	var names []string
	var exprs []string
	for name := range t.cols {
		names = append(names, name)
		exprs = append(exprs, dbzQuoteIdent(name)+"::text")
	}
	fmt.Fprintf(&s.sql, "SELECT %s FROM %s WHERE ", strings.Join(exprs, ", "), t.ident())
	if err := t.keyCond(s, key); err != nil {
		return err
	}
	s.sql.WriteString(" LIMIT 1")
	vals := make([]*string, len(names))
	ptrs := make([]any, len(names))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	err := tx.QueryRow(ctx, s.sql.String(), s.args...).Scan(ptrs...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // the delete notes it
	}
	if err != nil {
		return err
	}
	row := map[string]*string{}
	for i, name := range names {
		row[name] = vals[i]
	}
	r.moved[id] = row
	return nil
}

// dbzCanonical returns a key's JSON with its fields sorted, so that the same key written twice is
// the same string.
func dbzCanonical(key []byte) string {
	var v any
	if dbzDecode(key, &v) != nil {
		return string(key)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return string(key)
	}
	return string(b)
}

// keylessChange applies an update or delete of a table without a key to one row equal to
// before.
func (r *dbzReplica) keylessChange(ctx context.Context, tx pgx.Tx, rec *dbzRecord, t *dbzTable, ev dbzEvent) error {
	if ev.Before == nil {
		r.anomaly(rec, "%s without a key nor before: nothing says which row", ev.Op)
		return nil
	}
	s := &dbzStmt{}
	if ev.Op == "u" {
		fmt.Fprintf(&s.sql, "UPDATE %s SET ", t.ident())
		if err := t.setList(s, ev.After); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(&s.sql, "DELETE FROM %s", t.ident())
	}
	fmt.Fprintf(&s.sql, " WHERE ctid = (SELECT ctid FROM %s WHERE ", t.ident())
	if err := t.rowCond(s, ev.Before); err != nil {
		return err
	}
	s.sql.WriteString(" LIMIT 1)")
	n, err := r.exec(ctx, tx, s)
	if err == nil && n == 0 {
		before, _ := json.Marshal(ev.Before)
		r.anomaly(rec, "%s of a row equal to %s, which the replica lacks", ev.Op, dbzShorten(string(before)))
	}
	return err
}

// dbzRenderExpr is how dbzDiff renders column c: its text, but for what Debezium's events cannot
// carry whole. An interval is its length in seconds as Debezium reckons it (a month of 30.4375
// days); a numeric without typmod drops its trailing zeros; timestamptz is in UTC whatever the
// session's time zone.
func dbzRenderExpr(c *dbzColumn) string {
	q := dbzQuoteIdent(c.name)
	switch {
	case c.kind == dbzInterval:
		months := fmt.Sprintf("(extract(year from %s) * 12 + extract(month from %[1]s))", q)
		days := fmt.Sprintf("extract(day from %s)", q)
		return fmt.Sprintf("trim_scale(%s * 2629800 + %s * 86400 + extract(epoch from %s - make_interval(months => %[1]s::int, days => %[2]s::int)))",
			months, days, q)
	case c.kind == dbzNumeric && c.scale < 0:
		return "trim_scale(" + q + ")"
	case c.typ == "timestamp with time zone":
		return q + " AT TIME ZONE 'UTC'"
	}
	return q
}

// dbzDiff compares the rows of table spec in the source and replica databases, rendered as JSON
// arrays of their columns (dbzRenderExpr), as multisets. It returns "" when they are the same,
// else which rows each lacks, the first show of each.
func dbzDiff(ctx context.Context, src, dst *pgx.Conn, spec dbzTableSpec, show int) (string, error) {
	cols, err := dbzColumns(ctx, src, spec.ident())
	if err != nil {
		return "", err
	}
	var exprs []string
	for _, c := range cols {
		exprs = append(exprs, dbzRenderExpr(c))
	}
	query := fmt.Sprintf("SELECT json_build_array(%s)::text FROM %s", strings.Join(exprs, ", "), spec.ident())
	read := func(conn *pgx.Conn) ([]string, error) {
		rows, err := conn.Query(ctx, query)
		if err != nil {
			return nil, err
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		slices.Sort(out)
		return out, err
	}
	want, err := read(src)
	if err != nil {
		return "", fmt.Errorf("source %s: %w", spec.ident(), err)
	}
	got, err := read(dst)
	if err != nil {
		return "", fmt.Errorf("replica %s: %w", spec.ident(), err)
	}
	var missing, extra []string
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || i < len(want) && want[i] < got[j]:
			missing = append(missing, want[i])
			i++
		case i == len(want) || got[j] < want[i]:
			extra = append(extra, got[j])
			j++
		default:
			i++
			j++
		}
	}
	if len(missing) == 0 && len(extra) == 0 {
		return "", nil
	}
	var names []string
	for _, c := range cols {
		names = append(names, c.name)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s differs: the source has %d rows, the replica %d; %d source rows are not in the replica, %d replica rows not in the source. Rows are [%s].",
		spec.ident(), len(want), len(got), len(missing), len(extra), strings.Join(names, ", "))
	for _, part := range []struct {
		what string
		rows []string
	}{{"only in the source: ", missing}, {"only in the replica:", extra}} {
		for k, row := range part.rows {
			if k == show {
				fmt.Fprintf(&b, "\n  %s ... %d more", part.what, len(part.rows)-show)
				break
			}
			fmt.Fprintf(&b, "\n  %s %s", part.what, dbzShorten(row))
		}
	}
	return b.String(), nil
}

// dbzShorten rewrites a JSON text with each long string cut, its length and MD5 said instead.
func dbzShorten(j string) string {
	var v any
	if dbzDecode([]byte(j), &v) != nil {
		return j
	}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			if len(x) > 60 {
				r := []rune(x)
				return fmt.Sprintf("%s…(%d bytes, md5 %x)", string(r[:min(len(r), 24)]), len(x), md5.Sum([]byte(x)))
			}
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		case map[string]any:
			for k := range x {
				x[k] = walk(x[k])
			}
		}
		return v
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(walk(v)) != nil {
		return j
	}
	return strings.TrimSpace(b.String())
}

// dbzUserTables lists the tables of conn's database outside the system schemas.
func dbzUserTables(ctx context.Context, conn *pgx.Conn) ([][2]string, error) {
	rows, err := conn.Query(ctx, `SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
		ORDER BY 1, 2`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var t [2]string
		err := r.Scan(&t[0], &t[1])
		return t, err
	})
}

// dbzGoldenDir holds the golden workload and Debezium's records of it.
var dbzGoldenDir = filepath.Join("..", "..", "kafkasink", "testdata", "debezium")

// dbzGoldenBlocks returns the transactions of a golden workload file: blocks separated by blank
// lines, comment lines dropped.
func dbzGoldenBlocks(t *testing.T, name string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dbzGoldenDir, name))
	require.NoError(t, err)
	var blocks []string
	var cur strings.Builder
	for line := range strings.Lines(string(data) + "\n") {
		switch trimmed := strings.TrimSpace(line); {
		case trimmed == "":
			if s := strings.TrimSpace(cur.String()); s != "" {
				blocks = append(blocks, s)
			}
			cur.Reset()
		case !strings.HasPrefix(trimmed, "--"):
			cur.WriteString(line)
		}
	}
	return blocks
}

// TestKafkaReplicaGolden checks the applier against Debezium: the golden workload runs on a
// fresh database, Debezium's records of it (debezium-plain.jsonl, captured from Debezium 3.6.1
// with the JSON converter, schemas off) are applied in the file's order to replica tables in
// another database, and every replica table must equal its source table: all eight of the
// golden tables, every type of theirs (int2/4/8, numeric with and without typmod, float4/8,
// bool, text, varchar, char, bytea, date, time, timestamp, timestamp(3), timestamptz, interval,
// uuid, json, jsonb, int[] and text[], an enum), with key changes, REPLICA IDENTITY FULL with a
// key, with a unique index, without a key, an unchanged TOASTed value and a TRUNCATE.
func TestKafkaReplicaGolden(t *testing.T) {
	srv := pgtest.Shared(t, 18) // the server the records were captured on
	ctx := pgtest.Context(t, 2*time.Minute)
	srcDSN := srv.ConnString(pgtest.NewDatabase(t, srv))
	dstDSN := srv.ConnString(pgtest.NewDatabase(t, srv))
	src, err := pgx.Connect(ctx, srcDSN)
	require.NoError(t, err)
	defer src.Close(context.Background())
	for _, b := range append(dbzGoldenBlocks(t, "setup.sql"), dbzGoldenBlocks(t, "changes.sql")...) {
		_, err := src.Exec(ctx, b, pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err, b)
	}
	dst, err := pgx.Connect(ctx, dstDSN)
	require.NoError(t, err)
	defer dst.Close(context.Background())

	tables, err := dbzUserTables(ctx, src)
	require.NoError(t, err)
	require.Len(t, tables, 8)
	rep := newDBZReplica(dst)
	var specs []dbzTableSpec
	for _, tb := range tables {
		spec, err := dbzCreateReplica(ctx, src, dst, tb[0], tb[1])
		require.NoError(t, err)
		require.NoError(t, rep.add(ctx, dbzTopic("plain", tb[0], tb[1]), spec))
		specs = append(specs, spec)
	}

	f, err := os.Open(filepath.Join(dbzGoldenDir, "debezium-plain.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	var recs []dbzRecord
	offsets := map[string]int64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var g struct {
			Topic      string
			Key, Value json.RawMessage
			Headers    []struct{ Key, Value string }
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &g))
		r := dbzRecord{Topic: g.Topic, Offset: offsets[g.Topic]}
		for _, h := range g.Headers {
			r.Headers = append(r.Headers, [2]string{h.Key, h.Value})
		}
		offsets[g.Topic]++
		if string(g.Key) != "null" {
			r.Key = g.Key
		}
		if string(g.Value) != "null" {
			r.Value = g.Value
		}
		recs = append(recs, r)
	}
	require.NoError(t, sc.Err())
	require.NoError(t, rep.apply(ctx, recs))
	t.Logf("applied %d records: %s", len(recs), rep.counts())

	for _, spec := range specs {
		diff, err := dbzDiff(ctx, src, dst, spec, 5)
		require.NoError(t, err)
		if diff != "" {
			t.Error(diff)
		}
	}
	require.Empty(t, rep.Anomalies())
	// What the golden records exercise, so that the comparison means something.
	counts := func(table string) map[string]int { return rep.tables[dbzTopic("plain", "public", table)].counts }
	require.Equal(t, 1, counts("toasty")["kept"], "the unchanged TOASTed value kept")
	require.Equal(t, 1, counts("keyed")["t"], "the truncate")
	require.Equal(t, 2, counts("nokey")["d"], "deletes of a keyless table")
}
