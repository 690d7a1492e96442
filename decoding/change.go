package decoding

// Schema resolves relation ids and type OIDs to the stream's Relation and Type messages, as
// described at one position of the stream.
type Schema interface {
	Relation(id uint32) (*Relation, bool)
	Type(oid uint32) (*DataType, bool)
}

// Change is one message of a transaction together with the schema in effect at its position in
// the stream: what a consumer needs to interpret it, whatever it reads next.
type Change struct {
	// Msg is the message: an Insert, Update, Delete, Truncate, a transactional logical message, or
	// a Relation or Type message (schema, before the changes that need it).
	Msg Message
	// Relation is the relation an Insert, Update or Delete changes, as described at the change's
	// position, and a Relation message itself; nil for other messages and for a relation the
	// stream never described. Relation messages are never modified: it may be kept for good.
	Relation *Relation
	// Schema resolves the relations (a Truncate's) and the data types (columns whose types are
	// not built in) as described at the change's position. Like Msg, it is valid only until the
	// iteration that yielded the change moves on; the descriptions it returns may be kept.
	Schema Schema
	// Raw is the pgoutput message Msg was parsed from, when the producer keeps one (the reorder
	// buffer does; nil otherwise): parsing Raw with InStream gives Msg again. Like Msg, it belongs to
	// the producer and is valid only until the iteration moves on; copy it to keep it.
	Raw []byte
	// InStream says whether Raw is in the in-stream form (the writer's xid after the type byte).
	InStream bool
}

// RelationOf returns the relation an Insert, Update or Delete changes, or m itself if it is a
// Relation, as s describes it; nil otherwise.
func RelationOf(s Schema, m Message) *Relation {
	switch m := m.(type) {
	case *Relation:
		return m
	case RowChange:
		r, _ := s.Relation(m.RelationOID())
		return r
	}
	return nil
}
