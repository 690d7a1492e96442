package decoding

import (
	"strconv"
	"time"
)

// MessageType is the first byte of a pgoutput message.
type MessageType byte

// The pgoutput message types.
const (
	MsgBegin            MessageType = 'B'
	MsgCommit           MessageType = 'C'
	MsgOrigin           MessageType = 'O'
	MsgRelation         MessageType = 'R'
	MsgDataType         MessageType = 'Y'
	MsgInsert           MessageType = 'I'
	MsgUpdate           MessageType = 'U'
	MsgDelete           MessageType = 'D'
	MsgTruncate         MessageType = 'T'
	MsgLogicalMessage   MessageType = 'M'
	MsgStreamStart      MessageType = 'S'
	MsgStreamStop       MessageType = 'E'
	MsgStreamCommit     MessageType = 'c'
	MsgStreamAbort      MessageType = 'A'
	MsgBeginPrepare     MessageType = 'b'
	MsgPrepare          MessageType = 'P'
	MsgCommitPrepared   MessageType = 'K'
	MsgRollbackPrepared MessageType = 'r'
	MsgStreamPrepare    MessageType = 'p'
)

// kinds describes each message type: the protocol documentation's name, the first protocol
// version that has it and how Parse allocates one (a zero kind: not a message type). The layout
// of each type is its fields method (layout.go).
var kinds = [256]struct {
	name       string
	minVersion uint8
	new        func() Message
}{
	MsgBegin:            {"Begin", 1, newOf[Begin]},
	MsgCommit:           {"Commit", 1, newOf[Commit]},
	MsgOrigin:           {"Origin", 1, newOf[Origin]},
	MsgRelation:         {"Relation", 1, newOf[Relation]},
	MsgDataType:         {"Type", 1, newOf[DataType]},
	MsgInsert:           {"Insert", 1, newOf[Insert]},
	MsgUpdate:           {"Update", 1, newOf[Update]},
	MsgDelete:           {"Delete", 1, newOf[Delete]},
	MsgTruncate:         {"Truncate", 1, newOf[Truncate]},
	MsgLogicalMessage:   {"Message", 1, newOf[LogicalMessage]},
	MsgStreamStart:      {"Stream Start", 2, newOf[StreamStart]},
	MsgStreamStop:       {"Stream Stop", 2, newOf[StreamStop]},
	MsgStreamCommit:     {"Stream Commit", 2, newOf[StreamCommit]},
	MsgStreamAbort:      {"Stream Abort", 2, newOf[StreamAbort]},
	MsgBeginPrepare:     {"Begin Prepare", 3, newOf[BeginPrepare]},
	MsgPrepare:          {"Prepare", 3, newOf[Prepare]},
	MsgCommitPrepared:   {"Commit Prepared", 3, newOf[CommitPrepared]},
	MsgRollbackPrepared: {"Rollback Prepared", 3, newOf[RollbackPrepared]},
	MsgStreamPrepare:    {"Stream Prepare", 3, newOf[StreamPrepare]},
}

func newOf[T any, P interface {
	*T
	Message
}]() Message {
	return P(new(T))
}

// minVersion is the first protocol version that has messages of type t (0: not a message type).
func minVersion(t MessageType) int { return int(kinds[t].minVersion) }

// String returns the protocol documentation's name of t, or a quoted byte for unknown types.
func (t MessageType) String() string {
	if n := kinds[t].name; n != "" {
		return n
	}
	return "unknown type " + strconv.QuoteRune(rune(t))
}

// Known reports whether t is a pgoutput message type of protocol 1 to 4.
func (t MessageType) Known() bool { return minVersion(t) != 0 }

// IsChange reports whether messages of type t carry a leading xid inside a stream block:
// Insert, Update, Delete, Truncate, Relation, Type and Message.
func (t MessageType) IsChange() bool { return routes[1][t].change }

// AbortInfo says whether Stream Abort messages carry abort_lsn and abort_time (protocol 4 with
// streaming = parallel).
type AbortInfo uint8

const (
	AbortInfoAuto   AbortInfo = iota // decide from the message length (the zero value)
	AbortInfoNever                   // require the 9-byte layout (streaming = on)
	AbortInfoAlways                  // require the 25-byte layout (streaming = parallel)
)

// Options describe what was negotiated with the server. The zero value accepts every message of
// protocols 1 to 4 and detects the Stream Abort layout.
type Options struct {
	// ProtoVersion is the negotiated proto_version, 1 to 4; messages the version does not have are
	// rejected with ErrVersion (except Stream Abort, see the package doc). 0 (or a version above 4)
	// accepts all.
	ProtoVersion int
	AbortInfo    AbortInfo
}

func (o Options) allows(t MessageType) bool {
	return o.ProtoVersion <= 0 || t == MsgStreamAbort || minVersion(t) <= o.ProtoVersion
}

// Message is one decoded pgoutput message: one of the pointer types of this package. A decoded
// message may alias its input (see the package doc's Buffer ownership); each type has a Clone
// method, and CloneMessage copies any of them.
type Message interface {
	Type() MessageType
}

// Column is one column of a tuple.
type Column struct {
	// Kind is 'n' (NULL), 'u' (unchanged TOASTed value, not sent), 't' (text) or 'b' (binary).
	Kind byte
	// Data is the value for 't' and 'b', nil otherwise. Decoded, it aliases the input: it is
	// valid only until the input buffer is reused (see the package doc's Buffer ownership).
	Data []byte
}

// Column kinds.
const (
	ColumnNull      byte = 'n'
	ColumnUnchanged byte = 'u'
	ColumnText      byte = 't'
	ColumnBinary    byte = 'b'
)

// Tuple is the TupleData of a change: the published columns, in relation order.
type Tuple []Column

// Begin starts a non-streamed transaction.
type Begin struct {
	FinalLSN   LSN // LSN of the commit record
	CommitTime time.Time
	Xid        uint32
}

// Commit ends a non-streamed transaction.
type Commit struct {
	Flags      uint8
	CommitLSN  LSN
	EndLSN     LSN // end of the commit record
	CommitTime time.Time
}

// Origin names the replication origin of the transaction; it follows Begin, Begin Prepare or the
// first Stream Start of a transaction.
type Origin struct {
	CommitLSN LSN // 0 inside streams
	Name      string
}

// RelationColumn describes one column of a Relation.
type RelationColumn struct {
	Flags   uint8 // 1 = part of the replica identity key
	Name    string
	TypeOID uint32
	TypeMod int32
}

// IsKey reports whether the column is part of the replica identity key.
func (c RelationColumn) IsKey() bool { return c.Flags&1 != 0 }

// Relation describes a table before the first change that uses it (and again after schema changes).
type Relation struct {
	Xid             uint32 // inside streams: the xid of the change that needed it; else 0
	RelationID      uint32
	Namespace       string // "" means pg_catalog
	Name            string
	ReplicaIdentity byte // 'd' default, 'n' nothing, 'f' full, 'i' index
	Columns         []RelationColumn
}

// DataType describes a non-built-in data type used by a Relation (the protocol's Type message).
type DataType struct {
	Xid       uint32
	TypeOID   uint32
	Namespace string
	Name      string
}

// Insert is one inserted row.
type Insert struct {
	Xid        uint32 // inside streams: the writing (sub)transaction; else 0
	RelationID uint32
	New        Tuple
}

// Update is one updated row. OldKind is 0 (no old tuple), 'K' (the replica identity key changed:
// Old holds the old key columns) or 'O' (REPLICA IDENTITY FULL: Old holds the whole old row).
type Update struct {
	Xid        uint32
	RelationID uint32
	OldKind    byte
	Old        Tuple
	New        Tuple
}

// Delete is one deleted row. OldKind is 'K' (key columns; others sent as NULL) or 'O' (REPLICA
// IDENTITY FULL: the whole row).
type Delete struct {
	Xid        uint32
	RelationID uint32
	OldKind    byte
	Old        Tuple
}

// Truncate options.
const (
	TruncateCascade         uint8 = 1
	TruncateRestartIdentity uint8 = 2
)

// Truncate is one TRUNCATE of one or more relations.
type Truncate struct {
	Xid         uint32
	Options     uint8 // TruncateCascade | TruncateRestartIdentity
	RelationIDs []uint32
}

// LogicalMessage is a message emitted with pg_logical_emit_message.
type LogicalMessage struct {
	Xid     uint32 // inside streams: the top-level xid; else 0
	Flags   uint8  // 1 = transactional
	LSN     LSN
	Prefix  string
	Content []byte // decoded, aliases the input (see the package doc's Buffer ownership)
}

// Transactional reports whether the message belongs to its transaction.
func (m *LogicalMessage) Transactional() bool { return m.Flags&1 != 0 }

// StreamStart opens a stream block of a top-level transaction.
type StreamStart struct {
	Xid          uint32
	FirstSegment bool // first block of this xid in this walsender session
}

// StreamStop closes a stream block.
type StreamStop struct{}

// StreamCommit commits a streamed transaction.
type StreamCommit struct {
	Xid        uint32
	Flags      uint8
	CommitLSN  LSN
	EndLSN     LSN
	CommitTime time.Time
}

// StreamAbort aborts a streamed (sub)transaction: SubXid == Xid for the top level. AbortLSN and
// AbortTime are present only with streaming = parallel (HasAbortInfo).
type StreamAbort struct {
	Xid          uint32
	SubXid       uint32
	HasAbortInfo bool
	AbortLSN     LSN
	AbortTime    time.Time
}

// BeginPrepare starts a non-streamed prepared transaction (two_phase).
type BeginPrepare struct {
	PrepareLSN  LSN
	EndLSN      LSN
	PrepareTime time.Time
	Xid         uint32
	GID         string
}

// Prepare ends a non-streamed prepared transaction (PREPARE TRANSACTION).
type Prepare struct {
	Flags       uint8
	PrepareLSN  LSN
	EndLSN      LSN
	PrepareTime time.Time
	Xid         uint32
	GID         string
}

// CommitPrepared is COMMIT PREPARED of a transaction sent earlier.
type CommitPrepared struct {
	Flags      uint8
	CommitLSN  LSN
	EndLSN     LSN
	CommitTime time.Time
	Xid        uint32
	GID        string
}

// RollbackPrepared is ROLLBACK PREPARED of a transaction sent earlier.
type RollbackPrepared struct {
	Flags          uint8
	PrepareEndLSN  LSN
	RollbackEndLSN LSN
	PrepareTime    time.Time
	RollbackTime   time.Time
	Xid            uint32
	GID            string
}

// StreamPrepare prepares a streamed transaction; same fields as Prepare.
type StreamPrepare struct {
	Flags       uint8
	PrepareLSN  LSN
	EndLSN      LSN
	PrepareTime time.Time
	Xid         uint32
	GID         string
}

// TxnMessage is a message of a transaction's contents that says which (sub)transaction wrote
// it: *Insert, *Update, *Delete, *Truncate, *LogicalMessage, *Relation and *DataType.
type TxnMessage interface {
	Message
	// XID is the transaction that wrote the message, as its Xid field says: inside a stream
	// block the (sub)transaction (the top-level one for a logical message), 0 outside one.
	XID() uint32
}

// RowChange is a change of one row: *Insert, *Update or *Delete.
type RowChange interface {
	TxnMessage
	// RelationOID is the OID of the row's relation, its RelationID field: the id the stream's
	// Relation message describes it under.
	RelationOID() uint32
}

// ChangeXid returns the (sub)transaction that wrote m when m changes rows (*Insert, *Update,
// *Delete, *Truncate): its Xid inside a stream block, 0 outside one; 0 for any other message.
// A streamed transaction's subtransactions begin at their first change.
func ChangeXid(m Message) uint32 {
	switch m := m.(type) {
	case RowChange:
		return m.XID()
	case *Truncate:
		return m.Xid
	}
	return 0
}

func (m *Insert) XID() uint32         { return m.Xid }
func (m *Update) XID() uint32         { return m.Xid }
func (m *Delete) XID() uint32         { return m.Xid }
func (m *Truncate) XID() uint32       { return m.Xid }
func (m *LogicalMessage) XID() uint32 { return m.Xid }
func (m *Relation) XID() uint32       { return m.Xid }
func (m *DataType) XID() uint32       { return m.Xid }

func (m *Insert) RelationOID() uint32 { return m.RelationID }
func (m *Update) RelationOID() uint32 { return m.RelationID }
func (m *Delete) RelationOID() uint32 { return m.RelationID }

func (*Begin) Type() MessageType            { return MsgBegin }
func (*Commit) Type() MessageType           { return MsgCommit }
func (*Origin) Type() MessageType           { return MsgOrigin }
func (*Relation) Type() MessageType         { return MsgRelation }
func (*DataType) Type() MessageType         { return MsgDataType }
func (*Insert) Type() MessageType           { return MsgInsert }
func (*Update) Type() MessageType           { return MsgUpdate }
func (*Delete) Type() MessageType           { return MsgDelete }
func (*Truncate) Type() MessageType         { return MsgTruncate }
func (*LogicalMessage) Type() MessageType   { return MsgLogicalMessage }
func (*StreamStart) Type() MessageType      { return MsgStreamStart }
func (*StreamStop) Type() MessageType       { return MsgStreamStop }
func (*StreamCommit) Type() MessageType     { return MsgStreamCommit }
func (*StreamAbort) Type() MessageType      { return MsgStreamAbort }
func (*BeginPrepare) Type() MessageType     { return MsgBeginPrepare }
func (*Prepare) Type() MessageType          { return MsgPrepare }
func (*CommitPrepared) Type() MessageType   { return MsgCommitPrepared }
func (*RollbackPrepared) Type() MessageType { return MsgRollbackPrepared }
func (*StreamPrepare) Type() MessageType    { return MsgStreamPrepare }

// pgEpochUnix is 2000-01-01 00:00:00 UTC in Unix seconds: PostgreSQL timestamps count µs from it.
const pgEpochUnix = 946684800

// pgTime converts PostgreSQL µs-since-2000 to a UTC time. Every int64 converts exactly (and back,
// with pgMicros), including PostgreSQL's ±infinity.
func pgTime(us int64) time.Time {
	return time.Unix(us/1e6+pgEpochUnix, (us%1e6)*1e3).UTC()
}

// pgMicros is the inverse of pgTime; ok is false if t is outside the int64 µs range.
func pgMicros(t time.Time) (us int64, ok bool) {
	sec := t.Unix() - pgEpochUnix
	frac := int64(t.Nanosecond() / 1e3)
	if sec < 0 && frac > 0 {
		sec++
		frac -= 1e6
	}
	const maxSec, minSec = 9223372036854, -9223372036854
	if sec > maxSec || sec < minSec || (sec == maxSec && frac > 775807) || (sec == minSec && frac < -775808) {
		return 0, false
	}
	return sec*1e6 + frac, true
}
