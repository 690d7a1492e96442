package decoding

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"
)

var be = binary.BigEndian

// codec reads or writes the fields of one message. Each message type states its wire layout
// once, in its fields method (layout.go), as a sequence of codec calls; the codec's mode says what
// a call does:
//
//   - decoding (Parse, Parser, Decoder.Decode; store set): read the field into the message,
//     checking it;
//   - checking (Decoder.Accept; store not set): read and check the field, but keep nothing that
//     would allocate: strings, byte fields, tuples, lists and times are walked and dropped;
//   - encoding (Append; enc set): write the field from the message, checking that it fits the
//     wire format. The message is only read.
//
// Errors are sticky: after the first failure every call does nothing. Decoding failures are
// *DecodeError values with the offset of the bad field; encoding failures wrap ErrInvalidMessage.
type codec struct {
	b   []byte // decoding: the message; encoding: the output so far
	off int    // decoding: the read position
	t   MessageType
	err error

	enc       bool // encoding
	store     bool // decoding: keep strings, byte fields, tuples, lists and times
	inStream  bool // in-stream changes carry a leading xid
	abortMode AbortInfo

	// bufs are column buffers that decoded tuples use instead of allocating ([newTuple] for
	// new rows, [oldTuple] for old ones). A tuple wider than its buffer gets a new slice, which
	// replaces the buffer.
	bufs [2][]Column

	// route, when set, records where the routing fields are (see measureRoutes).
	route *route
}

// The column buffers of codec.bufs.
const (
	newTuple = 0
	oldTuple = 1
)

// failAt records a decoding failure at byte offset off.
func (c *codec) failAt(off int, err error) {
	if c.err == nil {
		c.err = decodeErr(c.t, off, err)
	}
}

func (c *codec) malformedAt(off int, format string, args ...any) {
	c.failAt(off, fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...))
}

// invalid records an encoding failure: m cannot be written as pgoutput.
func (c *codec) invalid(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidMessage}, args...)...)
	}
}

// need reports whether n more bytes are there to decode, failing with ErrTruncated if not.
func (c *codec) need(n int) bool {
	if c.err != nil {
		return false
	}
	if len(c.b)-c.off < n {
		c.failAt(len(c.b), ErrTruncated)
		return false
	}
	return true
}

// end fails if a decoded message has bytes after its last field, and returns the first failure.
func (c *codec) end() error {
	if c.err == nil && !c.enc && c.off != len(c.b) {
		c.malformedAt(c.off, "%d bytes after the last field", len(c.b)-c.off)
	}
	return c.err
}

func (c *codec) u8(p *uint8) {
	if c.enc {
		c.b = append(c.b, *p)
	} else if c.need(1) {
		*p = c.b[c.off]
		c.off++
	}
}

func (c *codec) u32(p *uint32) {
	if c.enc {
		c.b = be.AppendUint32(c.b, *p)
	} else if c.need(4) {
		*p = be.Uint32(c.b[c.off:])
		c.off += 4
	}
}

func (c *codec) i32(p *int32) {
	if c.enc {
		c.b = be.AppendUint32(c.b, uint32(*p))
	} else if c.need(4) {
		*p = int32(be.Uint32(c.b[c.off:]))
		c.off += 4
	}
}

func (c *codec) lsn(p *LSN) {
	if c.enc {
		c.b = be.AppendUint64(c.b, uint64(*p))
	} else if c.need(8) {
		*p = LSN(be.Uint64(c.b[c.off:]))
		c.off += 8
	}
}

// time is a PostgreSQL timestamp: Int64 µs since 2000-01-01 UTC.
func (c *codec) time(p *time.Time) {
	if c.enc {
		us, ok := pgMicros(*p)
		if !ok {
			c.invalid("time %v out of range", *p)
		}
		c.b = be.AppendUint64(c.b, uint64(us))
	} else if c.need(8) {
		if c.store {
			*p = pgTime(int64(be.Uint64(c.b[c.off:])))
		}
		c.off += 8
	}
}

// flag is a boolean byte, which pgoutput writes as 0 or 1.
func (c *codec) flag(p *bool) {
	if c.enc {
		v := byte(0)
		if *p {
			v = 1
		}
		c.b = append(c.b, v)
	} else if c.need(1) {
		switch v := c.b[c.off]; v {
		case 0, 1:
			*p = v == 1
			c.off++
		default:
			c.malformedAt(c.off, "boolean byte %d", v)
		}
	}
}

// str is a NUL-terminated string. Decoded strings are copies.
func (c *codec) str(p *string) {
	if c.enc {
		if strings.IndexByte(*p, 0) >= 0 {
			c.invalid("string %q contains a NUL byte", *p)
		}
		c.b = append(c.b, *p...)
		c.b = append(c.b, 0)
		return
	}
	if c.err != nil {
		return
	}
	n := bytes.IndexByte(c.b[c.off:], 0)
	if n < 0 {
		c.failAt(len(c.b), ErrTruncated)
		return
	}
	if c.store {
		*p = string(c.b[c.off : c.off+n])
	}
	c.off += n + 1
}

// lengthAt returns the Int32 byte count at b[off:] and whether it is valid: there, not negative,
// and that many bytes follow it (if not, badLength records why).
func lengthAt(b []byte, off int) (int, bool) {
	if len(b)-off < 4 {
		return 0, false
	}
	n := int(int32(be.Uint32(b[off:])))
	return n, uint(n) <= uint(len(b)-off-4) // a negative n is a huge uint
}

func (c *codec) badLength(off int) {
	if len(c.b)-off >= 4 {
		if n := int32(be.Uint32(c.b[off:])); n < 0 {
			c.malformedAt(off, "negative length %d", n)
			return
		}
	}
	c.failAt(len(c.b), ErrTruncated)
}

// data is an Int32 byte count and that many bytes. Decoded bytes alias the message, with their
// capacity clipped.
func (c *codec) data(p *[]byte) {
	if c.enc {
		if len(*p) > math.MaxInt32 {
			c.invalid("%d bytes", len(*p))
		}
		c.b = be.AppendUint32(c.b, uint32(len(*p)))
		c.b = append(c.b, *p...)
		return
	}
	if c.err != nil {
		return
	}
	n, ok := lengthAt(c.b, c.off)
	if !ok {
		c.badLength(c.off)
		return
	}
	start, end := c.off+4, c.off+4+n
	if c.store {
		*p = c.b[start:end:end]
	}
	c.off = end
}

// count is the element count of a list (width 2 or 4 bytes), max the largest count the wire
// format allows. Encoding writes n; decoding returns the count read (0 after a failure).
func (c *codec) count(n, width, max int) int {
	if c.enc {
		if n > max {
			c.invalid("%d elements in a list of at most %d", n, max)
		}
		if width == 2 {
			c.b = be.AppendUint16(c.b, uint16(n))
		} else {
			c.b = be.AppendUint32(c.b, uint32(n))
		}
		return n
	}
	if !c.need(width) {
		return 0
	}
	if width == 2 {
		n = int(be.Uint16(c.b[c.off:]))
	} else {
		n = int(min(be.Uint32(c.b[c.off:]), math.MaxInt32)) // more than any message holds anyway
	}
	c.off += width
	return n
}

// elems returns the elements of the list *p for a fields method to walk, and how many there are;
// n is the count read or written, size the fewest bytes an element takes on the wire. Encoding,
// it returns *p itself. Decoding, it checks that n elements fit in the bytes left (a hostile
// count cannot make us allocate) and returns a new slice, which it stores in *p. Checking, it
// returns one, whose single element stands for every element: walk element i as s[i%len(s)].
// After a failure it returns no elements.
func elems[T any](c *codec, p *[]T, n, size int, one *[1]T) ([]T, int) {
	switch {
	case c.enc:
		return *p, len(*p)
	case c.err != nil:
		return nil, 0
	case n > (len(c.b)-c.off)/size:
		c.failAt(len(c.b), ErrTruncated)
		return nil, 0
	case c.store:
		*p = make([]T, n)
		return *p, n
	}
	return one[:], n
}

// marker is a byte that must be k: the 'N' before a new tuple.
func (c *codec) marker(k byte) {
	if !c.enc && c.err == nil && c.off < len(c.b) && c.b[c.off] == k {
		c.off++
		return
	}
	if c.enc {
		c.b = append(c.b, k)
	} else if c.need(1) {
		c.malformedAt(c.off, "tuple marker %q, want %q", c.b[c.off], k)
	}
}

// oldKind is the marker of an old tuple, 'K' (key columns) or 'O' (the whole old row); it
// reports whether the old tuple follows. If optional (Update), the old tuple may be absent: then
// the next byte is the 'N' of the new tuple, which oldKind leaves for marker, and the kind is 0.
func (c *codec) oldKind(p *byte, optional bool) bool {
	if c.enc {
		switch *p {
		case 'K', 'O':
			c.b = append(c.b, *p)
			return true
		case 0:
			if optional {
				return false
			}
		}
		c.invalid("%v old tuple kind %q", c.t, *p)
		return false
	}
	if !c.need(1) {
		return false
	}
	switch k := c.b[c.off]; {
	case k == 'K' || k == 'O':
		*p = k
		c.off++
		return true
	case k == 'N' && optional:
		*p = 0
		return false
	}
	want := "KO"
	if optional {
		want = "KON"
	}
	c.malformedAt(c.off, "tuple marker %q, want one of %q", c.b[c.off], want)
	return false
}

// noColumns is the decoding of an empty tuple when no column buffer is at hand: empty, not nil.
var noColumns [0]Column

// tuple is a TupleData: an Int16 column count, then per column a kind byte and, for text and
// binary values, an Int32 length and the value. Decoding fills column buffer buf when it is
// wide enough; column data alias the message.
func (c *codec) tuple(p *Tuple, buf int) {
	if c.enc {
		c.writeTuple(*p)
		return
	}
	if !c.need(2) {
		return
	}
	b, off := c.b, c.off
	n := int(be.Uint16(b[off:]))
	off += 2
	if n > len(b)-off { // each column takes at least one byte: a hostile count cannot make us allocate
		c.failAt(len(b), ErrTruncated)
		return
	}
	var cols Tuple
	if c.store {
		switch {
		case n == 0:
			cols = noColumns[:]
		case n <= len(c.bufs[buf]):
			cols = c.bufs[buf][:n:n]
		default:
			cols = make(Tuple, n)
			c.bufs[buf] = cols
		}
	}
	for i := range n {
		if off >= len(b) {
			c.failAt(len(b), ErrTruncated)
			return
		}
		k := b[off]
		off++
		var d []byte
		switch k {
		case ColumnNull, ColumnUnchanged:
		case ColumnText, ColumnBinary:
			l, ok := lengthAt(b, off)
			if !ok {
				c.badLength(off)
				return
			}
			off += 4
			d = b[off : off+l : off+l]
			off += l
		default:
			c.malformedAt(off-1, "column kind %q", k)
			return
		}
		if cols != nil {
			cols[i] = Column{Kind: k, Data: d}
		}
	}
	c.off = off
	if c.store {
		*p = cols
	}
}

func (c *codec) writeTuple(t Tuple) {
	c.count(len(t), 2, math.MaxUint16)
	for i := range t {
		col := &t[i]
		c.b = append(c.b, col.Kind)
		switch col.Kind {
		case ColumnNull, ColumnUnchanged:
			if col.Data != nil {
				c.invalid("column kind %q with data", col.Kind)
			}
		case ColumnText, ColumnBinary:
			c.data(&col.Data)
		default:
			c.invalid("column kind %q", col.Kind)
		}
	}
}

// The routing fields: what ParseHeader reports. Each is also an ordinary field of its message;
// when measuring (c.route set), the codec records where it is.

// routed records that the routing field f, size bytes long, is at the read position.
func (c *codec) routed(f routingField, size int) {
	if r := c.route; r != nil {
		r.at[f], r.need = uint8(c.off), uint8(c.off+size)
	}
}

// xid is a transaction id that the header reports as Header.Xid.
func (c *codec) xid(p *uint32) {
	c.routed(routeXid, 4)
	c.u32(p)
}

// leadingXid is the xid that changes carry inside a stream block, and only there.
func (c *codec) leadingXid(p *uint32) {
	if r := c.route; r != nil {
		r.change = true
	}
	if c.inStream {
		c.xid(p)
	}
}

// subXid is the subtransaction id of Stream Abort (Header.SubXid).
func (c *codec) subXid(p *uint32) {
	c.routed(routeSubXid, 4)
	c.u32(p)
}

// firstSegment is Stream Start's first-segment flag (Header.FirstSegment).
func (c *codec) firstSegment(p *bool) {
	c.routed(routeFirstSegment, 1)
	c.flag(p)
}

// messageFlags are a logical message's flags, whose bit 1 is Header.Transactional.
func (c *codec) messageFlags(p *uint8) {
	c.routed(routeFlags, 1)
	c.u8(p)
}

// relationID is the relation a row change changes or a Relation message describes
// (Header.RelationID).
func (c *codec) relationID(p *uint32) {
	c.routed(routeRelation, 4)
	c.u32(p)
}

// abortInfo says whether a Stream Abort carries abort_lsn and abort_time (Options.AbortInfo):
// decoding, AbortInfoAuto decides from whether bytes are left, and *p records the decision;
// encoding, AbortInfoAuto follows *p.
func (c *codec) abortInfo(p *bool) bool {
	if c.enc {
		return c.abortMode == AbortInfoAlways || c.abortMode == AbortInfoAuto && *p
	}
	switch c.abortMode {
	case AbortInfoAlways:
		*p = true
	case AbortInfoNever:
		*p = false
	default:
		*p = c.err == nil && c.off < len(c.b)
	}
	return *p
}
