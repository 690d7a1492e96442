package reorderbuffer

import (
	"slices"

	"github.com/pgreorder/pgreorder/decoding"
)

// schema is a set of relation and data type descriptions: the stream's Relation and Type messages
// in effect at some position. The buffer keeps one current schema, which a transaction's
// descriptions change when the transaction commits (or, if it is prepared, at its PREPARE): in
// stream order, whatever the consumer reads when. Every transaction handed out resolves against
// the schema current just before its own descriptions took effect, plus the descriptions it
// carries itself, read in order.
//
// A schema that a queued or handed-out transaction resolves against (shared > 0) is never
// changed: the buffer copies it first. A schema nobody shares is changed in place, which is the
// common case when the consumer keeps up.
type schema struct {
	parent *schema // consulted for what this one does not describe; nil for the current schema
	rels   map[uint32]*decoding.Relation
	types  map[uint32]*decoding.DataType
	shared int
}

func (s *schema) relation(id uint32) (*decoding.Relation, bool) {
	for ; s != nil; s = s.parent {
		if r, ok := s.rels[id]; ok {
			return r, true
		}
	}
	return nil, false
}

func (s *schema) dataType(oid uint32) (*decoding.DataType, bool) {
	for ; s != nil; s = s.parent {
		if t, ok := s.types[oid]; ok {
			return t, true
		}
	}
	return nil, false
}

// set records a Relation or DataType message; other messages are ignored. The messages are
// never modified afterwards (they come from decoding.Parse, not from a reusing Parser).
func (s *schema) set(m decoding.Message) {
	switch v := m.(type) {
	case *decoding.Relation:
		if s.rels == nil {
			s.rels = make(map[uint32]*decoding.Relation)
		}
		s.rels[v.RelationID] = v
	case *decoding.DataType:
		if s.types == nil {
			s.types = make(map[uint32]*decoding.DataType)
		}
		s.types[v.TypeOID] = v
	}
}

// describes reports whether s already holds a description equal to m (Relation or DataType).
func (s *schema) describes(m decoding.Message) bool {
	switch v := m.(type) {
	case *decoding.Relation:
		r, ok := s.relation(v.RelationID)
		return ok && r.Namespace == v.Namespace && r.Name == v.Name &&
			r.ReplicaIdentity == v.ReplicaIdentity && slices.Equal(r.Columns, v.Columns)
	case *decoding.DataType:
		t, ok := s.dataType(v.TypeOID)
		return ok && t.Namespace == v.Namespace && t.Name == v.Name
	}
	return true
}

// lookup returns the description s holds for what m describes (a Relation or DataType), or m.
func (s *schema) lookup(m decoding.Message) decoding.Message {
	switch v := m.(type) {
	case *decoding.Relation:
		if r, ok := s.relation(v.RelationID); ok {
			return r
		}
	case *decoding.DataType:
		if t, ok := s.dataType(v.TypeOID); ok {
			return t
		}
	}
	return m
}

// clone returns an unshared copy of s (flattened: parents included).
func (s *schema) clone() *schema {
	c := &schema{}
	var chain []*schema
	for p := s; p != nil; p = p.parent {
		chain = append(chain, p)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		for _, r := range chain[i].rels {
			c.set(r)
		}
		for _, t := range chain[i].types {
			c.set(t)
		}
	}
	return c
}

// schemaEntry is one Relation or Type message a transaction carries, with where it sits among
// the transaction's records, so that a subtransaction abort can cut it away and its commit can
// apply it without reading the records back.
type schemaEntry struct {
	msg     decoding.Message // *decoding.Relation or *decoding.DataType
	pos     int64            // memlog position, or spill log offset when spilled
	spilled bool
}

// view is what a handed-out transaction resolves names against: the schema in effect before
// it, and the descriptions read so far from its own records.
type view struct {
	base   *schema // the schema before the transaction's own descriptions
	shared *schema // the current-schema snapshot base is (or is layered on), shared until release
	local  *schema // descriptions read from the transaction itself; nil until the first

	// The relation rowRelation found last, and its id: row changes come in runs on one relation.
	lastRel *decoding.Relation
	lastID  uint32
}

// rowRelation is relation(id) for a row change, remembering the answer until the next
// description read (read) or the next reading from the start (reset).
func (v *view) rowRelation(id uint32) *decoding.Relation {
	if v.lastRel != nil && v.lastID == id {
		return v.lastRel
	}
	r, _ := v.relation(id)
	v.lastRel, v.lastID = r, id
	return r
}

// reset forgets what was read of the transaction, to read it from the start.
func (v *view) reset() { v.local, v.lastRel = nil, nil }

func (v *view) relation(id uint32) (*decoding.Relation, bool) {
	if r, ok := v.local.relation(id); ok {
		return r, true
	}
	return v.base.relation(id)
}

func (v *view) dataType(oid uint32) (*decoding.DataType, bool) {
	if t, ok := v.local.dataType(oid); ok {
		return t, true
	}
	return v.base.dataType(oid)
}

// Relation and Type make a view a decoding.Schema, for the changes Txn.Changes yields.
func (v *view) Relation(id uint32) (*decoding.Relation, bool) { return v.relation(id) }
func (v *view) Type(oid uint32) (*decoding.DataType, bool)    { return v.dataType(oid) }

// read records a message read from the transaction: Relation and Type messages take effect for
// what follows them.
func (v *view) read(m decoding.Message) {
	switch m.(type) {
	case *decoding.Relation, *decoding.DataType:
		if v.local == nil {
			v.local = &schema{}
		}
		v.local.set(m)
		v.lastRel = nil
	}
}
