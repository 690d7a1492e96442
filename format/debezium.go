package format

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Connector is source.connector in Debezium events.
const Connector = "pgreorder"

// Unavailable stands for an unchanged TOASTed value in Debezium events, as in Debezium.
const Unavailable = "__debezium_unavailable_value"

// Debezium's record headers of a primary-key change: the delete of the old key names the new
// key, the create of the new key names the old one (each the key's JSON, without a schema).
const (
	HeaderNewKey = "__debezium.newkey"
	HeaderOldKey = "__debezium.oldkey"
)

// What an old tuple holds (Update.OldKind, Delete.OldKind): the replica identity's columns,
// or the whole old row; and a new row.
const (
	tupleKey = 'K'
	tupleOld = 'O'
	tupleNew = 'N'
)

// OIDs pgtype has no constant for.
const (
	charOID = 18 // "char"
	xmlOID  = 142
)

// dbzTxn is what the Debezium events of a transaction, or of a chunk of an initial copy, say of
// their source.
type dbzTxn struct {
	pgvalue.Source
	xid        uint32
	commitLSN  uint64
	commitTime time.Time
	origin     string
	originLSN  uint64
	nonTx      bool // a non-transactional message: no txId
	snapshot   bool // copied rows: op "r", snapshot "true", no transaction block

	schema decoding.Schema // the schema of the change being written
}

// Relation and Type resolve against the schema of the change being written.
func (x *dbzTxn) Relation(id uint32) (*decoding.Relation, bool) { return x.schema.Relation(id) }
func (x *dbzTxn) Type(oid uint32) (*decoding.DataType, bool)    { return x.schema.Type(oid) }

func txnSource(x *reorderbuffer.Txn) *dbzTxn {
	return &dbzTxn{Source: x, xid: x.Xid, commitLSN: uint64(x.CommitLSN), commitTime: x.CommitTime, nonTx: x.NonTransactional,
		origin: x.Origin, originLSN: uint64(x.OriginLSN)}
}

// dbzTable is what the events of one relation need, worked out once per relation description.
type dbzTable struct {
	rel     *decoding.Relation
	types   []*dbzType
	key     []int    // the event key's columns; nil: no key (a null Kafka key)
	notNull []bool   // per column
	defs    [][]byte // per column: the default's JSON, nil for none
	base    string   // the Connect schema names' prefix

	keySchema, envelope []byte // built on first use
}

// maxTables bounds the relation descriptions a Writer keeps worked out.
const maxTables = 1024

// table returns what the events of relation r need, resolving types against x.
func (w *Writer) table(x *dbzTxn, r *decoding.Relation) (*dbzTable, error) {
	if t, ok := w.tables[r]; ok {
		return t, nil
	}
	if err := w.checkColumns(r); err != nil {
		return nil, err
	}
	var info *Table
	if w.cfg.Tables != nil && w.ctx != nil {
		var err error
		if info, err = w.cfg.Tables.Table(w.ctx, r); err != nil {
			return nil, fmt.Errorf("format: looking up table %s.%s: %w", r.Namespace, r.Name, err)
		}
	}
	t := &dbzTable{rel: r, types: make([]*dbzType, len(r.Columns)), notNull: make([]bool, len(r.Columns)),
		defs: make([][]byte, len(r.Columns)), base: w.schemaBase(r)}
	nulls := make(decoding.Tuple, len(r.Columns))
	for i := range nulls {
		nulls[i].Kind = decoding.ColumnNull
	}
	row, err := w.vals.Row(x, r, nulls)
	if err != nil {
		return nil, err
	}
	for c := range row.Columns() {
		var ci *TableColumn
		if info != nil {
			if v, ok := info.Columns[c.Name]; ok {
				ci = &v
			}
		}
		t.types[c.Index] = w.columnType(c, ci)
		if ci != nil {
			t.notNull[c.Index] = ci.NotNull
			t.defs[c.Index] = w.defaultJSON(t.types[c.Index], *ci)
		}
	}
	if info != nil {
		for _, name := range info.Key {
			i := columnIndex(r, name)
			if i < 0 {
				t.key = nil // the key's column is not published: no key
				break
			}
			t.key = append(t.key, i)
		}
	} else {
		for i, c := range r.Columns {
			if c.IsKey() {
				t.key = append(t.key, i)
				t.notNull[i] = true
			}
		}
	}
	if w.tables == nil || len(w.tables) >= maxTables {
		w.tables = map[*decoding.Relation]*dbzTable{}
	}
	w.tables[r] = t
	return t, nil
}

// schemaBase returns the prefix of r's Connect schema names.
func (w *Writer) schemaBase(r *decoding.Relation) string {
	if w.cfg.SchemaName != nil {
		return w.cfg.SchemaName(r)
	}
	return TopicName(w.cfg.Server, namespace(r), r.Name)
}

// TopicName returns Debezium's topic name for a table: PREFIX.SCHEMA.TABLE, each character Kafka
// does not take in a topic name (anything but ASCII letters, digits, '.', '_' and '-') replaced
// by '_'. It is not injective: see package kafkasink for how collisions are refused.
func TopicName(prefix, schema, table string) string {
	b := make([]byte, 0, len(prefix)+len(schema)+len(table)+2)
	b = append(b, prefix...)
	for _, part := range [...]string{schema, table} {
		b = append(b, '.')
		for _, r := range part {
			if r < 0x80 && TopicChar(byte(r)) {
				b = append(b, byte(r))
			} else {
				b = append(b, '_')
			}
		}
	}
	return string(b)
}

// TopicChar reports whether Kafka takes c in a topic name: ASCII letters, digits, '.', '_', '-'.
func TopicChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// keyChanged reports whether an update changes the event key: a key column whose old value the
// server sent (the whole old row, or the replica identity's columns) differs from the new one.
// A new value not sent (an unchanged TOASTed value) is the old one.
func (t *dbzTable) keyChanged(m *decoding.Update) bool {
	if m.OldKind == 0 || t.key == nil {
		return false
	}
	for _, i := range t.key {
		if i >= len(m.Old) || i >= len(m.New) {
			return false
		}
		if m.OldKind == tupleKey && !t.rel.Columns[i].IsKey() {
			continue // not sent: cannot tell
		}
		o, n := m.Old[i], m.New[i]
		if n.Kind == decoding.ColumnUnchanged {
			continue
		}
		if o.Kind != n.Kind && !(o.Kind == decoding.ColumnText || o.Kind == decoding.ColumnBinary) {
			return true
		}
		if (o.Kind == decoding.ColumnNull) != (n.Kind == decoding.ColumnNull) || string(o.Data) != string(n.Data) {
			return true
		}
	}
	return false
}

// debezium writes x as Debezium events, one line per change, and returns the number of events.
func (w *Writer) debezium(x *dbzTxn) (int64, error) {
	now := w.now()
	if w.order == nil {
		w.order = map[uint32]int64{}
	}
	clear(w.order)
	var n int64
	for c, err := range x.Changes() {
		if err != nil {
			return n, err
		}
		x.schema = c.Schema
		switch m := c.Msg.(type) {
		case *decoding.Relation, *decoding.DataType:
			continue
		case *decoding.Insert:
			t, err := w.rowTable(x, c.Relation, m.RelationID, m.New)
			if err != nil {
				return n, err
			}
			op := byte('c')
			if x.snapshot {
				op = 'r'
			}
			if err := w.dbzEvent(x, t, op, change{after: m.New}, now, n+1); err != nil {
				return n, err
			}
		case *decoding.Update:
			t, err := w.rowTable(x, c.Relation, m.RelationID, m.Old, m.New)
			if err != nil {
				return n, err
			}
			ch := change{after: m.New}
			if m.OldKind != 0 {
				ch.before, ch.oldKind = m.Old, m.OldKind
			}
			if w.event == nil || !t.keyChanged(m) {
				if err := w.dbzEvent(x, t, 'u', ch, now, n+1); err != nil {
					return n, err
				}
				break
			}
			// A new key: a delete of the old one and a create of the new, as Debezium, so that a
			// table or compacted topic built by key keeps no row under the old key.
			oldKey, err := w.keyJSON(x, t, m.Old, nil)
			if err != nil {
				return n, err
			}
			newKey, err := w.keyJSON(x, t, m.New, m.Old)
			if err != nil {
				return n, err
			}
			d := change{before: m.Old, oldKind: m.OldKind, header: Header{Key: HeaderNewKey, Value: newKey}}
			if err := w.dbzEvent(x, t, 'd', d, now, n+1); err != nil {
				return n, err
			}
			n++
			cr := change{after: m.New, old: m.Old, header: Header{Key: HeaderOldKey, Value: oldKey}}
			if err := w.dbzEvent(x, t, 'c', cr, now, n+1); err != nil {
				return n, err
			}
		case *decoding.Delete:
			t, err := w.rowTable(x, c.Relation, m.RelationID, m.Old)
			if err != nil {
				return n, err
			}
			if err := w.dbzEvent(x, t, 'd', change{before: m.Old, oldKind: m.OldKind}, now, n+1); err != nil {
				return n, err
			}
		case *decoding.Truncate:
			tables := make([]*dbzTable, len(m.RelationIDs))
			for i, id := range m.RelationIDs {
				r, ok := c.Schema.Relation(id)
				if !ok {
					return n, fmt.Errorf("%w: relation %d", ErrUnknownRelation, id)
				}
				t, err := w.table(x, r)
				if err != nil {
					return n, err
				}
				tables[i] = t
			}
			for i, t := range tables { // one event per table, as Debezium
				if err := w.dbzEvent(x, t, 't', change{}, now, n+int64(i)+1); err != nil {
					return n, err
				}
			}
			n += int64(len(tables)) - 1
		case *decoding.LogicalMessage:
			if err := w.dbzMessage(x, m, now, n+1); err != nil {
				return n, err
			}
		default:
			return n, fmt.Errorf("format: unexpected %v message inside a transaction", m.Type())
		}
		n++
		w.enc.maybeFlush()
	}
	return n, nil
}

// rowTable returns the table of a row change, checking the tuples' shape.
func (w *Writer) rowTable(x *dbzTxn, r *decoding.Relation, id uint32, tuples ...decoding.Tuple) (*dbzTable, error) {
	r, err := w.relation(r, id, tuples...)
	if err != nil {
		return nil, err
	}
	return w.table(x, r)
}

// change is what one row event holds.
type change struct {
	before  decoding.Tuple // the old row or key, nil for none
	oldKind byte           // tupleKey or TupleOld: what before holds
	after   decoding.Tuple // the new row, nil for none
	old     decoding.Tuple // for the key of a create after a key change: values the new row did not send
	header  Header         // a key change's header, Key "" for none
}

// dbzEvent writes one row or truncate event of table t.
func (w *Writer) dbzEvent(x *dbzTxn, t *dbzTable, op byte, ch change, now time.Time, total int64) error {
	e := &w.enc
	schemas := w.event != nil && w.cfg.ValueSchema
	if schemas {
		e.raw(`{"schema":`)
		e.buf = append(e.buf, w.envelope(t)...)
		e.raw(`,"payload":`)
	}
	e.raw(`{"before":`)
	if err := w.dbzRow(x, t, ch.before, ch.oldKind); err != nil {
		return err
	}
	e.raw(`,"after":`)
	if err := w.dbzRow(x, t, ch.after, tupleNew); err != nil {
		return err
	}
	e.raw(`,"source":`)
	w.dbzSource(x, t.rel, now)
	w.order[t.rel.RelationID]++
	if x.snapshot {
		e.raw(`,"transaction":null`)
	} else {
		w.dbzTransaction(x, total, w.order[t.rel.RelationID])
	}
	e.raw(`,"op":"`)
	e.byte(op)
	e.raw(`",`)
	appendTimes(e, now)
	e.byte('}')
	if schemas {
		e.byte('}')
	}
	e.byte('\n')
	if w.event == nil {
		return nil
	}
	var key decoding.Tuple
	var alt decoding.Tuple
	switch op {
	case 'd':
		key = ch.before
	case 't':
	default:
		key, alt = ch.after, ch.old
		if alt == nil {
			alt = ch.before
		}
	}
	return w.emitEvent(x, t, op, key, alt, ch.header, nil)
}

// appendTimes writes "ts_ms":…,"ts_us":…,"ts_ns":… of t.
func appendTimes(e *encoder, t time.Time) {
	us := t.UnixMicro()
	e.raw(`"ts_ms":`)
	e.int(t.UnixMilli())
	e.raw(`,"ts_us":`)
	e.int(us)
	e.raw(`,"ts_ns":`)
	e.int(us * 1000)
}

// dbzMessage writes a logical decoding message event (op "m"), as Debezium does.
func (w *Writer) dbzMessage(x *dbzTxn, m *decoding.LogicalMessage, now time.Time, total int64) error {
	e := &w.enc
	schemas := w.event != nil && w.cfg.ValueSchema
	if schemas {
		e.raw(`{"schema":` + messageSchema + `,"payload":`)
	}
	e.raw(`{"op":"m","ts_ms":`)
	e.int(now.UnixMilli())
	e.raw(`,"source":`)
	w.dbzSource(x, nil, now)
	if m.Transactional() {
		w.dbzTransaction(x, total, 1) // each message is a data collection of its own
	} else {
		e.raw(`,"transaction":null`)
	}
	e.raw(`,"message":{"prefix":`)
	e.name(m.Prefix)
	e.raw(`,"content":`)
	e.base64(m.Content)
	e.byte('}')
	e.byte('}')
	if schemas {
		e.byte('}')
	}
	e.byte('\n')
	if w.event != nil {
		return w.emitEvent(x, nil, 'm', nil, nil, Header{}, m)
	}
	return nil
}

func (w *Writer) dbzSource(x *dbzTxn, r *decoding.Relation, now time.Time) {
	e := &w.enc
	e.raw(`{"version":`)
	e.name(w.cfg.Version)
	e.raw(`,"connector":"` + Connector + `","name":`)
	e.name(w.cfg.Server)
	ts := now
	if !x.commitTime.IsZero() {
		ts = x.commitTime
	}
	e.raw(`,"ts_ms":`)
	e.int(ts.UnixMilli())
	if x.snapshot {
		e.raw(`,"snapshot":"true","db":`)
	} else {
		e.raw(`,"snapshot":"false","db":`)
	}
	e.name(w.cfg.Database)
	e.raw(`,"sequence":`)
	if x.snapshot && x.commitLSN != 0 {
		e.raw(`"[null,\"`)
		e.uint(x.commitLSN)
		e.raw(`\"]"`)
	} else {
		e.raw("null")
	}
	e.raw(`,"ts_us":`)
	e.int(ts.UnixMicro())
	e.raw(`,"ts_ns":`)
	e.int(ts.UnixMicro() * 1000)
	e.raw(`,"schema":`)
	if r != nil {
		e.name(namespace(r))
		e.raw(`,"table":`)
		e.name(r.Name)
	} else {
		e.raw(`"","table":""`)
	}
	e.raw(`,"txId":`)
	if x.nonTx || x.snapshot {
		e.raw("null")
	} else {
		e.uint(uint64(x.xid))
	}
	e.raw(`,"lsn":`)
	if x.commitLSN == 0 {
		e.raw("null")
	} else {
		e.uint(x.commitLSN)
	}
	e.raw(`,"xmin":null,"origin":`)
	if x.origin == "" {
		e.raw(`null,"origin_lsn":null}`)
		return
	}
	e.name(x.origin)
	e.raw(`,"origin_lsn":`)
	if x.originLSN == 0 {
		e.raw("null}")
	} else {
		e.uint(x.originLSN)
		e.byte('}')
	}
}

// dbzTransaction writes the transaction block: Debezium's id "xid:lsn", the event's position in
// the transaction and among the transaction's events for its table (0 for a message).
func (w *Writer) dbzTransaction(x *dbzTxn, total, table int64) {
	e := &w.enc
	e.raw(`,"transaction":{"id":"`)
	e.uint(uint64(x.xid))
	e.byte(':')
	e.uint(x.commitLSN)
	e.raw(`","total_order":`)
	e.int(total)
	e.raw(`,"data_collection_order":`)
	e.int(table)
	e.byte('}')
}

// dbzRow writes a row as a JSON object of typed values, or null for a nil tuple. kind says what
// the tuple holds: a key (TupleKey: only the replica identity's columns were sent) or a whole
// row. A column the server did not send is null, or, where the table's NOT NULL columns are
// known (Config.Tables), what Debezium writes for a value it lacks: the column's default, else
// the type's zero value.
func (w *Writer) dbzRow(x *dbzTxn, t *dbzTable, tuple decoding.Tuple, kind byte) error {
	e := &w.enc
	if tuple == nil {
		e.raw("null")
		return nil
	}
	row, err := w.vals.Row(x, t.rel, tuple)
	if err != nil {
		return err
	}
	e.byte('{')
	for c := range row.Columns() {
		if c.Index > 0 {
			e.byte(',')
		}
		e.name(c.Name)
		e.byte(':')
		if kind == tupleKey && c.Null() && !t.rel.Columns[c.Index].IsKey() && t.notNull[c.Index] {
			if d := t.defs[c.Index]; d != nil {
				e.buf = append(e.buf, d...)
			} else {
				e.raw(t.types[c.Index].zero())
			}
			continue
		}
		if err := w.dbzValue(t.types[c.Index], c); err != nil {
			return err
		}
		e.maybeFlush()
	}
	e.byte('}')
	return nil
}

// dbzValue writes one column value as t maps it.
func (w *Writer) dbzValue(t *dbzType, c pgvalue.Column) error {
	e := &w.enc
	switch {
	case c.Null():
		e.raw("null")
		return nil
	case c.Unchanged():
		if t.kind == kBytes {
			e.base64([]byte(Unavailable))
		} else {
			e.raw(`"` + Unavailable + `"`)
		}
		return nil
	}
	text := c.Format() == pgtype.TextFormatCode
	if _, known := c.Type(); !known {
		if text {
			e.bytes(c.Data, invalidReplace)
		} else {
			e.base64(c.Data)
		}
		return nil
	}
	switch t.kind {
	case kString, kXML, kEnum:
		// Their send functions send the text too.
		e.bytes(c.Data, invalidReplace)
		return nil
	case kJSON:
		switch {
		case text || t.oid == pgtype.JSONOID:
			e.bytes(c.Data, invalidReplace)
			return nil
		case len(c.Data) > 0 && c.Data[0] == 1: // jsonb_send: version 1, then the text
			e.bytes(c.Data[1:], invalidReplace)
			return nil
		}
	case kUUID:
		if text {
			e.bytes(c.Data, invalidReplace)
			return nil
		}
	case kDecimalString:
		if text {
			e.bytes(c.Data, invalidReplace)
			return nil
		}
		// pgtype.Numeric drops the display scale of a zero ("0.000"): read the text off the
		// binary format, as PostgreSQL's numeric_out does.
		b, err := appendNumericText(e.buf, c.Data)
		if err != nil {
			return &pgvalue.ValueError{Column: c.Name, TypeOID: c.TypeOID, Err: err}
		}
		e.buf = b
		return nil
	}
	v, err := c.Value()
	if err != nil {
		return err
	}
	return w.value(t, v)
}

// keyJSON returns the event key of a row as JSON without a schema ({"id":1}), nil for a table
// without key. A key column the row did not send (an unchanged TOASTed value) is taken from alt.
func (w *Writer) keyJSON(x *dbzTxn, t *dbzTable, tuple, alt decoding.Tuple) ([]byte, error) {
	if t.key == nil || tuple == nil {
		return nil, nil
	}
	return w.into(nil, func() error { return w.keyObject(x, t, tuple, alt) })
}

// keyObject writes the key object of a row.
func (w *Writer) keyObject(x *dbzTxn, t *dbzTable, tuple, alt decoding.Tuple) error {
	e := &w.enc
	row, err := w.vals.Row(x, t.rel, tuple)
	if err != nil {
		return err
	}
	var altRow pgvalue.Row
	if alt != nil {
		if altRow, err = w.vals.Row(x, t.rel, alt); err != nil {
			return err
		}
	}
	e.byte('{')
	for n, i := range t.key {
		if n > 0 {
			e.byte(',')
		}
		e.name(t.rel.Columns[i].Name)
		e.byte(':')
		var c pgvalue.Column
		if i < row.Len() {
			c = row.Column(i)
		}
		if (c.Unchanged() || i >= row.Len()) && alt != nil && i < altRow.Len() {
			c = altRow.Column(i)
		}
		if i >= row.Len() && c.Name == "" {
			e.raw("null")
			continue
		}
		if err := w.dbzValue(t.types[i], c); err != nil {
			return err
		}
	}
	e.byte('}')
	return nil
}

// into runs f with the encoder writing at the end of b instead of to the output, and returns b
// with what f wrote.
func (w *Writer) into(b []byte, f func() error) ([]byte, error) {
	saved := w.enc
	var spill eventSink
	w.enc = encoder{buf: b, w: &spill}
	err := f()
	out := w.enc.buf
	if len(spill.b) > 0 {
		out = append(spill.b, out...)
	}
	w.enc = saved
	return out, err
}

// columnIndex returns the index of r's column name, -1 if it has none.
func columnIndex(r *decoding.Relation, name string) int {
	for i, c := range r.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// dbzGo writes a decoded value of type oid.
func (w *Writer) dbzGo(oid uint32, v any) error {
	e := &w.enc
	if oid == pgtype.JSONOID || oid == pgtype.JSONBOID {
		if v == nil {
			e.raw("null")
			return nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		e.bytes(b, invalidReplace)
		return nil
	}
	switch v := v.(type) {
	case nil:
		e.raw("null")
	case bool:
		e.bool(v)
	case int16:
		e.int(int64(v))
	case int32:
		e.int(int64(v))
	case int64:
		e.int(v)
	case uint32:
		e.uint(uint64(v))
	case float32:
		w.float(float64(v), 32)
	case float64:
		w.float(v, 64)
	case string:
		e.str(v, invalidReplace)
	case []byte:
		e.base64(v)
	case [16]byte:
		e.buf = append(e.buf, '"')
		e.buf = appendUUID(e.buf, v)
		e.buf = append(e.buf, '"')
	case time.Time:
		switch oid {
		case pgtype.DateOID:
			e.int(int64(math.Floor(float64(v.Unix()) / 86400)))
		case pgtype.TimestampOID:
			e.int(v.UnixMicro())
		default:
			e.buf = append(e.buf, '"')
			e.buf = v.UTC().AppendFormat(e.buf, "2006-01-02T15:04:05.999999Z07:00")
			e.buf = append(e.buf, '"')
		}
	case pgtype.InfinityModifier:
		if v < 0 {
			e.raw(`"-infinity"`)
		} else {
			e.raw(`"infinity"`)
		}
	case pgtype.Time:
		e.int(v.Microseconds)
	case pgtype.Interval:
		e.buf = append(e.buf, '"')
		e.buf = appendISOInterval(e.buf, v)
		e.buf = append(e.buf, '"')
	case []any:
		elem := uint32(0)
		if t, ok := w.vals.Map().TypeForOID(oid); ok {
			if ac, ok := t.Codec.(*pgtype.ArrayCodec); ok {
				elem = ac.ElementType.OID
			}
		}
		e.byte('[')
		for i, el := range v {
			if i > 0 {
				e.byte(',')
			}
			if err := w.dbzGo(elem, el); err != nil {
				return err
			}
			e.maybeFlush()
		}
		e.byte(']')
	default:
		// Anything else (numeric, inet, point, ranges...) as PostgreSQL's text for it.
		b, err := w.vals.Map().Encode(oid, pgtype.TextFormatCode, v, nil)
		if err != nil || b == nil {
			b = fmt.Append(nil, v)
		}
		e.bytes(b, invalidReplace)
	}
	return nil
}

// float writes a float as a JSON number, NaN and the infinities as Jackson writes them: strings.
func (w *Writer) float(f float64, bits int) {
	e := &w.enc
	switch {
	case math.IsNaN(f):
		e.raw(`"NaN"`)
	case math.IsInf(f, 1):
		e.raw(`"Infinity"`)
	case math.IsInf(f, -1):
		e.raw(`"-Infinity"`)
	default:
		e.buf = strconv.AppendFloat(e.buf, f, 'g', -1, bits)
	}
}

func appendUUID(b []byte, u [16]byte) []byte {
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hexDigits[c>>4], hexDigits[c&0xF])
	}
	return b
}

// appendISOInterval writes an interval as an ISO 8601 duration, as PostgreSQL's
// IntervalStyle iso_8601 does: P1Y2M3DT4H5M6.5S, PT0S for zero, each part with its own sign.
func appendISOInterval(b []byte, iv pgtype.Interval) []byte {
	start := len(b)
	b = append(b, 'P')
	part := func(v int64, unit byte) {
		if v != 0 {
			b = strconv.AppendInt(b, v, 10)
			b = append(b, unit)
		}
	}
	part(int64(iv.Months/12), 'Y')
	part(int64(iv.Months%12), 'M')
	part(int64(iv.Days), 'D')
	us := iv.Microseconds
	if us != 0 || len(b) == start+1 {
		b = append(b, 'T')
		h := us / 3600_000_000
		us -= h * 3600_000_000
		m := us / 60_000_000
		us -= m * 60_000_000
		part(h, 'H')
		part(m, 'M')
		if us != 0 || h == 0 && m == 0 {
			if us < 0 {
				b = append(b, '-')
				us = -us
			}
			b = strconv.AppendInt(b, us/1_000_000, 10)
			if frac := us % 1_000_000; frac != 0 {
				s := strconv.FormatInt(frac+1_000_000, 10)[1:] // six digits
				for s[len(s)-1] == '0' {
					s = s[:len(s)-1]
				}
				b = append(b, '.')
				b = append(b, s...)
			}
			b = append(b, 'S')
		}
	}
	return b
}

// appendNumericText writes a numeric in the binary format (numeric_send: ndigits, weight, sign,
// dscale, then base-10000 digits) as a JSON string of its text, with its display scale.
func appendNumericText(b, src []byte) ([]byte, error) {
	if len(src) < 8 {
		return b, fmt.Errorf("numeric: %d bytes", len(src))
	}
	ndigits := int(int16(uint16(src[0])<<8 | uint16(src[1])))
	weight := int(int16(uint16(src[2])<<8 | uint16(src[3])))
	sign := uint16(src[4])<<8 | uint16(src[5])
	dscale := int(int16(uint16(src[6])<<8 | uint16(src[7])))
	if ndigits < 0 || dscale < 0 || len(src) != 8+2*ndigits {
		return b, fmt.Errorf("numeric: malformed")
	}
	digit := func(d int) int {
		if d < 0 || d >= ndigits {
			return 0
		}
		return int(uint16(src[8+2*d])<<8 | uint16(src[9+2*d]))
	}
	for d := range ndigits {
		if digit(d) > 9999 {
			return b, fmt.Errorf("numeric: digit %d out of range", digit(d))
		}
	}
	b = append(b, '"')
	switch sign {
	case 0xC000:
		return append(b, `NaN"`...), nil
	case 0xD000:
		return append(b, `Infinity"`...), nil
	case 0xF000:
		return append(b, `-Infinity"`...), nil
	case 0x4000:
		b = append(b, '-')
	case 0x0000:
	default:
		return b, fmt.Errorf("numeric: sign %#x", sign)
	}
	d := 0
	if weight < 0 {
		d = weight + 1
		b = append(b, '0')
	} else {
		for ; d <= weight; d++ {
			if d == 0 {
				b = strconv.AppendInt(b, int64(digit(d)), 10)
			} else {
				b = append(b, strconv.Itoa(digit(d) + 10000)[1:]...)
			}
		}
	}
	if dscale > 0 {
		b = append(b, '.')
		end := len(b) + dscale
		for i := 0; i < dscale; i, d = i+4, d+1 {
			b = append(b, strconv.Itoa(digit(d) + 10000)[1:]...)
		}
		b = b[:end]
	}
	return append(b, '"'), nil
}
