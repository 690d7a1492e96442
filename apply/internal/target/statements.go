package target

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
)

// The statements of the changes: each Insert, Update, Delete and Truncate mapped to its table and
// made into a prepared statement of its shape (or, for inserts, a run; see copyrun.go).

// Change applies one Insert, Update, Delete or Truncate; rels are the relations it names (one,
// or those of a Truncate).
func (t *Conn) Change(ctx context.Context, m decoding.Message, rels []*Relation) error {
	switch m := m.(type) {
	case *decoding.Insert:
		rm, err := t.Mapping(ctx, rels[0], OpInsert)
		if err != nil {
			return err
		}
		if t.coalesce && !t.stepwise {
			if held, err := t.absorb(ctx, rm, 'I', m.New, nil, 0); held || err != nil {
				return err
			}
		}
		return t.Insert(ctx, rm, m.New)
	case *decoding.Update:
		rm, err := t.Mapping(ctx, rels[0], OpUpdate)
		if err != nil {
			return err
		}
		if t.coalesce && !t.stepwise {
			if held, err := t.absorb(ctx, rm, 'U', m.New, m.Old, m.OldKind); held || err != nil {
				return err
			}
		}
		return t.update(ctx, rm, m)
	case *decoding.Delete:
		rm, err := t.Mapping(ctx, rels[0], OpDelete)
		if err != nil {
			return err
		}
		if t.coalesce && !t.stepwise {
			if held, err := t.absorb(ctx, rm, 'D', nil, m.Old, m.OldKind); held || err != nil {
				return err
			}
		}
		return t.delete(ctx, rm, m)
	case *decoding.Truncate:
		return t.truncate(ctx, m, rels)
	}
	return nil
}

func (t *Conn) Mapping(ctx context.Context, ri *Relation, op Op) (*Table, error) {
	m, err := ri.mapping(ctx, t.pg, t.replicaRole, t.opts.Binary)
	if err != nil && t.opts.CreateTable != nil {
		m, err = t.mapWithTable(ctx, ri, m, err) // create.go
	}
	if err != nil && t.opts.AddColumn != nil {
		m, err = t.mapWithColumns(ctx, ri, m, err) // schema.go
	}
	if err != nil {
		var ce *ChangeError
		if errors.As(err, &ce) {
			c := *ce
			c.Op = op
			return nil, &c
		}
		return nil, err
	}
	return m, nil
}

// appendParam appends a column's value and format.
func appendParam(params [][]byte, formats []int16, c decoding.Column) ([][]byte, []int16) {
	switch c.Kind {
	case decoding.ColumnNull:
		return append(params, nil), append(formats, 0)
	case decoding.ColumnBinary:
		return append(params, nonNil(c.Data)), append(formats, 1)
	default:
		return append(params, nonNil(c.Data)), append(formats, 0)
	}
}

// nonNil keeps an empty value from being sent as NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (t *Conn) insertStmt(m *Table) *stmt {
	return t.prepared(m, "I", func() (string, []uint32) {
		var b []byte
		b = append(b, "INSERT INTO "+m.Name+" "+m.insertCols+" VALUES ("...)
		oids := make([]uint32, len(m.cols))
		for i, c := range m.cols {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, '$')
			b = strconv.AppendInt(b, int64(i+1), 10)
			oids[i] = c.typeOID
		}
		return string(append(b, ')')), oids
	})
}

// where appends the row-identifying condition of an UPDATE or DELETE to the statement's shape
// and parameters: the replica identity key, or with REPLICA IDENTITY FULL every column of the
// old row, which picks one of identical rows (the caller wraps it in a ctid subquery).
//
// A FULL identity's condition does not depend on which values are NULL (see whereSQL), so that
// a relation has one statement per shape of its SET list, not one per pattern of NULLs.
func (t *Conn) where(m *Table, key decoding.Tuple, full bool, params [][]byte, formats []int16) ([][]byte, []int16, error) {
	if full {
		if len(key) != len(m.cols) {
			return nil, nil, fmt.Errorf("the old row has %d columns, the relation %d", len(key), len(m.cols))
		}
		for i, c := range key {
			if c.Kind == decoding.ColumnUnchanged {
				return nil, nil, fmt.Errorf("column %s of the old row was not sent (unchanged TOASTed value): "+
					"the row cannot be identified", m.cols[i].name)
			}
			t.shape = append(t.shape, 1)
			params, formats = appendParam(params, formats, c)
		}
		return params, formats, nil
	}
	for _, i := range m.Key {
		if i >= len(key) {
			return nil, nil, fmt.Errorf("the row has no value for key column %s", m.cols[i].name)
		}
		switch c := key[i]; c.Kind {
		case decoding.ColumnNull:
			t.shape = append(t.shape, 2)
		case decoding.ColumnUnchanged:
			return nil, nil, fmt.Errorf("key column %s was not sent (unchanged TOASTed value)", m.cols[i].name)
		default:
			t.shape = append(t.shape, 1)
			params, formats = appendParam(params, formats, c)
		}
	}
	return params, formats, nil
}

// whereSQL writes the condition whose shape where recorded (from shape[0]) using parameters
// from $n on, and returns the parameter OIDs.
//
// A FULL identity compares every column with "(c = $n OR (c IS NULL AND $n IS NULL))": NULL
// matches NULL, as in PostgreSQL's subscriber, in one statement whatever the NULLs, and the
// planner can still use an index of any column (a BitmapOr of "c = $n" and "c IS NULL", in
// generic plans too; IS NOT DISTINCT FROM would scan the table). A column whose type has no
// default equality operator (json, xml, point, box, ...) compares its text output, with the
// parameter of the column's type (so text and binary values alike) cast to text. A column that is
// NOT NULL on the target is compared with "=" alone: no row of it can match a NULL, and the
// condition stays one the planner gives the same plan for whatever the values, so that the
// prepared statement's generic plan is a plain index scan (with the OR, each execution was
// planned again: the custom plan, with the parameter's IS NULL folded away, costs less).
func whereSQL(b []byte, m *Table, shape []byte, full bool, n int, oids []uint32) ([]byte, []uint32) {
	first := true
	cond := func(i int, s byte) {
		if !first {
			b = append(b, " AND "...)
		}
		first = false
		c := m.cols[i]
		p := "$" + strconv.Itoa(n)
		switch {
		case s == 2:
			b = append(b, c.name+" IS NULL"...)
			return
		case full && c.textEq && c.notNull:
			b = append(b, c.name+"::text = "+p+"::text"...)
		case full && c.textEq:
			b = append(b, "("+c.name+"::text = "+p+"::text OR ("+c.name+" IS NULL AND "+p+" IS NULL))"...)
		case full && c.notNull:
			b = append(b, c.name+" = "+p...)
		case full:
			b = append(b, "("+c.name+" = "+p+" OR ("+c.name+" IS NULL AND "+p+" IS NULL))"...)
		default:
			b = append(b, c.name+" = "+p...)
		}
		n++
		oids = append(oids, c.typeOID)
	}
	if full {
		for i, s := range shape {
			if s != 0 {
				cond(i, s)
			}
		}
	} else {
		for j, i := range m.Key {
			cond(i, shape[j])
		}
	}
	if first {
		b = append(b, "true"...) // a relation without columns
	}
	return b, oids
}

// rowTarget wraps a FULL identity condition so that it names one row: the first that matches,
// as PostgreSQL's subscriber does with identical rows.
func rowTarget(m *Table, cond []byte) []byte {
	id := "ctid" // a TID scan
	if m.Partitioned {
		id = "(tableoid, ctid)" // ctid alone repeats across partitions
	}
	b := []byte("WHERE " + id + " = (SELECT " + strings.Trim(id, "()") + " FROM " + m.Name + " WHERE ")
	b = append(b, cond...)
	return append(b, " LIMIT 1)"...)
}

func (t *Conn) update(ctx context.Context, m *Table, u *decoding.Update) error {
	key, full := u.New, m.Full
	switch {
	case m.fullSource && u.OldKind != 'O':
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpUpdate, Relation: m.Name,
			Err: errors.New("REPLICA IDENTITY FULL without the old row")}
	case full:
		key = u.Old
	case m.idErr != nil:
		return t.identityError(m, OpUpdate)
	case u.OldKind == 'K' || u.OldKind == 'O':
		key = u.Old
	}
	if len(u.New) != len(m.cols) {
		return &ChangeError{Op: OpUpdate, Relation: m.Name, Err: fmt.Errorf("row has %d columns, the relation %d", len(u.New), len(m.cols))}
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	t.shape = append(t.shape[:0], 'U')
	params, formats := t.params[:0], t.formats[:0]
	sets := 0
	// The key's columns are not written when they keep their values: no old key was sent, or
	// (a FULL table found by the target's key) the old row holds the same values; a GENERATED
	// ALWAYS key column can take no UPDATE. Unless nothing else would be written: the statement
	// must still find (or miss) its row, as the source's update did.
	keyKept := m.fullSource && !m.Full && len(u.Old) == len(u.New)
	keySame := func(i int, c decoding.Column) bool {
		if u.OldKind == 0 {
			return m.info.Rel.Columns[i].IsKey()
		}
		return keyKept && slices.Contains(m.Key, i) && u.Old[i].Kind == c.Kind && bytes.Equal(u.Old[i].Data, c.Data)
	}
	others := !allKeySame(u.New, keySame)
	for i, c := range u.New {
		// A TOASTed value not sent is left as it is.
		if c.Kind == decoding.ColumnUnchanged || (others && keySame(i, c)) {
			t.shape = append(t.shape, 0)
			continue
		}
		t.shape = append(t.shape, 1)
		params, formats = appendParam(params, formats, c)
		sets++
	}
	if sets == 0 {
		return nil // nothing sent but unchanged values
	}
	whereAt := len(t.shape)
	params, formats, err := t.where(m, key, full, params, formats)
	if err != nil {
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpUpdate, Relation: m.Name, Err: err}
	}
	t.params, t.formats = params, formats
	shape := t.shape
	st := t.prepared(m, string(shape), func() (string, []uint32) {
		b := []byte("UPDATE " + m.Name + " SET ")
		var oids []uint32
		n := 1
		for i, s := range shape[1:whereAt] {
			if s == 0 {
				continue
			}
			if n > 1 {
				b = append(b, ", "...)
			}
			b = append(b, m.cols[i].name+" = $"...)
			b = strconv.AppendInt(b, int64(n), 10)
			n++
			oids = append(oids, m.cols[i].typeOID)
		}
		b = append(b, ' ')
		cond, oids := whereSQL(nil, m, shape[whereAt:], full, n, oids)
		if full {
			b = append(b, rowTarget(m, cond)...)
		} else {
			b = append(b, "WHERE "...)
			b = append(b, cond...)
		}
		return string(b), oids
	})
	if !t.det.On() {
		t.queue(st, params, formats, batchOp{op: 'U', rel: m})
		return t.maybeFlush(ctx)
	}
	return t.queueUpdate(ctx, m, st, u, whereAt, full, params, formats, sets)
}

// allKeySame reports whether every value of row sent (not an unchanged TOASTed one) is a key
// value that keeps its value (keySame).
func allKeySame(row decoding.Tuple, keySame func(int, decoding.Column) bool) bool {
	for i, c := range row {
		if c.Kind != decoding.ColumnUnchanged && !keySame(i, c) {
			return false
		}
	}
	return true
}

func (t *Conn) identityError(m *Table, op Op) error {
	var ce *ChangeError
	if errors.As(m.idErr, &ce) {
		c := *ce
		c.Op = op
		return &c
	}
	return m.idErr
}

func (t *Conn) delete(ctx context.Context, m *Table, d *decoding.Delete) error {
	full := m.Full
	switch {
	case m.fullSource && d.OldKind != 'O':
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpDelete, Relation: m.Name,
			Err: errors.New("REPLICA IDENTITY FULL without the old row")}
	case !full && m.idErr != nil:
		return t.identityError(m, OpDelete)
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	t.shape = append(t.shape[:0], 'D')
	params, formats, err := t.where(m, d.Old, full, t.params[:0], t.formats[:0])
	if err != nil {
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpDelete, Relation: m.Name, Err: err}
	}
	t.params, t.formats = params, formats
	shape := t.shape
	st := t.prepared(m, string(shape), func() (string, []uint32) {
		b := []byte("DELETE FROM " + m.Name + " ")
		cond, oids := whereSQL(nil, m, shape[1:], full, 1, nil)
		if full {
			b = append(b, rowTarget(m, cond)...)
		} else {
			b = append(b, "WHERE "...)
			b = append(b, cond...)
		}
		return string(b), oids
	})
	t.queue(st, params, formats, batchOp{op: 'D', rel: m})
	return t.maybeFlush(ctx)
}

// truncate truncates the relations a TRUNCATE named, without CASCADE whatever the source used
// (as PostgreSQL's subscriber does: the target may hold tables the source does not publish).
func (t *Conn) truncate(ctx context.Context, m *decoding.Truncate, rels []*Relation) error {
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	b := []byte("TRUNCATE ")
	var names []byte
	for i, ri := range rels {
		rm, err := t.Mapping(ctx, ri, OpTruncate)
		if err != nil {
			return err
		}
		if err := t.unholdTables(ctx, []*Table{rm}); err != nil {
			return err
		}
		if i > 0 {
			b = append(b, ", "...)
			names = append(names, ", "...)
		}
		if !rm.Partitioned {
			b = append(b, "ONLY "...) // partitions of a partitioned table go with it
		}
		b = append(b, rm.Name...)
		names = append(names, rm.Name...)
	}
	if err := t.FlushInserts(ctx); err != nil { // inserts held before, sent again
		return err
	}
	if m.Options&decoding.TruncateRestartIdentity != 0 {
		b = append(b, " RESTART IDENTITY"...)
	}
	t.newBatch()
	t.batch.ExecParams(string(b), nil, nil, nil, nil)
	t.ops = append(t.ops, batchOp{op: 'T', name: string(names)})
	t.bytes += len(b)
	return t.maybeFlush(ctx)
}
