// Package pgvalue gives the rows of pgoutput changes their schema and Go values: for an Insert,
// Update, Delete or Truncate of a committed transaction it resolves the relation (namespace, name,
// replica identity) and, per column, the name, type OID, type name, whether the column is part of
// the replica identity key, whether its value is an unchanged TOASTed value the server did not
// send, and the value decoded into a Go value with github.com/jackc/pgx/v5/pgtype, from the text
// format or from the binary format (when the slot is read with binary 'true').
//
// # Usage
//
//	dec := pgvalue.NewDecoder(nil)          // or a *pgtype.Map with custom types registered
//	for ch, err := range dec.Changes(txn) { // txn: a *reorderbuffer.Txn
//		fmt.Println(ch)                      // "Insert public.person"
//		for c := range ch.New.Columns() {
//			v, err := c.Value()              // int32, string, time.Time, pgtype.Numeric, []any...
//		}
//	}
//
// [Decoder.Change] resolves one message at a time, for loops that also handle the others
// (logical messages).
//
// # Types
//
// A column's type is resolved, in this order, by its OID in the Map (the built-in types, and
// every type registered there), then through the stream's Type messages ([Schema.Type]): the
// qualified name "namespace.name" is looked up in the Map, and the bare name too when the server
// names a pg_catalog type. PostgreSQL describes a domain by its OID and the name of its base type,
// so a domain over a built-in type decodes as that type without any registration. Values of types
// resolved neither way are returned as pgx returns them for a query: the text as a string,
// binary data as a []byte.
//
// The Map is the one place to plug in custom codecs: register enums, composite types, domains over
// them, or your own [pgtype.Codec] with Map.RegisterType before passing the Map to NewDecoder
// (pgx's Conn.LoadType builds such Types from the database's catalog). An enum in the binary
// format, for example, is a []byte until its type is registered with a pgtype.EnumCodec.
//
// # Buffer ownership
//
// A [Change], its [Row]s and their [Column]s alias the message they came from: Column.Data is a
// slice of the message, valid only as long as the message (for reorderbuffer.Txn.Changes: until
// the next iteration step). Reading them allocates nothing. [Column.Value] and [Column.Scan]
// copy: their results stay valid for good. Change.Relations (truncate) is reused by the next call
// of [Decoder.Change].
//
// A Decoder, like a pgtype.Map, is not safe for concurrent use.
package pgvalue

import (
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgreorder/pgreorder/decoding"
)

// Schema resolves the relations and types a change refers to, as the stream described them at the
// change's position: the Schema of the decoding.Change that reorderbuffer.Txn.Changes yields with
// each message.
type Schema = decoding.Schema

var (
	// ErrUnknownRelation is returned for a change whose relation the stream never described.
	ErrUnknownRelation = errors.New("pgvalue: change for a relation the stream never described")
	// ErrTupleShape is returned for a row with more columns than its relation.
	ErrTupleShape = errors.New("pgvalue: row has more columns than its relation")
	// ErrUnchanged is returned by Column.Value and Column.Scan for an unchanged TOASTed value: the
	// server did not send it (check Column.Unchanged first).
	ErrUnchanged = errors.New("pgvalue: unchanged TOASTed value was not sent")
)

var errNoDecoder = errors.New("the zero Column has no decoder")

// ValueError reports a column value its codec could not decode.
type ValueError struct {
	Column  string
	TypeOID uint32
	Err     error
}

func (e *ValueError) Error() string {
	return fmt.Sprintf("pgvalue: column %q (type %d): %v", e.Column, e.TypeOID, e.Err)
}

func (e *ValueError) Unwrap() error { return e.Err }

// Decoder resolves changes against their schema and decodes values with a pgtype.Map.
type Decoder struct {
	m         *pgtype.Map
	truncated []*decoding.Relation
}

// NewDecoder returns a Decoder that decodes values with m; nil means pgtype.NewMap() (the
// built-in types). Register custom types in m before decoding; m must not be used concurrently
// with the Decoder.
func NewDecoder(m *pgtype.Map) *Decoder {
	if m == nil {
		m = pgtype.NewMap()
	}
	return &Decoder{m: m}
}

// Map returns the Map the Decoder decodes with.
func (d *Decoder) Map() *pgtype.Map { return d.m }

// Change is one row change, or one TRUNCATE, with its schema resolved.
type Change struct {
	// Op is decoding.MsgInsert, MsgUpdate, MsgDelete or MsgTruncate.
	Op decoding.MessageType
	// Relation is the changed table (nil for a truncate).
	Relation *decoding.Relation
	// Old is the old row: the replica identity key, or the whole row with REPLICA IDENTITY FULL,
	// of an Update (when the server sent it) and of a Delete. New is the new row of an Insert or
	// Update. A row the change does not carry is empty: Present reports false.
	Old, New Row
	// Relations are the truncated tables (truncate only), valid until the next Change call.
	Relations []*decoding.Relation
	// Cascade and RestartIdentity are the options of a truncate.
	Cascade, RestartIdentity bool
}

// Change resolves m, a message of a committed transaction, against s (for a decoding.Change c:
// d.Change(c.Schema, c.Msg)). For an Insert, Update,
// Delete or Truncate it returns the change and true; for other messages (Relation, Type, logical
// messages) false and no error. A change for a relation s does not know is ErrUnknownRelation,
// a row wider than its relation ErrTupleShape.
func (d *Decoder) Change(s Schema, m decoding.Message) (Change, bool, error) {
	switch m := m.(type) {
	case *decoding.Insert:
		r, err := resolve(s, m.RelationID, m.New)
		if err != nil {
			return Change{}, false, err
		}
		return Change{Op: decoding.MsgInsert, Relation: r, New: d.row(s, r, m.New)}, true, nil
	case *decoding.Update:
		r, err := resolve(s, m.RelationID, m.New)
		if err == nil && m.OldKind != 0 {
			_, err = resolve(s, m.RelationID, m.Old)
		}
		if err != nil {
			return Change{}, false, err
		}
		ch := Change{Op: decoding.MsgUpdate, Relation: r, New: d.row(s, r, m.New)}
		if m.OldKind != 0 {
			ch.Old = d.row(s, r, m.Old)
		}
		return ch, true, nil
	case *decoding.Delete:
		r, err := resolve(s, m.RelationID, m.Old)
		if err != nil {
			return Change{}, false, err
		}
		return Change{Op: decoding.MsgDelete, Relation: r, Old: d.row(s, r, m.Old)}, true, nil
	case *decoding.Truncate:
		d.truncated = d.truncated[:0]
		for _, id := range m.RelationIDs {
			r, ok := s.Relation(id)
			if !ok {
				return Change{}, false, fmt.Errorf("%w: relation %d", ErrUnknownRelation, id)
			}
			d.truncated = append(d.truncated, r)
		}
		return Change{Op: decoding.MsgTruncate, Relations: d.truncated,
			Cascade:         m.Options&decoding.TruncateCascade != 0,
			RestartIdentity: m.Options&decoding.TruncateRestartIdentity != 0}, true, nil
	}
	return Change{}, false, nil
}

// Source is a committed transaction: its messages, each with the schema in effect at its
// position. *reorderbuffer.Txn implements it, and so do snapshot.Chunk and changefeed.Batch.
type Source interface {
	Changes() iter.Seq2[decoding.Change, error]
}

// Changes yields the changes of x, resolved: its Inserts, Updates, Deletes and Truncates, leaving
// out the other messages. Iteration stops after the first error. What a yielded Change holds is
// valid until the next iteration step.
func (d *Decoder) Changes(x Source) iter.Seq2[Change, error] {
	return func(yield func(Change, error) bool) {
		for c, err := range x.Changes() {
			if err != nil {
				yield(Change{}, err)
				return
			}
			ch, ok, err := d.Change(c.Schema, c.Msg)
			if err != nil {
				yield(Change{}, err)
				return
			}
			if ok && !yield(ch, nil) {
				return
			}
		}
	}
}

// String returns the operation and the qualified table names, as "Insert public.t" or
// "Truncate public.a, public.b".
func (c Change) String() string {
	var b strings.Builder
	b.WriteString(c.Op.String())
	sep := " "
	for _, r := range append([]*decoding.Relation{c.Relation}, c.Relations...) {
		if r == nil {
			continue
		}
		ns := r.Namespace
		if ns == "" {
			ns = "pg_catalog"
		}
		b.WriteString(sep + ns + "." + r.Name)
		sep = ", "
	}
	return b.String()
}

func resolve(s Schema, id uint32, t decoding.Tuple) (*decoding.Relation, error) {
	r, ok := s.Relation(id)
	if !ok {
		return nil, fmt.Errorf("%w: relation %d", ErrUnknownRelation, id)
	}
	if len(t) > len(r.Columns) {
		return nil, fmt.Errorf("%w: %d columns, relation %s.%s has %d", ErrTupleShape, len(t), r.Namespace, r.Name, len(r.Columns))
	}
	return r, nil
}

// Row returns the row t of relation r, resolved against s: for callers that resolve relations
// themselves. t must not have more columns than r.
func (d *Decoder) Row(s Schema, r *decoding.Relation, t decoding.Tuple) (Row, error) {
	if len(t) > len(r.Columns) {
		return Row{}, fmt.Errorf("%w: %d columns, relation %s.%s has %d", ErrTupleShape, len(t), r.Namespace, r.Name, len(r.Columns))
	}
	return d.row(s, r, t), nil
}

func (d *Decoder) row(s Schema, r *decoding.Relation, t decoding.Tuple) Row {
	return Row{rel: r, tuple: t, s: s, d: d}
}

// Row is one row of a change: the columns the server sent, in the relation's order.
type Row struct {
	rel   *decoding.Relation
	tuple decoding.Tuple
	s     Schema
	d     *Decoder
}

// Present reports whether the change carries this row.
func (r Row) Present() bool { return r.rel != nil }

// Len returns the number of columns.
func (r Row) Len() int { return len(r.tuple) }

// Column returns column i, 0 <= i < Len().
func (r Row) Column(i int) Column {
	rc := r.rel.Columns[i]
	c := r.tuple[i]
	return Column{Index: i, Name: rc.Name, TypeOID: rc.TypeOID, TypeMod: rc.TypeMod, Key: rc.IsKey(),
		Kind: c.Kind, Data: c.Data, s: r.s, d: r.d}
}

// Columns yields the columns in order.
func (r Row) Columns() iter.Seq[Column] {
	return func(yield func(Column) bool) {
		for i := range r.tuple {
			if !yield(r.Column(i)) {
				return
			}
		}
	}
}

// Lookup returns the column with the given name.
func (r Row) Lookup(name string) (Column, bool) {
	for i := range r.tuple {
		if r.rel.Columns[i].Name == name {
			return r.Column(i), true
		}
	}
	return Column{}, false
}

// Values decodes every column into a map from column name to value (nil for NULL); unchanged
// TOASTed values are left out. It allocates: use Column.Value to decode one column at a time.
func (r Row) Values() (map[string]any, error) {
	vals := make(map[string]any, len(r.tuple))
	for c := range r.Columns() {
		if c.Unchanged() {
			continue
		}
		v, err := c.Value()
		if err != nil {
			return nil, err
		}
		vals[c.Name] = v
	}
	return vals, nil
}

// Column is one column of a row.
type Column struct {
	Index   int    // position in the relation
	Name    string // column name
	TypeOID uint32 // type OID as the server sent it (a domain's own OID)
	TypeMod int32  // type modifier, -1 if none
	Key     bool   // part of the replica identity key
	// Kind is decoding.ColumnNull, ColumnUnchanged, ColumnText or ColumnBinary.
	Kind byte
	// Data is the value in the text or binary format, nil for NULL and unchanged values. It aliases
	// the message: copy it to keep it.
	Data []byte

	s Schema
	d *Decoder
}

// Null reports whether the value is SQL NULL.
func (c Column) Null() bool { return c.Kind == decoding.ColumnNull }

// Unchanged reports whether the value is an unchanged TOASTed value that the server did not send
// (an Update that did not touch a large column, without REPLICA IDENTITY FULL).
func (c Column) Unchanged() bool { return c.Kind == decoding.ColumnUnchanged }

// Format returns the format of Data: pgtype.BinaryFormatCode for a binary value,
// pgtype.TextFormatCode otherwise.
func (c Column) Format() int16 {
	if c.Kind == decoding.ColumnBinary {
		return pgtype.BinaryFormatCode
	}
	return pgtype.TextFormatCode
}

// Type returns the pgtype.Type that decodes the column (see the package documentation for the
// order of resolution), or false when none does.
func (c Column) Type() (*pgtype.Type, bool) {
	if c.d == nil {
		return nil, false
	}
	return c.d.typeFor(c.s, c.TypeOID)
}

// firstUserOID is FirstNormalObjectId: OIDs below it are PostgreSQL's own.
const firstUserOID = 16384

func (d *Decoder) typeFor(s Schema, oid uint32) (*pgtype.Type, bool) {
	if t, ok := d.m.TypeForOID(oid); ok {
		return t, true
	}
	if s == nil {
		return nil, false
	}
	dt, ok := s.Type(oid)
	if !ok {
		return nil, false
	}
	if dt.Namespace == "" || dt.Namespace == "pg_catalog" {
		// A domain over a built-in type: the server names the base type.
		return d.m.TypeForName(dt.Name)
	}
	if t, ok := d.m.TypeForName(dt.Namespace + "." + dt.Name); ok {
		return t, true
	}
	if t, ok := d.m.TypeForName(dt.Name); ok && t.OID >= firstUserOID {
		return t, true // registered under its bare name, as pgx's LoadType("name") does
	}
	return nil, false
}

// TypeName returns the name of the column's type: the Map's name for a type it knows by OID
// (pg_catalog's typname for built-in types: "int4", "_text", "timestamptz"), else the name the
// stream's Type message gave ("mood"; for a domain, the name of its base type), else "".
func (c Column) TypeName() string {
	name, _ := c.typeName()
	return name
}

// TypeSchema returns the namespace of the column's type: "pg_catalog" for a built-in type, the
// Type message's namespace for others, "" when unknown (a type registered in the Map only).
func (c Column) TypeSchema() string {
	_, ns := c.typeName()
	return ns
}

func (c Column) typeName() (name, namespace string) {
	if c.d == nil {
		return "", ""
	}
	if c.TypeOID < firstUserOID {
		if t, ok := c.d.m.TypeForOID(c.TypeOID); ok {
			return t.Name, "pg_catalog"
		}
	}
	if c.s != nil {
		if dt, ok := c.s.Type(c.TypeOID); ok {
			ns := dt.Namespace
			if ns == "" {
				ns = "pg_catalog"
			}
			return dt.Name, ns
		}
	}
	if t, ok := c.d.m.TypeForOID(c.TypeOID); ok {
		return t.Name, ""
	}
	return "", ""
}

// Value decodes the column into a Go value, as pgx's Rows.Values does for a query: nil for NULL,
// the type's codec's value otherwise (int16, int32, int64, float32, float64, bool, string, []byte,
// time.Time, pgtype.Numeric, pgtype.Interval, [16]uint8 for uuid, map[string]any for json,
// []any for arrays...), a string (text) or []byte (binary) for a type that nothing resolves.
// An unchanged TOASTed value is ErrUnchanged, a value its codec rejects a *ValueError. The result
// does not alias the message.
func (c Column) Value() (any, error) {
	switch c.Kind {
	case decoding.ColumnNull:
		return nil, nil
	case decoding.ColumnUnchanged:
		return nil, ErrUnchanged
	}
	f := c.Format()
	data := c.Data
	if data == nil {
		data = []byte{} // an empty value, not NULL, for the codecs
	}
	if t, ok := c.Type(); ok {
		v, err := t.Codec.DecodeValue(c.d.m, t.OID, f, data)
		if err != nil {
			return nil, &ValueError{Column: c.Name, TypeOID: c.TypeOID, Err: err}
		}
		return v, nil
	}
	if f == pgtype.TextFormatCode {
		return string(data), nil
	}
	return append([]byte{}, data...), nil
}

// Scan decodes the column into dst, a pointer, as pgx's Rows.Scan does (dst may be a *int64,
// *string, *time.Time, *pgtype.Numeric, a type implementing a pgtype scanner interface, ...).
// NULL follows pgx's rules (a pointer to a pointer becomes nil; a *string fails). An unchanged
// TOASTed value is ErrUnchanged.
func (c Column) Scan(dst any) error {
	if c.Kind == decoding.ColumnUnchanged {
		return ErrUnchanged
	}
	if c.d == nil {
		return &ValueError{Column: c.Name, TypeOID: c.TypeOID, Err: errNoDecoder}
	}
	oid := c.TypeOID
	if t, ok := c.Type(); ok {
		oid = t.OID
	}
	var src []byte
	if c.Kind != decoding.ColumnNull {
		src = c.Data
		if src == nil {
			src = []byte{}
		}
	}
	if err := c.d.m.Scan(oid, c.Format(), src, dst); err != nil {
		return &ValueError{Column: c.Name, TypeOID: c.TypeOID, Err: err}
	}
	return nil
}
