package decoding

import (
	"math"
	"time"
)

// This file is the one description of pgoutput's wire format: each message type's fields
// method lists its fields in wire order as calls on a codec (codec.go), after the type byte; the
// comment above it names the PostgreSQL function (proto.c) that writes the message. ParseHeader
// (through measureRoutes), Parse, Parser, Decoder.Accept and Append all run these methods; a change
// to the format is made here only.

// logicalrep_write_begin
func (m *Begin) fields(c *codec) {
	c.lsn(&m.FinalLSN)
	c.time(&m.CommitTime)
	c.xid(&m.Xid)
}

// logicalrep_write_commit
func (m *Commit) fields(c *codec) {
	c.u8(&m.Flags)
	c.lsn(&m.CommitLSN)
	c.lsn(&m.EndLSN)
	c.time(&m.CommitTime)
}

// logicalrep_write_origin
func (m *Origin) fields(c *codec) {
	c.lsn(&m.CommitLSN)
	c.str(&m.Name)
}

// logicalrep_write_rel
func (m *Relation) fields(c *codec) {
	c.leadingXid(&m.Xid)
	c.relationID(&m.RelationID)
	c.str(&m.Namespace)
	c.str(&m.Name)
	c.u8(&m.ReplicaIdentity)
	var one [1]RelationColumn
	// A column takes at least 10 bytes: flags, an empty name's NUL, type OID, typmod.
	cols, n := elems(c, &m.Columns, c.count(len(m.Columns), 2, math.MaxUint16), 10, &one)
	for i := range n {
		col := &cols[i%len(cols)]
		c.u8(&col.Flags)
		c.str(&col.Name)
		c.u32(&col.TypeOID)
		c.i32(&col.TypeMod)
	}
}

// logicalrep_write_typ
func (m *DataType) fields(c *codec) {
	c.leadingXid(&m.Xid)
	c.u32(&m.TypeOID)
	c.str(&m.Namespace)
	c.str(&m.Name)
}

// logicalrep_write_insert
func (m *Insert) fields(c *codec) {
	c.leadingXid(&m.Xid)
	c.relationID(&m.RelationID)
	c.marker('N')
	c.tuple(&m.New, newTuple)
}

// logicalrep_write_update
func (m *Update) fields(c *codec) {
	c.leadingXid(&m.Xid)
	c.relationID(&m.RelationID)
	if c.oldKind(&m.OldKind, true) {
		c.tuple(&m.Old, oldTuple)
	}
	c.marker('N')
	c.tuple(&m.New, newTuple)
}

// logicalrep_write_delete
func (m *Delete) fields(c *codec) {
	c.leadingXid(&m.Xid)
	c.relationID(&m.RelationID)
	if c.oldKind(&m.OldKind, false) {
		c.tuple(&m.Old, oldTuple)
	}
}

// logicalrep_write_truncate
func (m *Truncate) fields(c *codec) {
	c.leadingXid(&m.Xid)
	n := c.count(len(m.RelationIDs), 4, math.MaxInt32)
	c.u8(&m.Options)
	var one [1]uint32
	ids, n := elems(c, &m.RelationIDs, n, 4, &one)
	for i := range n {
		c.u32(&ids[i%len(ids)])
	}
}

// logicalrep_write_message
func (m *LogicalMessage) fields(c *codec) {
	c.leadingXid(&m.Xid)
	c.messageFlags(&m.Flags)
	c.lsn(&m.LSN)
	c.str(&m.Prefix)
	c.data(&m.Content)
}

// logicalrep_write_stream_start
func (m *StreamStart) fields(c *codec) {
	c.xid(&m.Xid)
	c.firstSegment(&m.FirstSegment)
}

// logicalrep_write_stream_stop
func (m *StreamStop) fields(c *codec) {}

// logicalrep_write_stream_commit
func (m *StreamCommit) fields(c *codec) {
	c.xid(&m.Xid)
	c.u8(&m.Flags)
	c.lsn(&m.CommitLSN)
	c.lsn(&m.EndLSN)
	c.time(&m.CommitTime)
}

// logicalrep_write_stream_abort
func (m *StreamAbort) fields(c *codec) {
	c.xid(&m.Xid)
	c.subXid(&m.SubXid)
	if c.abortInfo(&m.HasAbortInfo) {
		c.lsn(&m.AbortLSN)
		c.time(&m.AbortTime)
	}
}

// logicalrep_write_begin_prepare
func (m *BeginPrepare) fields(c *codec) {
	c.lsn(&m.PrepareLSN)
	c.lsn(&m.EndLSN)
	c.time(&m.PrepareTime)
	c.xid(&m.Xid)
	c.str(&m.GID)
}

// twoPhaseEnd is the layout shared by Prepare, Stream Prepare and Commit Prepared.
func (c *codec) twoPhaseEnd(flags *uint8, lsn, end *LSN, t *time.Time, xid *uint32, gid *string) {
	c.u8(flags)
	c.lsn(lsn)
	c.lsn(end)
	c.time(t)
	c.xid(xid)
	c.str(gid)
}

// logicalrep_write_prepare
func (m *Prepare) fields(c *codec) {
	c.twoPhaseEnd(&m.Flags, &m.PrepareLSN, &m.EndLSN, &m.PrepareTime, &m.Xid, &m.GID)
}

// logicalrep_write_stream_prepare
func (m *StreamPrepare) fields(c *codec) {
	c.twoPhaseEnd(&m.Flags, &m.PrepareLSN, &m.EndLSN, &m.PrepareTime, &m.Xid, &m.GID)
}

// logicalrep_write_commit_prepared
func (m *CommitPrepared) fields(c *codec) {
	c.twoPhaseEnd(&m.Flags, &m.CommitLSN, &m.EndLSN, &m.CommitTime, &m.Xid, &m.GID)
}

// logicalrep_write_rollback_prepared
func (m *RollbackPrepared) fields(c *codec) {
	c.u8(&m.Flags)
	c.lsn(&m.PrepareEndLSN)
	c.lsn(&m.RollbackEndLSN)
	c.time(&m.PrepareTime)
	c.time(&m.RollbackTime)
	c.xid(&m.Xid)
	c.str(&m.GID)
}

// walk runs m's fields method on c; it reports false if m is not one of this package's message
// types. (A type switch, not an interface method, so that c does not escape to the heap.)
func walk(c *codec, m Message) bool {
	switch v := m.(type) {
	case *Begin:
		v.fields(c)
	case *Commit:
		v.fields(c)
	case *Origin:
		v.fields(c)
	case *Relation:
		v.fields(c)
	case *DataType:
		v.fields(c)
	case *Insert:
		v.fields(c)
	case *Update:
		v.fields(c)
	case *Delete:
		v.fields(c)
	case *Truncate:
		v.fields(c)
	case *LogicalMessage:
		v.fields(c)
	case *StreamStart:
		v.fields(c)
	case *StreamStop:
		v.fields(c)
	case *StreamCommit:
		v.fields(c)
	case *StreamAbort:
		v.fields(c)
	case *BeginPrepare:
		v.fields(c)
	case *Prepare:
		v.fields(c)
	case *StreamPrepare:
		v.fields(c)
	case *CommitPrepared:
		v.fields(c)
	case *RollbackPrepared:
		v.fields(c)
	default:
		return false
	}
	return true
}

// messages holds one message of each type, for decoding without allocating.
type messages struct {
	begin     Begin
	commit    Commit
	origin    Origin
	relation  Relation
	dataType  DataType
	insert    Insert
	update    Update
	delete    Delete
	truncate  Truncate
	message   LogicalMessage
	start     StreamStart
	stop      StreamStop
	scommit   StreamCommit
	abort     StreamAbort
	bprepare  BeginPrepare
	prepare   Prepare
	sprepare  StreamPrepare
	cprepared CommitPrepared
	rprepared RollbackPrepared
}

// get returns the message of type t, zeroed (nil for an unknown type).
func (s *messages) get(t MessageType) Message {
	switch t {
	case MsgBegin:
		return zero(&s.begin)
	case MsgCommit:
		return zero(&s.commit)
	case MsgOrigin:
		return zero(&s.origin)
	case MsgRelation:
		return zero(&s.relation)
	case MsgDataType:
		return zero(&s.dataType)
	case MsgInsert:
		return zero(&s.insert)
	case MsgUpdate:
		return zero(&s.update)
	case MsgDelete:
		return zero(&s.delete)
	case MsgTruncate:
		return zero(&s.truncate)
	case MsgLogicalMessage:
		return zero(&s.message)
	case MsgStreamStart:
		return zero(&s.start)
	case MsgStreamStop:
		return zero(&s.stop)
	case MsgStreamCommit:
		return zero(&s.scommit)
	case MsgStreamAbort:
		return zero(&s.abort)
	case MsgBeginPrepare:
		return zero(&s.bprepare)
	case MsgPrepare:
		return zero(&s.prepare)
	case MsgStreamPrepare:
		return zero(&s.sprepare)
	case MsgCommitPrepared:
		return zero(&s.cprepared)
	case MsgRollbackPrepared:
		return zero(&s.rprepared)
	}
	return nil
}

func zero[T any](p *T) *T {
	var z T
	*p = z
	return p
}

// The routing fields, in route.at.
type routingField int

const (
	routeXid routingField = iota
	routeSubXid
	routeFirstSegment
	routeFlags
	routeRelation
	routingFields
)

// route says where ParseHeader finds the routing fields of one message type: their byte offsets
// (0: the type has no such field; offset 0 is the type byte) and the bytes they need.
type route struct {
	need   uint8 // 0: not a message type
	at     [routingFields]uint8
	change bool // the type carries a leading xid inside stream blocks
	_      [1]byte
}

// routes is indexed by inStream (0 or 1) and the type byte.
var routes = measureRoutes()

// measureRoutes finds the routing fields by walking each message type's layout over zero bytes,
// in and out of streams: the routing methods of the codec record their offsets. It relies on
// every routing field coming before the first variable-length field, which pgoutput's formats
// satisfy; the tests compare ParseHeader with Parse on every message of the captures.
func measureRoutes() (r [2][256]route) {
	var s messages
	for t := range len(r[0]) {
		if minVersion(MessageType(t)) == 0 {
			continue
		}
		for i := range r {
			rt := &r[i][t]
			rt.need = 1
			data := make([]byte, 64)
			data[0] = byte(t)
			c := codec{b: data, off: 1, t: MessageType(t), inStream: i == 1, route: rt}
			walk(&c, s.get(MessageType(t)))
		}
	}
	return r
}
