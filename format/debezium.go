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
	nonTx      bool // a non-transactional message: no txId
	snapshot   bool // copied rows: op "r", snapshot "true", no transaction block

	schema decoding.Schema // the schema of the change being written
}

// Relation and Type resolve against the schema of the change being written.
func (x *dbzTxn) Relation(id uint32) (*decoding.Relation, bool) { return x.schema.Relation(id) }
func (x *dbzTxn) Type(oid uint32) (*decoding.DataType, bool)    { return x.schema.Type(oid) }

func txnSource(x *reorderbuffer.Txn) *dbzTxn {
	return &dbzTxn{Source: x, xid: x.Xid, commitLSN: uint64(x.CommitLSN), commitTime: x.CommitTime, nonTx: x.NonTransactional}
}

// debezium writes x as Debezium events, one line per change, and returns the number of events.
func (w *Writer) debezium(x *dbzTxn) (int64, error) {
	now := w.now().UnixMilli()
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
			r, err := w.relation(c.Relation, m.RelationID, m.New)
			if err == nil {
				op := byte('c')
				if x.snapshot {
					op = 'r'
				}
				err = w.dbzEvent(x, r, op, nil, m.New, now, n+1)
			}
			if err != nil {
				return n, err
			}
		case *decoding.Update:
			r, err := w.relation(c.Relation, m.RelationID, m.Old, m.New)
			if err == nil {
				var before decoding.Tuple
				if m.OldKind != 0 {
					before = m.Old
				}
				err = w.dbzEvent(x, r, 'u', before, m.New, now, n+1)
			}
			if err != nil {
				return n, err
			}
		case *decoding.Delete:
			r, err := w.relation(c.Relation, m.RelationID, m.Old)
			if err == nil {
				err = w.dbzEvent(x, r, 'd', m.Old, nil, now, n+1)
			}
			if err != nil {
				return n, err
			}
		case *decoding.Truncate:
			rels := make([]*decoding.Relation, len(m.RelationIDs))
			for i, id := range m.RelationIDs {
				r, ok := c.Schema.Relation(id)
				if !ok {
					return n, fmt.Errorf("%w: relation %d", ErrUnknownRelation, id)
				}
				rels[i] = r
			}
			for i, r := range rels { // one event per table, as Debezium
				if err := w.dbzEvent(x, r, 't', nil, nil, now, n+int64(i)+1); err != nil {
					return n, err
				}
			}
			n += int64(len(rels)) - 1
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

// dbzEvent writes one change event; before and after are nil when the event has none.
func (w *Writer) dbzEvent(x *dbzTxn, r *decoding.Relation, op byte, before, after decoding.Tuple, now, total int64) error {
	e := &w.enc
	e.raw(`{"before":`)
	if err := w.dbzRow(x, r, before, op == 'd'); err != nil {
		return err
	}
	e.raw(`,"after":`)
	if err := w.dbzRow(x, r, after, op == 'c' || op == 'u' || op == 'r'); err != nil {
		return err
	}
	e.raw(`,"source":`)
	w.dbzSource(x, r, now)
	e.raw(`,"op":"`)
	e.byte(op)
	e.raw(`","ts_ms":`)
	e.int(now)
	w.order[r.RelationID]++
	if x.snapshot {
		e.raw(`,"transaction":null`)
	} else {
		w.dbzTransaction(x, total, w.order[r.RelationID])
	}
	e.raw("}\n")
	if w.event != nil {
		key := after
		if op == 'd' {
			key = before
		}
		return w.emitEvent(x, r, op, key, nil)
	}
	return nil
}

// dbzMessage writes a logical decoding message event (op "m"), as Debezium does.
func (w *Writer) dbzMessage(x *dbzTxn, m *decoding.LogicalMessage, now, total int64) error {
	e := &w.enc
	e.raw(`{"op":"m","ts_ms":`)
	e.int(now)
	e.raw(`,"source":`)
	w.dbzSource(x, nil, now)
	e.raw(`,"message":{"prefix":`)
	e.name(m.Prefix)
	e.raw(`,"content":`)
	e.base64(m.Content)
	e.byte('}')
	if m.Transactional() {
		w.dbzTransaction(x, total, 0)
	} else {
		e.raw(`,"transaction":null`)
	}
	e.raw("}\n")
	if w.event != nil {
		return w.emitEvent(x, nil, 'm', nil, m)
	}
	return nil
}

func (w *Writer) dbzSource(x *dbzTxn, r *decoding.Relation, now int64) {
	e := &w.enc
	e.byte('{')
	if w.cfg.Version != "" {
		e.raw(`"version":`)
		e.name(w.cfg.Version)
		e.byte(',')
	}
	e.raw(`"connector":"` + Connector + `","name":`)
	e.name(w.cfg.Server)
	ts := now
	if !x.commitTime.IsZero() {
		ts = x.commitTime.UnixMilli()
	}
	e.raw(`,"ts_ms":`)
	e.int(ts)
	if x.snapshot {
		e.raw(`,"snapshot":"true","db":`)
	} else {
		e.raw(`,"snapshot":"false","db":`)
	}
	e.name(w.cfg.Database)
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
	if x.snapshot {
		e.raw("null")
	} else {
		e.uint(x.commitLSN)
	}
	e.raw(`,"xmin":null}`)
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

// dbzRow writes a row as a JSON object of typed values, or null when the event has none.
func (w *Writer) dbzRow(x *dbzTxn, r *decoding.Relation, t decoding.Tuple, present bool) error {
	e := &w.enc
	if !present {
		e.raw("null")
		return nil
	}
	row, err := w.vals.Row(x, r, t)
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
		if err := w.dbzValue(c); err != nil {
			return err
		}
		e.maybeFlush()
	}
	e.byte('}')
	return nil
}

// dbzValue writes one column value with the mapping of the package documentation.
func (w *Writer) dbzValue(c pgvalue.Column) error {
	e := &w.enc
	switch {
	case c.Null():
		e.raw("null")
		return nil
	case c.Unchanged():
		e.raw(`"` + Unavailable + `"`)
		return nil
	}
	text := c.Format() == pgtype.TextFormatCode
	t, known := c.Type()
	if !known {
		if text {
			e.bytes(c.Data, invalidReplace)
		} else {
			e.base64(c.Data)
		}
		return nil
	}
	switch t.OID {
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID, charOID, xmlOID, pgtype.JSONOID:
		// Strings, and json as a string (as Debezium): their send functions send the text too.
		e.bytes(c.Data, invalidReplace)
		return nil
	case pgtype.NumericOID:
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
	case pgtype.UUIDOID:
		if text {
			e.bytes(c.Data, invalidReplace)
			return nil
		}
	case pgtype.JSONBOID:
		switch {
		case text:
			e.bytes(c.Data, invalidReplace)
			return nil
		case len(c.Data) > 0 && c.Data[0] == 1: // jsonb_send: version 1, then the text
			e.bytes(c.Data[1:], invalidReplace)
			return nil
		}
	}
	v, err := c.Value()
	if err != nil {
		return err
	}
	return w.dbzGo(t.OID, v)
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
