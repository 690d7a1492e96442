// Package jsonl renders committed transactions as JSON lines: the output format of
// `pgreorder replay` and `pgreorder stream`, which tools and tests parse. The format is a contract:
//
//	{"xid":N,"commit_lsn":"X/X","end_lsn":"X/X","commit_time":T,"changes":[…]}
//
// plus "gid":"…" (before "changes") for a two-phase transaction. LSNs are printed as PostgreSQL
// prints them, T is RFC 3339 with microseconds and a zone. Changes, in order:
//
//	{"op":"insert","relation":"schema.table","new":{COLUMN:VALUE,…}}
//	{"op":"update","relation":…,"old":{…},"new":{…}}      "old" only when the server sent a key or old tuple
//	{"op":"delete","relation":…,"old":{…}}
//	{"op":"truncate","relations":["schema.table",…],"cascade":B,"restart_identity":B}
//	{"op":"message","transactional":true,"prefix":"…","content":"base64"}
//
// VALUE is the text value as a JSON string, null for SQL NULL, {"unchanged_toast":true} for an
// unchanged TOASTed value, {"binary":"base64"} for a binary-format value. A non-transactional
// logical message is printed in its place as
//
//	{"op":"message","transactional":false,"lsn":"X/X","prefix":"…","content":"base64"}
//
// Relation and Type messages are not printed: they name the tables and columns of the changes.
// A transaction is written change by change, so its size does not matter.
package jsonl

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TimeFormat is the layout of commit_time.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// ErrUnknownRelation is returned for a change whose relation was never described by the stream.
var ErrUnknownRelation = errors.New("jsonl: change for a relation the stream never described")

// Writer writes transactions to an io.Writer, one JSON object per line.
type Writer struct {
	w   io.Writer
	buf []byte
	// Changes counts the changes written (Relation and Type messages excluded).
	Changes int64
}

// NewWriter returns a Writer to w. Wrap w in a bufio.Writer for speed; Writer writes each
// change as one Write call.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteTxn reads x's changes and writes x as one line.
func (w *Writer) WriteTxn(x *reorderbuffer.Txn) error {
	if x.NonTransactional {
		for m, err := range x.Changes() {
			if err != nil {
				return err
			}
			lm, ok := m.(*decoding.LogicalMessage)
			if !ok {
				return fmt.Errorf("jsonl: non-transactional record is a %v", m.Type())
			}
			b := append(w.buf[:0], `{"op":"message","transactional":false,"lsn":`...)
			b = appendString(b, lm.LSN.String())
			b = appendMessageBody(b, lm)
			b = append(b, "}\n"...)
			w.buf = b
			if _, err := w.w.Write(b); err != nil {
				return err
			}
		}
		return nil
	}
	b := fmt.Appendf(w.buf[:0], `{"xid":%d,"commit_lsn":"%s","end_lsn":"%s","commit_time":`, x.Xid, x.CommitLSN, x.EndLSN)
	b = appendString(b, x.CommitTime.UTC().Format(TimeFormat))
	if x.GID != "" {
		b = append(b, `,"gid":`...)
		b = appendString(b, x.GID)
	}
	b = append(b, `,"changes":[`...)
	first := true
	for m, err := range x.Changes() {
		if err != nil {
			return err
		}
		start := len(b)
		if !first {
			b = append(b, ',')
		}
		b, err = appendChange(b, m, x.Relation)
		if err != nil {
			return err
		}
		if len(b) == start+boolInt(!first) { // nothing written (schema message)
			b = b[:start]
			continue
		}
		first = false
		w.Changes++
		if len(b) >= 32<<10 {
			if _, err := w.w.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	b = append(b, "]}\n"...)
	w.buf = b[:0]
	_, err := w.w.Write(b)
	return err
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

type lookup func(id uint32) (*decoding.Relation, bool)

// appendChange appends the JSON of one change; schema messages append nothing.
func appendChange(b []byte, m decoding.Message, rel lookup) ([]byte, error) {
	var err error
	switch m := m.(type) {
	case *decoding.Relation, *decoding.DataType:
		return b, nil
	case *decoding.Insert:
		r, ok := rel(m.RelationID)
		if !ok {
			return b, fmt.Errorf("%w: relation %d", ErrUnknownRelation, m.RelationID)
		}
		b = append(b, `{"op":"insert","relation":`...)
		b = appendString(b, qualified(r))
		b = append(b, `,"new":`...)
		if b, err = appendTuple(b, r, m.New); err != nil {
			return b, err
		}
		return append(b, '}'), nil
	case *decoding.Update:
		r, ok := rel(m.RelationID)
		if !ok {
			return b, fmt.Errorf("%w: relation %d", ErrUnknownRelation, m.RelationID)
		}
		b = append(b, `{"op":"update","relation":`...)
		b = appendString(b, qualified(r))
		if m.OldKind != 0 {
			b = append(b, `,"old":`...)
			if b, err = appendTuple(b, r, m.Old); err != nil {
				return b, err
			}
		}
		b = append(b, `,"new":`...)
		if b, err = appendTuple(b, r, m.New); err != nil {
			return b, err
		}
		return append(b, '}'), nil
	case *decoding.Delete:
		r, ok := rel(m.RelationID)
		if !ok {
			return b, fmt.Errorf("%w: relation %d", ErrUnknownRelation, m.RelationID)
		}
		b = append(b, `{"op":"delete","relation":`...)
		b = appendString(b, qualified(r))
		b = append(b, `,"old":`...)
		if b, err = appendTuple(b, r, m.Old); err != nil {
			return b, err
		}
		return append(b, '}'), nil
	case *decoding.Truncate:
		b = append(b, `{"op":"truncate","relations":[`...)
		for i, id := range m.RelationIDs {
			r, ok := rel(id)
			if !ok {
				return b, fmt.Errorf("%w: relation %d", ErrUnknownRelation, id)
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, qualified(r))
		}
		b = fmt.Appendf(b, `],"cascade":%t,"restart_identity":%t}`,
			m.Options&decoding.TruncateCascade != 0, m.Options&decoding.TruncateRestartIdentity != 0)
		return b, nil
	case *decoding.LogicalMessage:
		b = append(b, `{"op":"message","transactional":true`...)
		b = appendMessageBody(b, m)
		return append(b, '}'), nil
	default:
		return b, fmt.Errorf("jsonl: unexpected %v message inside a transaction", m.Type())
	}
}

func appendMessageBody(b []byte, m *decoding.LogicalMessage) []byte {
	b = append(b, `,"prefix":`...)
	b = appendString(b, m.Prefix)
	b = append(b, `,"content":"`...)
	b = base64.StdEncoding.AppendEncode(b, m.Content)
	return append(b, '"')
}

func qualified(r *decoding.Relation) string {
	ns := r.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	return ns + "." + r.Name
}

func appendTuple(b []byte, r *decoding.Relation, t decoding.Tuple) ([]byte, error) {
	if len(t) > len(r.Columns) {
		return b, fmt.Errorf("jsonl: tuple has %d columns, relation %s has %d", len(t), qualified(r), len(r.Columns))
	}
	b = append(b, '{')
	for i, c := range t {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, r.Columns[i].Name)
		b = append(b, ':')
		switch c.Kind {
		case decoding.ColumnNull:
			b = append(b, "null"...)
		case decoding.ColumnUnchanged:
			b = append(b, `{"unchanged_toast":true}`...)
		case decoding.ColumnBinary:
			b = append(b, `{"binary":"`...)
			b = base64.StdEncoding.AppendEncode(b, c.Data)
			b = append(b, `"}`...)
		default:
			b = appendString(b, string(c.Data))
		}
	}
	return append(b, '}'), nil
}

// appendString appends s as a JSON string. Unlike encoding/json it leaves <, > and & alone (the
// output is not HTML); invalid UTF-8 becomes U+FFFD, as there.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029': // as encoding/json: JSONP-safe
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// FormatTime formats a commit time as the format prints it.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }
