package format

import (
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// Column defaults in Connect schemas, as Debezium's PostgreSQL connector reads them: from the
// default expression's text, never evaluated. A literal ('x'::text, 7, '2020-01-01'::date,
// 'ok'::mood) is the default; a function call or CURRENT_TIMESTAMP and its kin stand for a value
// of the type (0, "", false, 1970-01-01, {}); NULL::type and anything else are no default. Only
// the types below (and enums) have defaults; a numeric without a declared scale has none (a
// struct cannot be a Connect default).

var (
	// functionDefault matches an expression that starts with a function call: nextval(...),
	// (now())::text, gen_random_uuid().
	functionDefault = regexp.MustCompile(`^\(?[A-Za-z0-9_.]+\((?:.+(?:, ?.+)*)?\)`)
	// literalDefault is the first single-quoted part of an expression (a '' inside ends it, as
	// in Debezium).
	literalDefault = regexp.MustCompile(`'(.*?)'`)
)

// currentDateTimes are the SQL value functions a default may be, which stand for a value.
var currentDateTimes = map[string]bool{"current_timestamp": true, "current_time": true, "current_date": true,
	"localtime": true, "localtimestamp": true}

// defaultPlaceholders is, for each type with a default mapping, the text that a computed
// default stands for.
var defaultPlaceholders = map[string]string{
	"bool": "false", "bpchar": "", "varchar": "", "text": "", "numeric": "0.0", "float4": "0.0", "float8": "0.0",
	"int2": "0", "int4": "0", "int8": "0", "json": "{}", "jsonb": "{}", "xml": "",
	"uuid": "00000000-0000-0000-0000-000000000000", "date": "1970-01-01", "time": "00:00",
	"timestamp": "1970-01-01", "timestamptz": "1970-01-01", "interval": "epoch",
}

// trimmedDefaults are the types whose default expressions are trimmed first.
var trimmedDefaults = map[string]bool{"bool": true, "numeric": true, "float4": true, "float8": true, "int2": true,
	"int4": true, "int8": true, "uuid": true, "date": true, "time": true, "timestamp": true, "timestamptz": true,
	"interval": true}

// defaultLiteral returns the text of column c's default value, and false when it has none.
func defaultLiteral(c TableColumn) (string, bool) {
	expr := c.Default
	if expr == "" {
		return "", false
	}
	if c.EnumLabels != nil {
		// 'label'::type: the label, when the cast names the column's type.
		i := strings.LastIndex(expr, "::")
		if i < 0 {
			return "", false
		}
		v, cast := expr[:i], strings.Trim(expr[i+2:], `"`)
		if j := strings.LastIndexByte(cast, '.'); j >= 0 {
			cast = strings.Trim(cast[j+1:], `"`)
		}
		if cast != c.TypeName || len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' {
			return "", false
		}
		return v[1 : len(v)-1], true
	}
	placeholder, ok := defaultPlaceholders[c.TypeName]
	if !ok {
		return "", false
	}
	if trimmedDefaults[c.TypeName] {
		expr = strings.TrimSpace(expr)
	}
	if functionDefault.MatchString(expr) || currentDateTimes[strings.ToLower(expr)] {
		return placeholder, true
	}
	if !strings.Contains(expr, "'") {
		if strings.HasPrefix(expr, "NULL::") {
			return "", false
		}
		return expr, true
	}
	m := literalDefault.FindStringSubmatch(expr)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// defaultJSON returns the JSON of column c's default for Connect schemas, as a value of type t,
// or nil for none (no default, one that does not parse as the type, or a struct).
func (w *Writer) defaultJSON(t *dbzType, c TableColumn) []byte {
	lit, ok := defaultLiteral(c)
	if !ok || t.kind == kVarDecimal || t.kind == kArray {
		return nil
	}
	var v any
	switch t.kind {
	case kBool:
		v = strings.EqualFold(lit, "true")
	case kString, kJSON, kXML, kEnum, kUUID, kUnknown:
		b, _ := w.into(nil, func() error { w.enc.str(lit, invalidReplace); return nil })
		return b
	default:
		// The placeholders of the date and time types, as PostgreSQL's text for them.
		switch {
		case lit == "epoch":
			return nil
		case t.kind == kTimestampMicros || t.kind == kTimestampMillis || t.kind == kZoned:
			if len(lit) == len("1970-01-01") {
				lit += " 00:00:00"
			}
			if t.kind == kZoned && !strings.ContainsAny(lit[10:], "+-Z") {
				lit += "+00"
			}
		case t.kind == kTimeMillis || t.kind == kTimeMicros:
			if len(lit) == len("00:00") {
				lit += ":00"
			}
		}
		pt, ok := w.vals.Map().TypeForOID(t.oid)
		if !ok {
			return nil
		}
		var err error
		v, err = pt.Codec.DecodeValue(w.vals.Map(), t.oid, pgtype.TextFormatCode, []byte(lit))
		if err != nil || v == nil {
			return nil
		}
	}
	b, err := w.into(nil, func() error { return w.value(t, v) })
	if err != nil || string(b) == "null" {
		return nil
	}
	return b
}
