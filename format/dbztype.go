package format

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgreorder/pgreorder/pgvalue"
)

// DecimalHandling says how numeric values are written, as Debezium's decimal.handling.mode.
type DecimalHandling int

const (
	// DecimalPrecise writes numeric(p,s) as Kafka Connect's Decimal (the unscaled value's
	// big-endian two's complement bytes, base64 in JSON; scale and precision in the schema) and a
	// numeric without a declared scale as io.debezium.data.VariableScaleDecimal, {"scale":S,
	// "value":BYTES}; NaN and ±Infinity become null. Debezium's default.
	DecimalPrecise DecimalHandling = iota
	// DecimalString writes PostgreSQL's text for the value ("12.50", "NaN").
	DecimalString
	// DecimalDouble writes a JSON number (a double, which may round); NaN and ±Infinity as the
	// strings "NaN", "Infinity", "-Infinity".
	DecimalDouble
)

// ParseDecimalHandling returns the handling named s: precise, string or double ("" is
// DecimalPrecise).
func ParseDecimalHandling(s string) (DecimalHandling, error) {
	switch s {
	case "", "precise":
		return DecimalPrecise, nil
	case "string":
		return DecimalString, nil
	case "double":
		return DecimalDouble, nil
	}
	return 0, fmt.Errorf("format: decimal handling %q (valid: precise, string, double)", s)
}

// IntervalHandling says how interval values are written, as Debezium's interval.handling.mode.
type IntervalHandling int

const (
	// IntervalNumeric writes io.debezium.time.MicroDuration: microseconds, a month counted as
	// 365.25/12 days. Debezium's default.
	IntervalNumeric IntervalHandling = iota
	// IntervalString writes io.debezium.time.Interval, an ISO 8601 duration: "P1Y2M3DT4H5M6.78S".
	IntervalString
)

// ParseIntervalHandling returns the handling named s: numeric or string ("" is IntervalNumeric).
func ParseIntervalHandling(s string) (IntervalHandling, error) {
	switch s {
	case "", "numeric":
		return IntervalNumeric, nil
	case "string":
		return IntervalString, nil
	}
	return 0, fmt.Errorf("format: interval handling %q (valid: numeric, string)", s)
}

// dbzKind is what a column's values become in a Debezium event: Connect's schema type and
// logical name, and how a value is written.
type dbzKind uint8

const (
	kUnknown         dbzKind = iota // a string: the text, or base64 of a binary value
	kBool                           // boolean
	kInt16                          // int16
	kInt32                          // int32
	kInt64                          // int64
	kFloat32                        // float
	kFloat64                        // double
	kDecimal                        // bytes, org.apache.kafka.connect.data.Decimal
	kVarDecimal                     // struct, io.debezium.data.VariableScaleDecimal
	kDecimalString                  // string
	kDecimalDouble                  // double
	kString                         // string
	kBytes                          // bytes
	kDate                           // int32, io.debezium.time.Date: days since 1970-01-01
	kTimeMillis                     // int32, io.debezium.time.Time: milliseconds since midnight
	kTimeMicros                     // int64, io.debezium.time.MicroTime
	kTimestampMillis                // int64, io.debezium.time.Timestamp
	kTimestampMicros                // int64, io.debezium.time.MicroTimestamp
	kZoned                          // string, io.debezium.time.ZonedTimestamp
	kDuration                       // int64, io.debezium.time.MicroDuration
	kInterval                       // string, io.debezium.time.Interval
	kUUID                           // string, io.debezium.data.Uuid
	kJSON                           // string, io.debezium.data.Json
	kXML                            // string, io.debezium.data.Xml
	kEnum                           // string, io.debezium.data.Enum
	kArray                          // array of elem
)

// dbzType is the mapping of one column (or array element) type.
type dbzType struct {
	kind             dbzKind
	oid              uint32 // the OID pgtype decodes the value with (a domain's base type)
	scale, precision int    // kDecimal
	width            int    // kZoned: digits of the fraction; 0: only those needed
	labels           string // kEnum: the labels, comma-separated
	elem             *dbzType
}

// Built-in type OIDs pgtype has no constant for.
const (
	oidOID = 26
)

// precisionOf returns the fractional-second precision of a time or timestamp typmod (-1: 6).
func precisionOf(mod int32) int {
	if mod < 0 || mod > 6 {
		return 6
	}
	return int(mod)
}

// classify maps type oid (resolved: a domain's base type) with typmod mod.
func (w *Writer) classify(m *pgtype.Map, oid uint32, mod int32, labels []string) *dbzType {
	t := &dbzType{oid: oid}
	switch oid {
	case pgtype.BoolOID:
		t.kind = kBool
	case pgtype.Int2OID:
		t.kind = kInt16
	case pgtype.Int4OID:
		t.kind = kInt32
	case pgtype.Int8OID, oidOID:
		t.kind = kInt64
	case pgtype.Float4OID:
		t.kind = kFloat32
	case pgtype.Float8OID:
		t.kind = kFloat64
	case pgtype.NumericOID:
		switch w.cfg.Decimal {
		case DecimalString:
			t.kind = kDecimalString
		case DecimalDouble:
			t.kind = kDecimalDouble
		default:
			if mod < 4 {
				t.kind = kVarDecimal
			} else {
				t.kind = kDecimal
				// make_numeric_typmod: precision << 16 | scale in 11 bits, signed (15+).
				t.precision = int((mod - 4) >> 16 & 0xFFFF)
				t.scale = int(((mod-4)&0x7FF)^1024) - 1024
			}
		}
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID, charOID:
		t.kind = kString
	case xmlOID:
		t.kind = kXML
	case pgtype.ByteaOID:
		t.kind = kBytes
	case pgtype.DateOID:
		t.kind = kDate
	case pgtype.TimeOID:
		t.kind = kTimeMicros
		if precisionOf(mod) <= 3 {
			t.kind = kTimeMillis
		}
	case pgtype.TimestampOID:
		t.kind = kTimestampMicros
		if precisionOf(mod) <= 3 {
			t.kind = kTimestampMillis
		}
	case pgtype.TimestamptzOID:
		t.kind, t.width = kZoned, precisionOf(mod)
	case pgtype.IntervalOID:
		t.kind = kDuration
		if w.cfg.Interval == IntervalString {
			t.kind = kInterval
		}
	case pgtype.UUIDOID:
		t.kind = kUUID
	case pgtype.JSONOID, pgtype.JSONBOID:
		t.kind = kJSON
	default:
		if labels != nil {
			t.kind, t.labels = kEnum, strings.Join(labels, ",")
			return t
		}
		if pt, ok := m.TypeForOID(oid); ok {
			if ac, ok := pt.Codec.(*pgtype.ArrayCodec); ok && ac.ElementType != nil {
				t.kind, t.elem = kArray, w.classify(m, ac.ElementType.OID, mod, nil)
			}
		}
	}
	return t
}

// columnType maps a column of a relation.
func (w *Writer) columnType(c pgvalue.Column, info *TableColumn) *dbzType {
	oid := c.TypeOID
	if t, ok := c.Type(); ok {
		oid = t.OID
	}
	var labels []string
	if info != nil {
		labels = info.EnumLabels
	}
	return w.classify(w.vals.Map(), oid, c.TypeMod, labels)
}

// Connect schema types and logical names of the kinds.
var kindSchema = [...]struct{ typ, name string }{
	kUnknown:         {"string", ""},
	kBool:            {"boolean", ""},
	kInt16:           {"int16", ""},
	kInt32:           {"int32", ""},
	kInt64:           {"int64", ""},
	kFloat32:         {"float", ""},
	kFloat64:         {"double", ""},
	kDecimal:         {"bytes", "org.apache.kafka.connect.data.Decimal"},
	kVarDecimal:      {"struct", "io.debezium.data.VariableScaleDecimal"},
	kDecimalString:   {"string", ""},
	kDecimalDouble:   {"double", ""},
	kString:          {"string", ""},
	kBytes:           {"bytes", ""},
	kDate:            {"int32", "io.debezium.time.Date"},
	kTimeMillis:      {"int32", "io.debezium.time.Time"},
	kTimeMicros:      {"int64", "io.debezium.time.MicroTime"},
	kTimestampMillis: {"int64", "io.debezium.time.Timestamp"},
	kTimestampMicros: {"int64", "io.debezium.time.MicroTimestamp"},
	kZoned:           {"string", "io.debezium.time.ZonedTimestamp"},
	kDuration:        {"int64", "io.debezium.time.MicroDuration"},
	kInterval:        {"string", "io.debezium.time.Interval"},
	kUUID:            {"string", "io.debezium.data.Uuid"},
	kJSON:            {"string", "io.debezium.data.Json"},
	kXML:             {"string", "io.debezium.data.Xml"},
	kEnum:            {"string", "io.debezium.data.Enum"},
	kArray:           {"array", ""},
}

// appendSchema appends the Connect schema of t as Kafka's JsonConverter writes it: type, items
// or fields, optional, name, version, doc, parameters, default, field. def is the default's JSON
// (nil for none), field the field's name ("" for none).
func (t *dbzType) appendSchema(b []byte, optional bool, def []byte, field string) []byte {
	s := kindSchema[t.kind]
	b = append(b, `{"type":"`...)
	b = append(b, s.typ...)
	b = append(b, '"')
	switch t.kind {
	case kArray:
		b = append(b, `,"items":`...)
		b = t.elem.appendSchema(b, true, nil, "")
	case kVarDecimal:
		b = append(b, `,"fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}]`...)
	}
	b = append(b, `,"optional":`...)
	b = strconv.AppendBool(b, optional)
	if s.name != "" {
		b = append(b, `,"name":"`...)
		b = append(b, s.name...)
		b = append(b, `","version":1`...)
	}
	switch t.kind {
	case kVarDecimal:
		b = append(b, `,"doc":"Variable scaled decimal"`...)
	case kDecimal:
		b = append(b, `,"parameters":{"scale":"`...)
		b = strconv.AppendInt(b, int64(t.scale), 10)
		b = append(b, `","connect.decimal.precision":"`...)
		b = strconv.AppendInt(b, int64(t.precision), 10)
		b = append(b, `"}`...)
	case kEnum:
		b = append(b, `,"parameters":{"allowed":`...)
		b = appendJSONString(b, t.labels)
		b = append(b, '}')
	}
	if def != nil {
		b = append(b, `,"default":`...)
		b = append(b, def...)
	}
	if field != "" {
		b = append(b, `,"field":`...)
		b = appendJSONName(b, field)
	}
	return append(b, '}')
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

// appendJSONName appends a name as the events write names (EscapeName).
func appendJSONName(b []byte, s string) []byte {
	e := encoder{buf: b}
	e.name(s)
	return e.buf
}

// zero returns the JSON of the value Debezium writes for a NOT NULL column that has no default
// and whose value the server did not send (a delete's old key under REPLICA IDENTITY DEFAULT).
func (t *dbzType) zero() string {
	switch t.kind {
	case kBool:
		return "false"
	case kInt16, kInt32, kInt64, kDate, kTimeMillis, kTimeMicros, kTimestampMillis, kTimestampMicros, kDuration:
		return "0"
	case kFloat32, kFloat64, kDecimalDouble:
		return "0.0"
	case kDecimal:
		return `"AA=="`
	case kVarDecimal:
		return `{"scale":0,"value":"AA=="}`
	case kZoned:
		return `"1970-01-01T00:00:00Z"`
	case kArray:
		return "[]"
	case kDecimalString:
		return `"0"`
	}
	return `""`
}

// Debezium's values for ±infinity (pgjdbc's DATE_POSITIVE_INFINITY and DATE_NEGATIVE_INFINITY,
// milliseconds taken as they are).
const (
	posInfinityTimestamp = 9223372036825200000
	negInfinityTimestamp = -9223372036832400000
)

// daysPerMonth is MicroDuration's average month.
const daysPerMonth = 365.25 / 12

// value writes v, a value pgtype decoded for t.oid, as t says.
func (w *Writer) value(t *dbzType, v any) error {
	e := &w.enc
	if v == nil {
		e.raw("null")
		return nil
	}
	switch t.kind {
	case kDecimal, kVarDecimal, kDecimalDouble:
		n, ok := v.(pgtype.Numeric)
		if !ok {
			return fmt.Errorf("format: numeric decoded as %T", v)
		}
		return w.numeric(t, n)
	case kDate:
		switch v := v.(type) {
		case time.Time:
			e.int(int64(math.Floor(float64(v.Unix()) / 86400)))
			return nil
		case pgtype.InfinityModifier:
			// Debezium adds 10957 days (1970 to 2000) to PostgreSQL's infinities, in 32 bits.
			days := int32(math.MaxInt32)
			if v < 0 {
				days = math.MinInt32
			}
			e.int(int64(days + 10957))
			return nil
		}
	case kTimestampMillis, kTimestampMicros:
		div := int64(1)
		if t.kind == kTimestampMillis {
			div = 1000
		}
		switch v := v.(type) {
		case time.Time:
			if div == 1 {
				e.int(v.UnixMicro())
			} else {
				e.int(v.UnixMilli())
			}
			return nil
		case pgtype.InfinityModifier:
			if v < 0 {
				e.int(negInfinityTimestamp / div)
			} else {
				e.int(posInfinityTimestamp / div)
			}
			return nil
		}
	case kZoned:
		switch v := v.(type) {
		case time.Time:
			e.byte('"')
			e.buf = appendZoned(e.buf, v.UTC(), t.width)
			e.byte('"')
			return nil
		case pgtype.InfinityModifier:
			if v < 0 {
				e.raw(`"-infinity"`)
			} else {
				e.raw(`"infinity"`)
			}
			return nil
		}
	case kTimeMillis, kTimeMicros:
		if tm, ok := v.(pgtype.Time); ok {
			if t.kind == kTimeMillis {
				e.int(tm.Microseconds / 1000)
			} else {
				e.int(tm.Microseconds)
			}
			return nil
		}
	case kDuration:
		if iv, ok := v.(pgtype.Interval); ok {
			e.int(microDuration(iv))
			return nil
		}
	case kInterval:
		if iv, ok := v.(pgtype.Interval); ok {
			e.byte('"')
			e.buf = appendISOInterval(e.buf, iv)
			e.byte('"')
			return nil
		}
	case kArray:
		if els, ok := v.([]any); ok {
			e.byte('[')
			for i, el := range els {
				if i > 0 {
					e.byte(',')
				}
				if err := w.value(t.elem, el); err != nil {
					return err
				}
				e.maybeFlush()
			}
			e.byte(']')
			return nil
		}
	}
	return w.dbzGo(t.oid, v)
}

// numeric writes a numeric as t's handling says.
func (w *Writer) numeric(t *dbzType, n pgtype.Numeric) error {
	e := &w.enc
	if t.kind == kDecimalDouble {
		switch {
		case n.NaN:
			e.raw(`"NaN"`)
		case n.InfinityModifier == pgtype.Infinity:
			e.raw(`"Infinity"`)
		case n.InfinityModifier == pgtype.NegativeInfinity:
			e.raw(`"-Infinity"`)
		default:
			f, err := n.Float64Value()
			if err != nil {
				return err
			}
			w.float(f.Float64, 64)
		}
		return nil
	}
	if n.NaN || n.InfinityModifier != pgtype.Finite || n.Int == nil {
		e.raw("null") // Debezium's precise decimals have no NaN nor infinities
		return nil
	}
	unscaled, scale := new(big.Int).Set(n.Int), int(n.Exp)
	// unscaled * 10^scale is the value; bring it to the wanted scale.
	if t.kind == kDecimal {
		unscaled = rescale(unscaled, -scale, t.scale)
		e.byte('"')
		e.buf = base64.StdEncoding.AppendEncode(e.buf, twosComplement(unscaled))
		e.byte('"')
		return nil
	}
	s := -scale
	if s < 0 {
		unscaled, s = rescale(unscaled, s, 0), 0
	}
	ten := big.NewInt(10)
	m := new(big.Int)
	for s > 0 {
		q, r := new(big.Int).QuoRem(unscaled, ten, m)
		if r.Sign() != 0 {
			break
		}
		unscaled, s = q, s-1
	}
	e.raw(`{"scale":`)
	e.int(int64(s))
	e.raw(`,"value":"`)
	e.buf = base64.StdEncoding.AppendEncode(e.buf, twosComplement(unscaled))
	e.raw(`"}`)
	return nil
}

// rescale returns the unscaled value of unscaled (at scale from) at scale to, rounding half to
// even when digits are dropped.
func rescale(unscaled *big.Int, from, to int) *big.Int {
	switch {
	case to > from:
		return new(big.Int).Mul(unscaled, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(to-from)), nil))
	case to < from:
		d := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(from-to)), nil)
		q, r := new(big.Int).QuoRem(unscaled, d, new(big.Int))
		// half to even on |r| against d/2
		r2 := new(big.Int).Abs(r)
		r2.Lsh(r2, 1)
		if c := r2.Cmp(d); c > 0 || c == 0 && q.Bit(0) == 1 {
			if unscaled.Sign() < 0 {
				q.Sub(q, big.NewInt(1))
			} else {
				q.Add(q, big.NewInt(1))
			}
		}
		return q
	}
	return unscaled
}

// twosComplement returns the minimal big-endian two's complement bytes of x, as Java's
// BigInteger.toByteArray: Kafka Connect's Decimal encoding.
func twosComplement(x *big.Int) []byte {
	if x.Sign() >= 0 {
		b := x.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	// -x - 1, complemented, is x in two's complement.
	m := new(big.Int).Neg(x)
	m.Sub(m, big.NewInt(1))
	b := m.Bytes()
	for i := range b {
		b[i] = ^b[i]
	}
	if len(b) == 0 || b[0]&0x80 == 0 {
		b = append([]byte{0xFF}, b...)
	}
	return b
}

// microDuration is io.debezium.time.MicroDuration of an interval: the interval split as
// PostgreSQL prints it (years, months, days, hours, minutes, seconds), then summed in floating
// point with months of 365.25/12 days, and truncated, as Debezium computes it.
func microDuration(iv pgtype.Interval) int64 {
	years, months := iv.Months/12, iv.Months%12
	us := iv.Microseconds
	hours := us / 3_600_000_000
	us -= hours * 3_600_000_000
	minutes := us / 60_000_000
	us -= minutes * 60_000_000
	seconds := float64(us) / 1e6
	days := float64(years*12+months)*daysPerMonth + float64(iv.Days)
	secs := ((days*24+float64(hours))*60+float64(minutes))*60 + seconds
	return int64(secs * 1e6)
}

// appendZoned writes a UTC time as io.debezium.time.ZonedTimestamp: ISO 8601 with exactly width
// fraction digits (the column's precision), or, for width 0, as many as needed.
func appendZoned(b []byte, t time.Time, width int) []byte {
	b = t.AppendFormat(b, "2006-01-02T15:04:05")
	ns := t.Nanosecond()
	switch {
	case width > 0:
		frac := strconv.Itoa(ns + 1e9)[1:] // nine digits
		b = append(b, '.')
		b = append(b, frac[:min(width, 9)]...)
	case ns != 0:
		frac := strings.TrimRight(strconv.Itoa(ns + 1e9)[1:], "0")
		b = append(b, '.')
		b = append(b, frac...)
	}
	return append(b, 'Z')
}
