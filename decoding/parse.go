package decoding

import "fmt"

// Header is the cheap, allocation-free view of one message.
type Header struct {
	Type MessageType
	// InStream: the message was read as inside a Stream Start/Stop block (in-stream changes carry a
	// leading xid). For ParseHeader it is the caller's inStream; for Decoder.Accept it is true for
	// every message after Stream Start up to and including Stream Stop.
	InStream bool
	// Xid: for an in-stream change, the writer's (sub)xid (the top-level xid for a Message); for
	// Begin, Begin Prepare, Prepare, Stream *, Commit/Rollback Prepared, their xid field. Decoder.Accept
	// also fills it for messages that have no xid of their own: changes, Origin and Commit inside
	// Begin…Commit get the xid of that Begin (or Begin Prepare), Stream Stop and Origin in a block
	// the block's xid.
	Xid uint32
	// SubXid: Stream Abort only.
	SubXid uint32
	// FirstSegment: Stream Start only.
	FirstSegment bool
	// Transactional: Message only, its flags bit 1 (a reorder buffer routes a Message on it
	// without parsing the message).
	Transactional bool
	// RelationID: Insert, Update and Delete, the relation they change; Relation, the relation it
	// describes. A consumer that needs only which relation a row change names reads it here
	// without parsing the tuples.
	RelationID uint32
}

// ParseHeader reads the type and the routing fields of one message. It checks only the bytes it
// reads; use Decoder.Accept or Parse to validate the whole message. It never allocates on success.
func ParseHeader(data []byte, inStream bool) (h Header, err error) {
	if len(data) == 0 {
		return Header{}, decodeErr(0, 0, ErrTruncated)
	}
	t := MessageType(data[0])
	if t == MsgInsert || t == MsgUpdate || t == MsgDelete {
		// The bulk of a stream, its routing fields at fixed places: the writer's xid in a stream
		// block, then the relation.
		if !inStream && len(data) >= 5 {
			return Header{Type: t, RelationID: be.Uint32(data[1:])}, nil
		}
		if inStream && len(data) >= 9 {
			return Header{Type: t, InStream: true, Xid: be.Uint32(data[1:]), RelationID: be.Uint32(data[5:])}, nil
		}
	}
	r := &routes[0][t]
	if inStream {
		r = &routes[1][t]
	}
	if r.need == 0 {
		return Header{}, decodeErr(t, 0, ErrUnknownMessage)
	}
	if len(data) < int(r.need) {
		return Header{}, decodeErr(t, len(data), ErrTruncated)
	}
	h.Type, h.InStream = t, inStream
	if at := r.at[routeXid]; at != 0 {
		h.Xid = be.Uint32(data[at:])
	}
	if at := r.at[routeSubXid]; at != 0 {
		h.SubXid = be.Uint32(data[at:])
	}
	if at := r.at[routeFirstSegment]; at != 0 {
		h.FirstSegment = data[at] != 0
	}
	if at := r.at[routeFlags]; at != 0 {
		h.Transactional = data[at]&1 != 0
	}
	if at := r.at[routeRelation]; at != 0 {
		h.RelationID = be.Uint32(data[at:])
	}
	return h, nil
}

// start prepares c, a zero codec, to decode data, after checking its type byte.
func (c *codec) start(data []byte, inStream bool, opts Options) error {
	if len(data) == 0 {
		return decodeErr(0, 0, ErrTruncated)
	}
	t := MessageType(data[0])
	if !t.Known() {
		return decodeErr(t, 0, ErrUnknownMessage)
	}
	if !opts.allows(t) {
		return versionErr(t, opts)
	}
	c.b, c.off, c.t, c.inStream, c.abortMode = data, 1, t, inStream, opts.AbortInfo
	return nil
}

// Parse decodes one message. inStream says whether it was inside a Stream Start/Stop block (then
// changes, Relation, Type and Message carry a leading xid). opts.ProtoVersion rejects message types
// the version does not have; opts.AbortInfo chooses the Stream Abort layout. The message aliases
// data (see the package doc).
func Parse(data []byte, inStream bool, opts Options) (Message, error) {
	var c codec
	if err := c.start(data, inStream, opts); err != nil {
		return nil, err
	}
	c.store = true
	var m Message
	if c.t == MsgInsert {
		// One allocation for the Insert and the columns of a narrow row.
		a := new(insertAlloc)
		c.bufs[newTuple] = a.cols[:]
		m = &a.m
	} else {
		m = kinds[c.t].new()
	}
	walk(&c, m)
	if err := c.end(); err != nil {
		return nil, err
	}
	return m, nil
}

// insertAlloc holds an Insert and the columns of a narrow row in one allocation.
type insertAlloc struct {
	m    Insert
	cols [4]Column
}

func versionErr(t MessageType, opts Options) error {
	return decodeErr(t, 0, fmt.Errorf("%w: %v needs protocol %d, negotiated %d", ErrVersion, t, minVersion(t), opts.ProtoVersion))
}
