package decoding

import (
	"errors"
	"fmt"
	"reflect"
)

// isNil reports whether m is nil or a nil pointer.
func isNil(m Message) bool {
	if m == nil {
		return true
	}
	v := reflect.ValueOf(m)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// ErrInvalidMessage is wrapped by errors of Append: the message cannot be encoded as pgoutput
// (a string with a NUL byte, an unknown column kind, a length beyond the wire format's range, …).
var ErrInvalidMessage = errors.New("decoding: message cannot be encoded")

// Append appends the pgoutput encoding of m to dst and returns the extended buffer; it is the
// inverse of Parse with the same inStream and opts: for every message Parse returns,
// Parse(Append(nil, m, inStream, opts), inStream, opts) equals m. In-stream changes get their Xid
// field as leading xid; outside streams it is not written. Stream Abort carries abort_lsn and
// abort_time when opts.AbortInfo is AbortInfoAlways, or AbortInfoAuto and m.HasAbortInfo. Append
// only reads m and does not retain it. On error dst is returned unchanged (same length).
func Append(dst []byte, m Message, inStream bool, opts Options) ([]byte, error) {
	if isNil(m) {
		return dst, fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	t := m.Type()
	if !opts.allows(t) {
		return dst, fmt.Errorf("%w: %v needs protocol %d, negotiated %d", ErrVersion, t, minVersion(t), opts.ProtoVersion)
	}
	c := codec{b: append(dst, byte(t)), t: t, enc: true, inStream: inStream, abortMode: opts.AbortInfo}
	if !walk(&c, m) {
		return dst, fmt.Errorf("%w: unknown message type %T", ErrInvalidMessage, m)
	}
	if c.err != nil {
		return dst, fmt.Errorf("decoding: encode %v: %w", t, c.err)
	}
	return c.b, nil
}
