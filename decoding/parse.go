package decoding

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"time"
)

// Header is the cheap, allocation-free view of one message.
type Header struct {
	Type MessageType
	// InStream: the message was read as inside a Stream Start/Stop block (in-stream changes carry a
	// leading xid). For ParseHeader it is the caller's inStream; for Decoder.Next it is true for
	// every message after Stream Start up to and including Stream Stop.
	InStream bool
	// Xid: for an in-stream change, the writer's (sub)xid (the top-level xid for a Message); for
	// Begin, Begin Prepare, Prepare, Stream *, Commit/Rollback Prepared, their xid field. Decoder.Next
	// also fills it for messages that have no xid of their own: changes, Origin and Commit inside
	// Begin…Commit get the xid of that Begin (or Begin Prepare), Stream Stop and Origin in a block
	// the block's xid.
	Xid uint32
	// SubXid: Stream Abort only.
	SubXid uint32
	// FirstSegment: Stream Start only.
	FirstSegment bool
	// Transactional: Message only, its flags bit 1. (Addition to docs/CONTRACTS.md: a reorder
	// buffer needs it to route a Message without parsing it.)
	Transactional bool
}

var be = binary.BigEndian

// ParseHeader reads the type and the routing fields of one message. It checks only the bytes it
// reads; use Decoder.Next or Parse to validate the whole message. It never allocates on success.
func ParseHeader(data []byte, inStream bool) (Header, error) {
	if len(data) == 0 {
		return Header{}, decodeErr(0, 0, ErrTruncated)
	}
	t := MessageType(data[0])
	h := Header{Type: t, InStream: inStream}
	need := 1
	switch t {
	case MsgInsert, MsgUpdate, MsgDelete, MsgTruncate, MsgRelation, MsgDataType:
		if inStream {
			need = 5
		}
	case MsgLogicalMessage:
		need = 2
		if inStream {
			need = 6
		}
	case MsgBegin:
		need = 21
	case MsgStreamStart:
		need = 6
	case MsgStreamCommit:
		need = 5
	case MsgStreamAbort:
		need = 9
	case MsgBeginPrepare:
		need = 29
	case MsgPrepare, MsgStreamPrepare, MsgCommitPrepared:
		need = 30
	case MsgRollbackPrepared:
		need = 38
	case MsgCommit, MsgOrigin, MsgStreamStop:
	default:
		return Header{}, decodeErr(t, 0, ErrUnknownMessage)
	}
	if len(data) < need {
		return Header{}, decodeErr(t, len(data), ErrTruncated)
	}
	switch t {
	case MsgInsert, MsgUpdate, MsgDelete, MsgTruncate, MsgRelation, MsgDataType:
		if inStream {
			h.Xid = be.Uint32(data[1:])
		}
	case MsgLogicalMessage:
		if inStream {
			h.Xid = be.Uint32(data[1:])
			h.Transactional = data[5]&1 != 0
		} else {
			h.Transactional = data[1]&1 != 0
		}
	case MsgBegin:
		h.Xid = be.Uint32(data[17:])
	case MsgStreamStart:
		h.Xid = be.Uint32(data[1:])
		h.FirstSegment = data[5] != 0
	case MsgStreamCommit:
		h.Xid = be.Uint32(data[1:])
	case MsgStreamAbort:
		h.Xid = be.Uint32(data[1:])
		h.SubXid = be.Uint32(data[5:])
	case MsgBeginPrepare:
		h.Xid = be.Uint32(data[25:])
	case MsgPrepare, MsgStreamPrepare, MsgCommitPrepared:
		h.Xid = be.Uint32(data[26:])
	case MsgRollbackPrepared:
		h.Xid = be.Uint32(data[34:])
	}
	return h, nil
}

// cursor reads fields with a sticky error: after the first failure every read returns zero.
type cursor struct {
	b   []byte
	off int
	t   MessageType
	err error
}

func (c *cursor) fail(off int, err error) {
	if c.err == nil {
		c.err = decodeErr(c.t, off, err)
	}
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// need reports whether n more bytes are there, failing with ErrTruncated if not.
func (c *cursor) need(n int) bool {
	if c.err != nil {
		return false
	}
	if len(c.b)-c.off < n {
		c.fail(len(c.b), ErrTruncated)
		return false
	}
	return true
}

func (c *cursor) skip(n int) {
	if c.need(n) {
		c.off += n
	}
}

func (c *cursor) u8() byte {
	if !c.need(1) {
		return 0
	}
	v := c.b[c.off]
	c.off++
	return v
}

func (c *cursor) u16() uint16 {
	if !c.need(2) {
		return 0
	}
	v := be.Uint16(c.b[c.off:])
	c.off += 2
	return v
}

func (c *cursor) u32() uint32 {
	if !c.need(4) {
		return 0
	}
	v := be.Uint32(c.b[c.off:])
	c.off += 4
	return v
}

func (c *cursor) u64() uint64 {
	if !c.need(8) {
		return 0
	}
	v := be.Uint64(c.b[c.off:])
	c.off += 8
	return v
}

// flag reads a boolean byte, which pgoutput writes as 0 or 1.
func (c *cursor) flag() bool {
	at := c.off
	v := c.u8()
	if v > 1 {
		c.fail(at, malformed("boolean byte %d", v))
	}
	return v == 1
}

func (c *cursor) lsn() LSN        { return LSN(c.u64()) }
func (c *cursor) time() time.Time { return pgTime(int64(c.u64())) }

// strLen returns the length of the NUL-terminated string at the cursor, or -1.
func (c *cursor) strLen() int {
	if c.err != nil {
		return -1
	}
	n := bytes.IndexByte(c.b[c.off:], 0)
	if n < 0 {
		c.fail(len(c.b), ErrTruncated)
	}
	return n
}

func (c *cursor) str() string {
	n := c.strLen()
	if n < 0 {
		return ""
	}
	s := string(c.b[c.off : c.off+n])
	c.off += n + 1
	return s
}

func (c *cursor) skipStr() {
	if n := c.strLen(); n >= 0 {
		c.off += n + 1
	}
}

// length reads an Int32 byte count and checks that that many bytes follow.
func (c *cursor) length() int {
	at := c.off
	n := int32(c.u32())
	if c.err != nil {
		return 0
	}
	if n < 0 {
		c.fail(at, malformed("negative length %d", n))
		return 0
	}
	if int(n) > len(c.b)-c.off {
		c.fail(len(c.b), ErrTruncated)
		return 0
	}
	return int(n)
}

// bytes returns the next n bytes (already bounds-checked by length), capacity clipped.
func (c *cursor) bytes(n int) []byte {
	if c.err != nil {
		return nil
	}
	v := c.b[c.off : c.off+n : c.off+n]
	c.off += n
	return v
}

// ncols reads a tuple's column count and checks it against the bytes left (a column takes at
// least one byte), so a hostile count cannot make us allocate.
func (c *cursor) ncols() int {
	n := int(c.u16())
	if c.err == nil && n > len(c.b)-c.off {
		c.fail(len(c.b), ErrTruncated)
		return 0
	}
	return n
}

func (c *cursor) tuple() Tuple { return c.tupleInto(nil) }

// tupleInto decodes a tuple into buf if it is big enough, else into a new slice.
func (c *cursor) tupleInto(buf []Column) Tuple {
	n := c.ncols()
	if c.err != nil {
		return nil
	}
	var cols Tuple
	if n <= len(buf) {
		cols = buf[:n:n]
	} else {
		cols = make(Tuple, n)
	}
	b := c.b
	off := c.off
	for i := range cols {
		if off >= len(b) {
			c.fail(len(b), ErrTruncated)
			return nil
		}
		k := b[off]
		off++
		switch k {
		case ColumnNull, ColumnUnchanged:
			cols[i] = Column{Kind: k} // no Data: a reused buffer must not keep an earlier value
		case ColumnText, ColumnBinary:
			if len(b)-off < 4 {
				c.fail(len(b), ErrTruncated)
				return nil
			}
			l := int32(be.Uint32(b[off:]))
			if l < 0 {
				c.fail(off, malformed("negative column length %d", l))
				return nil
			}
			off += 4
			if int(l) > len(b)-off {
				c.fail(len(b), ErrTruncated)
				return nil
			}
			end := off + int(l)
			cols[i] = Column{Kind: k, Data: b[off:end:end]}
			off = end
		default:
			c.fail(off-1, malformed("column kind %q", k))
			return nil
		}
	}
	c.off = off
	return cols
}

func (c *cursor) skipTuple() {
	n := c.ncols()
	if c.err != nil {
		return
	}
	b, off := c.b, c.off
	for range n {
		if off >= len(b) {
			c.fail(len(b), ErrTruncated)
			return
		}
		switch k := b[off]; k {
		case ColumnNull, ColumnUnchanged:
			off++
		case ColumnText, ColumnBinary:
			if len(b)-off < 5 {
				c.fail(len(b), ErrTruncated)
				return
			}
			l := int32(be.Uint32(b[off+1:]))
			if l < 0 {
				c.fail(off+1, malformed("negative length %d", l))
				return
			}
			off += 5
			if int(l) > len(b)-off {
				c.fail(len(b), ErrTruncated)
				return
			}
			off += int(l)
		default:
			c.fail(off, malformed("column kind %q", k))
			return
		}
	}
	c.off = off
}

// marker reads a tuple marker byte and checks it is one of want.
func (c *cursor) marker(want string) byte {
	if c.err == nil && c.off < len(c.b) && c.b[c.off] == want[len(want)-1] { // the common 'N'
		c.off++
		return want[len(want)-1]
	}
	at := c.off
	k := c.u8()
	if c.err == nil && (k == 0 || strings.IndexByte(want, k) < 0) {
		c.fail(at, malformed("tuple marker %q, want one of %q", k, want))
	}
	return k
}

// abortInfo decides whether a Stream Abort at the cursor carries abort_lsn and abort_time.
func (c *cursor) abortInfo(opts Options) bool {
	if c.err != nil {
		return false
	}
	switch opts.AbortInfo {
	case AbortInfoAlways:
		return true
	case AbortInfoNever:
		return false
	}
	return len(c.b) > 9
}

// end fails if bytes are left after the last field.
func (c *cursor) end() error {
	if c.err == nil && c.off != len(c.b) {
		c.fail(c.off, malformed("%d bytes after the last field", len(c.b)-c.off))
	}
	return c.err
}

func start(data []byte, opts Options) (cursor, error) {
	if len(data) == 0 {
		return cursor{}, decodeErr(0, 0, ErrTruncated)
	}
	t := MessageType(data[0])
	if !t.Known() {
		return cursor{}, decodeErr(t, 0, ErrUnknownMessage)
	}
	if !opts.allows(t) {
		return cursor{}, versionErr(t, opts)
	}
	return cursor{b: data, off: 1, t: t}, nil
}

// Parse decodes one message. inStream says whether it was inside a Stream Start/Stop block (then
// changes, Relation, Type and Message carry a leading xid). opts.ProtoVersion rejects message types
// the version does not have; opts.AbortInfo chooses the Stream Abort layout. The message aliases
// data (see the package doc).
func Parse(data []byte, inStream bool, opts Options) (Message, error) {
	c, err := start(data, opts)
	if err != nil {
		return nil, err
	}
	var m Message
	switch c.t {
	case MsgInsert:
		// One allocation for the Insert and the columns of a narrow row.
		a := &insertAlloc{}
		v := &a.m
		if inStream {
			v.Xid = c.u32()
		}
		v.RelationID = c.u32()
		c.marker("N")
		v.New = c.tupleInto(a.cols[:])
		m = v
	case MsgUpdate:
		v := &Update{}
		if inStream {
			v.Xid = c.u32()
		}
		v.RelationID = c.u32()
		if k := c.marker("KON"); k != 'N' {
			v.OldKind = k
			v.Old = c.tuple()
			c.marker("N")
		}
		v.New = c.tuple()
		m = v
	case MsgDelete:
		v := &Delete{}
		if inStream {
			v.Xid = c.u32()
		}
		v.RelationID = c.u32()
		v.OldKind = c.marker("KO")
		v.Old = c.tuple()
		m = v
	case MsgBegin:
		m = &Begin{FinalLSN: c.lsn(), CommitTime: c.time(), Xid: c.u32()}
	case MsgCommit:
		m = &Commit{Flags: c.u8(), CommitLSN: c.lsn(), EndLSN: c.lsn(), CommitTime: c.time()}
	case MsgOrigin:
		m = &Origin{CommitLSN: c.lsn(), Name: c.str()}
	case MsgRelation:
		v := &Relation{}
		if inStream {
			v.Xid = c.u32()
		}
		v.RelationID = c.u32()
		v.Namespace = c.str()
		v.Name = c.str()
		v.ReplicaIdentity = c.u8()
		n := int(c.u16())
		// A column takes at least 10 bytes: flags, an empty name's NUL, type OID, typmod.
		if c.err == nil && n > (len(c.b)-c.off)/10 {
			c.fail(len(c.b), ErrTruncated)
		}
		if c.err == nil {
			v.Columns = make([]RelationColumn, n)
			for i := range v.Columns {
				v.Columns[i] = RelationColumn{Flags: c.u8(), Name: c.str(), TypeOID: c.u32(), TypeMod: int32(c.u32())}
			}
		}
		m = v
	case MsgDataType:
		v := &DataType{}
		if inStream {
			v.Xid = c.u32()
		}
		v.TypeOID = c.u32()
		v.Namespace = c.str()
		v.Name = c.str()
		m = v
	case MsgTruncate:
		v := &Truncate{}
		if inStream {
			v.Xid = c.u32()
		}
		n := c.u32()
		v.Options = c.u8()
		if c.err == nil && uint64(n) > uint64(len(c.b)-c.off)/4 {
			c.fail(len(c.b), ErrTruncated)
		}
		if c.err == nil {
			v.RelationIDs = make([]uint32, n)
			for i := range v.RelationIDs {
				v.RelationIDs[i] = c.u32()
			}
		}
		m = v
	case MsgLogicalMessage:
		v := &LogicalMessage{}
		if inStream {
			v.Xid = c.u32()
		}
		v.Flags = c.u8()
		v.LSN = c.lsn()
		v.Prefix = c.str()
		v.Content = c.bytes(c.length())
		m = v
	case MsgStreamStart:
		m = &StreamStart{Xid: c.u32(), FirstSegment: c.flag()}
	case MsgStreamStop:
		m = &StreamStop{}
	case MsgStreamCommit:
		m = &StreamCommit{Xid: c.u32(), Flags: c.u8(), CommitLSN: c.lsn(), EndLSN: c.lsn(), CommitTime: c.time()}
	case MsgStreamAbort:
		v := &StreamAbort{Xid: c.u32(), SubXid: c.u32()}
		if c.abortInfo(opts) {
			v.HasAbortInfo = true
			v.AbortLSN = c.lsn()
			v.AbortTime = c.time()
		}
		m = v
	case MsgBeginPrepare:
		m = &BeginPrepare{PrepareLSN: c.lsn(), EndLSN: c.lsn(), PrepareTime: c.time(), Xid: c.u32(), GID: c.str()}
	case MsgPrepare:
		m = &Prepare{Flags: c.u8(), PrepareLSN: c.lsn(), EndLSN: c.lsn(), PrepareTime: c.time(), Xid: c.u32(), GID: c.str()}
	case MsgStreamPrepare:
		m = &StreamPrepare{Flags: c.u8(), PrepareLSN: c.lsn(), EndLSN: c.lsn(), PrepareTime: c.time(), Xid: c.u32(), GID: c.str()}
	case MsgCommitPrepared:
		m = &CommitPrepared{Flags: c.u8(), CommitLSN: c.lsn(), EndLSN: c.lsn(), CommitTime: c.time(), Xid: c.u32(), GID: c.str()}
	case MsgRollbackPrepared:
		m = &RollbackPrepared{Flags: c.u8(), PrepareEndLSN: c.lsn(), RollbackEndLSN: c.lsn(),
			PrepareTime: c.time(), RollbackTime: c.time(), Xid: c.u32(), GID: c.str()}
	}
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

// check validates the whole structure of a message without allocating (on success).
func check(data []byte, inStream bool, opts Options) error {
	c, err := start(data, opts)
	if err != nil {
		return err
	}
	if inStream && c.t.IsChange() {
		c.skip(4)
	}
	switch c.t {
	case MsgInsert:
		c.skip(4)
		c.marker("N")
		c.skipTuple()
	case MsgUpdate:
		c.skip(4)
		if c.marker("KON") != 'N' {
			c.skipTuple()
			c.marker("N")
		}
		c.skipTuple()
	case MsgDelete:
		c.skip(4)
		c.marker("KO")
		c.skipTuple()
	case MsgBegin:
		c.skip(20)
	case MsgCommit:
		c.skip(25)
	case MsgOrigin:
		c.skip(8)
		c.skipStr()
	case MsgRelation:
		c.skip(4)
		c.skipStr()
		c.skipStr()
		c.skip(1)
		n := int(c.u16())
		for i := 0; i < n && c.err == nil; i++ {
			c.skip(1)
			c.skipStr()
			c.skip(8)
		}
	case MsgDataType:
		c.skip(4)
		c.skipStr()
		c.skipStr()
	case MsgTruncate:
		n := c.u32()
		c.skip(1)
		if c.err == nil && uint64(n) > uint64(len(c.b)-c.off)/4 {
			c.fail(len(c.b), ErrTruncated)
		}
		c.skip(4 * int(n))
	case MsgLogicalMessage:
		c.skip(9)
		c.skipStr()
		c.skip(c.length())
	case MsgStreamStart:
		c.skip(4)
		c.flag()
	case MsgStreamStop:
	case MsgStreamCommit:
		c.skip(29)
	case MsgStreamAbort:
		c.skip(8)
		if c.abortInfo(opts) {
			c.skip(16)
		}
	case MsgBeginPrepare:
		c.skip(28)
		c.skipStr()
	case MsgPrepare, MsgStreamPrepare, MsgCommitPrepared:
		c.skip(29)
		c.skipStr()
	case MsgRollbackPrepared:
		c.skip(37)
		c.skipStr()
	}
	return c.end()
}

func versionErr(t MessageType, opts Options) error {
	return decodeErr(t, 0, fmt.Errorf("%w: %v needs protocol %d, negotiated %d", ErrVersion, t, minVersion[t], opts.ProtoVersion))
}
