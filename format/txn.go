package format

import (
	"fmt"
	"iter"
	"unicode/utf8"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TimeFormat is the layout of commit_time in the txn format.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// txn writes x in the txn format and returns the number of changes written.
func (w *Writer) txn(x *reorderbuffer.Txn) (int64, error) {
	e := &w.enc
	var n int64
	if x.NonTransactional {
		for c, err := range x.Changes() {
			if err != nil {
				return n, err
			}
			lm, ok := c.Msg.(*decoding.LogicalMessage)
			if !ok {
				return n, fmt.Errorf("format: non-transactional record is a %v", c.Msg.Type())
			}
			e.raw(`{"op":"message","transactional":false,"lsn":"`)
			e.raw(lm.LSN.String())
			e.byte('"')
			w.messageBody(lm)
			e.raw("}\n")
			n++
		}
		return n, nil
	}
	e.raw(`{"xid":`)
	e.uint(uint64(x.Xid))
	e.raw(`,"commit_lsn":"`)
	e.raw(x.CommitLSN.String())
	e.raw(`","end_lsn":"`)
	e.raw(x.EndLSN.String())
	e.raw(`","commit_time":"`)
	e.buf = x.CommitTime.UTC().AppendFormat(e.buf, TimeFormat)
	e.byte('"')
	if x.GID != "" {
		e.raw(`,"gid":`)
		e.name(x.GID)
	}
	e.raw(`,"changes":`)
	return w.changeList(x.Changes(), false)
}

// rows writes the inserts of a copied chunk as one line in the txn format and returns their
// number.
func (w *Writer) rows(src pgvalue.Source, lsn decoding.LSN) (int64, error) {
	e := &w.enc
	e.raw(`{"snapshot_lsn":"`)
	e.raw(lsn.String())
	e.raw(`","changes":`)
	return w.changeList(src.Changes(), true)
}

// changeList writes the changes of seq as a JSON array closing the line, and returns their
// number; with inserts, anything but an insert is an error (a copied chunk's).
func (w *Writer) changeList(seq iter.Seq2[decoding.Change, error], inserts bool) (int64, error) {
	e := &w.enc
	e.byte('[')
	var n int64
	for c, err := range seq {
		if err != nil {
			return n, err
		}
		switch c.Msg.(type) {
		case *decoding.Relation, *decoding.DataType:
			continue // they name the tables and columns of the changes
		case *decoding.Insert:
		default:
			if inserts {
				return n, fmt.Errorf("format: a copied chunk holds a %v message", c.Msg.Type())
			}
		}
		if n > 0 {
			e.byte(',')
		}
		if err := w.txnChange(c); err != nil {
			return n, err
		}
		n++
		e.maybeFlush()
	}
	e.raw("]}\n")
	return n, nil
}

// relation checks a change's relation r (nil if the stream never described id) and that its
// columns make a valid JSON object.
func (w *Writer) relation(r *decoding.Relation, id uint32, t ...decoding.Tuple) (*decoding.Relation, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: relation %d", ErrUnknownRelation, id)
	}
	for _, t := range t {
		if len(t) > len(r.Columns) {
			return nil, fmt.Errorf("%w: %d columns, relation %s.%s has %d", pgvalue.ErrTupleShape, len(t), r.Namespace, r.Name, len(r.Columns))
		}
	}
	return r, w.checkColumns(r)
}

func (w *Writer) txnChange(c decoding.Change) error {
	e := &w.enc
	switch m := c.Msg.(type) {
	case *decoding.Insert:
		r, err := w.relation(c.Relation, m.RelationID, m.New)
		if err != nil {
			return err
		}
		e.raw(`{"op":"insert",`)
		w.txnRelation(r)
		e.raw(`,"new":`)
		w.txnTuple(r, m.New)
	case *decoding.Update:
		r, err := w.relation(c.Relation, m.RelationID, m.Old, m.New)
		if err != nil {
			return err
		}
		e.raw(`{"op":"update",`)
		w.txnRelation(r)
		if m.OldKind != 0 {
			e.raw(`,"old":`)
			w.txnTuple(r, m.Old)
		}
		e.raw(`,"new":`)
		w.txnTuple(r, m.New)
	case *decoding.Delete:
		r, err := w.relation(c.Relation, m.RelationID, m.Old)
		if err != nil {
			return err
		}
		e.raw(`{"op":"delete",`)
		w.txnRelation(r)
		e.raw(`,"old":`)
		w.txnTuple(r, m.Old)
	case *decoding.Truncate:
		rels := make([]*decoding.Relation, len(m.RelationIDs))
		for i, id := range m.RelationIDs {
			r, ok := c.Schema.Relation(id)
			if !ok {
				return fmt.Errorf("%w: relation %d", ErrUnknownRelation, id)
			}
			rels[i] = r
		}
		e.raw(`{"op":"truncate","relations":[`)
		for i, r := range rels {
			if i > 0 {
				e.byte(',')
			}
			w.qualified(r)
		}
		e.raw(`],"tables":[`)
		for i, r := range rels {
			if i > 0 {
				e.byte(',')
			}
			e.raw(`{"schema":`)
			e.name(namespace(r))
			e.raw(`,"table":`)
			e.name(r.Name)
			e.byte('}')
		}
		e.raw(`],"cascade":`)
		e.bool(m.Options&decoding.TruncateCascade != 0)
		e.raw(`,"restart_identity":`)
		e.bool(m.Options&decoding.TruncateRestartIdentity != 0)
	case *decoding.LogicalMessage:
		e.raw(`{"op":"message","transactional":true`)
		w.messageBody(m)
	default:
		return fmt.Errorf("format: unexpected %v message inside a transaction", m.Type())
	}
	e.byte('}')
	return nil
}

func namespace(r *decoding.Relation) string {
	if r.Namespace == "" {
		return "pg_catalog"
	}
	return r.Namespace
}

// qualified writes "schema.table", each part escaped as a name.
func (w *Writer) qualified(r *decoding.Relation) {
	e := &w.enc
	e.byte('"')
	e.nameBody(namespace(r))
	e.byte('.')
	e.nameBody(r.Name)
	e.byte('"')
}

func (w *Writer) txnRelation(r *decoding.Relation) {
	e := &w.enc
	e.raw(`"relation":`)
	w.qualified(r)
	e.raw(`,"schema":`)
	e.name(namespace(r))
	e.raw(`,"table":`)
	e.name(r.Name)
}

func (w *Writer) messageBody(m *decoding.LogicalMessage) {
	e := &w.enc
	e.raw(`,"prefix":`)
	e.name(m.Prefix)
	e.raw(`,"content":`)
	e.base64(m.Content)
}

func (w *Writer) txnTuple(r *decoding.Relation, t decoding.Tuple) {
	e := &w.enc
	e.byte('{')
	for i, c := range t {
		if i > 0 {
			e.byte(',')
		}
		e.name(r.Columns[i].Name)
		e.byte(':')
		switch c.Kind {
		case decoding.ColumnNull:
			e.raw("null")
		case decoding.ColumnUnchanged:
			e.raw(`{"unchanged_toast":true}`)
		case decoding.ColumnBinary:
			e.raw(`{"binary":`)
			e.base64(c.Data)
			e.byte('}')
		default:
			if utf8.Valid(c.Data) {
				e.bytes(c.Data, invalidReplace)
			} else {
				e.raw(`{"escaped":`)
				e.bytes(c.Data, invalidEscape)
				e.byte('}')
			}
		}
		e.maybeFlush()
	}
	e.byte('}')
}
