package decoding

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// ErrInvalidMessage is wrapped by errors of Append: the message cannot be encoded as pgoutput
// (a string with a NUL byte, an unknown column kind, a length beyond the wire format's range, …).
var ErrInvalidMessage = errors.New("decoding: message cannot be encoded")

// Append appends the pgoutput encoding of m to dst and returns the extended buffer; it is the
// inverse of Parse with the same inStream and opts: for every message Parse returns,
// Parse(Append(nil, m, inStream, opts), inStream, opts) equals m. In-stream changes get their Xid
// field as leading xid; outside streams it is not written. Stream Abort carries abort_lsn and
// abort_time when opts.AbortInfo is AbortInfoAlways, or AbortInfoAuto and m.HasAbortInfo. On error
// dst is returned unchanged (same length).
func Append(dst []byte, m Message, inStream bool, opts Options) ([]byte, error) {
	if m == nil {
		return dst, fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	t := m.Type()
	if !opts.allows(t) {
		return dst, fmt.Errorf("%w: %v needs protocol %d, negotiated %d", ErrVersion, t, minVersion[t], opts.ProtoVersion)
	}
	e := encoder{b: dst}
	e.u8(byte(t))
	xid := func(x uint32) {
		if inStream {
			e.u32(x)
		}
	}
	switch v := m.(type) {
	case *Begin:
		e.u64(uint64(v.FinalLSN))
		e.time(v.CommitTime)
		e.u32(v.Xid)
	case *Commit:
		e.u8(v.Flags)
		e.u64(uint64(v.CommitLSN))
		e.u64(uint64(v.EndLSN))
		e.time(v.CommitTime)
	case *Origin:
		e.u64(uint64(v.CommitLSN))
		e.str(v.Name)
	case *Relation:
		xid(v.Xid)
		e.u32(v.RelationID)
		e.str(v.Namespace)
		e.str(v.Name)
		e.u8(v.ReplicaIdentity)
		if len(v.Columns) > math.MaxUint16 {
			e.fail("%d relation columns", len(v.Columns))
		}
		e.u16(uint16(len(v.Columns)))
		for _, col := range v.Columns {
			e.u8(col.Flags)
			e.str(col.Name)
			e.u32(col.TypeOID)
			e.u32(uint32(col.TypeMod))
		}
	case *DataType:
		xid(v.Xid)
		e.u32(v.TypeOID)
		e.str(v.Namespace)
		e.str(v.Name)
	case *Insert:
		xid(v.Xid)
		e.u32(v.RelationID)
		e.u8('N')
		e.tuple(v.New)
	case *Update:
		xid(v.Xid)
		e.u32(v.RelationID)
		switch v.OldKind {
		case 0:
		case 'K', 'O':
			e.u8(v.OldKind)
			e.tuple(v.Old)
		default:
			e.fail("update old tuple kind %q", v.OldKind)
		}
		e.u8('N')
		e.tuple(v.New)
	case *Delete:
		xid(v.Xid)
		e.u32(v.RelationID)
		if v.OldKind != 'K' && v.OldKind != 'O' {
			e.fail("delete old tuple kind %q", v.OldKind)
		}
		e.u8(v.OldKind)
		e.tuple(v.Old)
	case *Truncate:
		xid(v.Xid)
		if len(v.RelationIDs) > math.MaxInt32 {
			e.fail("%d truncated relations", len(v.RelationIDs))
		}
		e.u32(uint32(len(v.RelationIDs)))
		e.u8(v.Options)
		for _, id := range v.RelationIDs {
			e.u32(id)
		}
	case *LogicalMessage:
		xid(v.Xid)
		e.u8(v.Flags)
		e.u64(uint64(v.LSN))
		e.str(v.Prefix)
		e.bytes(v.Content)
	case *StreamStart:
		e.u32(v.Xid)
		if v.FirstSegment {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case *StreamStop:
	case *StreamCommit:
		e.u32(v.Xid)
		e.u8(v.Flags)
		e.u64(uint64(v.CommitLSN))
		e.u64(uint64(v.EndLSN))
		e.time(v.CommitTime)
	case *StreamAbort:
		e.u32(v.Xid)
		e.u32(v.SubXid)
		if opts.AbortInfo == AbortInfoAlways || (opts.AbortInfo == AbortInfoAuto && v.HasAbortInfo) {
			e.u64(uint64(v.AbortLSN))
			e.time(v.AbortTime)
		}
	case *BeginPrepare:
		e.u64(uint64(v.PrepareLSN))
		e.u64(uint64(v.EndLSN))
		e.time(v.PrepareTime)
		e.u32(v.Xid)
		e.str(v.GID)
	case *Prepare:
		e.prepare(v.Flags, v.PrepareLSN, v.EndLSN, v.PrepareTime, v.Xid, v.GID)
	case *StreamPrepare:
		e.prepare(v.Flags, v.PrepareLSN, v.EndLSN, v.PrepareTime, v.Xid, v.GID)
	case *CommitPrepared:
		e.prepare(v.Flags, v.CommitLSN, v.EndLSN, v.CommitTime, v.Xid, v.GID)
	case *RollbackPrepared:
		e.u8(v.Flags)
		e.u64(uint64(v.PrepareEndLSN))
		e.u64(uint64(v.RollbackEndLSN))
		e.time(v.PrepareTime)
		e.time(v.RollbackTime)
		e.u32(v.Xid)
		e.str(v.GID)
	default:
		return dst, fmt.Errorf("%w: unknown message type %T", ErrInvalidMessage, m)
	}
	if e.err != nil {
		return dst, fmt.Errorf("decoding: encode %v: %w", t, e.err)
	}
	return e.b, nil
}

type encoder struct {
	b   []byte
	err error
}

func (e *encoder) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidMessage}, args...)...)
	}
}

func (e *encoder) u8(v byte)    { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = be.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = be.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = be.AppendUint64(e.b, v) }

func (e *encoder) time(t time.Time) {
	us, ok := pgMicros(t)
	if !ok {
		e.fail("time %v out of range", t)
	}
	e.u64(uint64(us))
}

func (e *encoder) str(s string) {
	if strings.IndexByte(s, 0) >= 0 {
		e.fail("string %q contains a NUL byte", s)
	}
	e.b = append(e.b, s...)
	e.b = append(e.b, 0)
}

func (e *encoder) bytes(p []byte) {
	if len(p) > math.MaxInt32 {
		e.fail("%d bytes", len(p))
	}
	e.u32(uint32(len(p)))
	e.b = append(e.b, p...)
}

func (e *encoder) tuple(t Tuple) {
	if len(t) > math.MaxUint16 {
		e.fail("%d tuple columns", len(t))
	}
	e.u16(uint16(len(t)))
	for _, c := range t {
		e.u8(c.Kind)
		switch c.Kind {
		case ColumnNull, ColumnUnchanged:
			if c.Data != nil {
				e.fail("column kind %q with data", c.Kind)
			}
		case ColumnText, ColumnBinary:
			e.bytes(c.Data)
		default:
			e.fail("column kind %q", c.Kind)
		}
	}
}

func (e *encoder) prepare(flags uint8, lsn, end LSN, t time.Time, xid uint32, gid string) {
	e.u8(flags)
	e.u64(uint64(lsn))
	e.u64(uint64(end))
	e.time(t)
	e.u32(xid)
	e.str(gid)
}
