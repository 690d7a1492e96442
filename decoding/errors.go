package decoding

import (
	"errors"
	"fmt"
	"strings"
)

// Errors wrapped by [*DecodeError]. Test with errors.Is.
var (
	// ErrTruncated: the message ends before a field it must contain.
	ErrTruncated = errors.New("decoding: message truncated")
	// ErrUnknownMessage: the type byte is not a pgoutput message type.
	ErrUnknownMessage = errors.New("decoding: unknown message type")
	// ErrMalformed: a field holds a value pgoutput never writes (negative length, unknown tuple
	// column kind, bytes after the last field, …).
	ErrMalformed = errors.New("decoding: malformed message")
	// ErrProtocolViolation is wrapped by every error about a message arriving in a state or on a
	// protocol version where the server never sends it.
	ErrProtocolViolation = errors.New("decoding: protocol violation")
)

// Protocol violations; each wraps [ErrProtocolViolation].
var (
	ErrStreamStartInBlock       = violation("Stream Start inside a stream block")
	ErrStreamStopOutsideBlock   = violation("Stream Stop outside a stream block")
	ErrChangeOutsideTransaction = violation("change outside any transaction or stream block")
	ErrBeginInTransaction       = violation("transaction start inside a transaction or stream block")
	ErrCommitOutsideTransaction = violation("Commit or Prepare outside a matching transaction")
	ErrFinishInBlock            = violation("transaction end inside a stream block")
	ErrFinishInTransaction      = violation("stream or prepared transaction end inside a transaction")
	ErrVersion                  = violation("message type not in the negotiated protocol version")
)

type violationError struct{ msg string }

func violation(msg string) error        { return &violationError{msg} }
func (e *violationError) Error() string { return "decoding: protocol violation: " + e.msg }
func (e *violationError) Unwrap() error { return ErrProtocolViolation }

// DecodeError reports a message that could not be decoded or is not valid in the current state.
type DecodeError struct {
	Type   MessageType // the message's type byte (0 for an empty message)
	Offset int         // byte offset in the message where the problem was found
	Err    error       // one of the sentinels of this package, possibly wrapped with detail
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("decoding: %v message at offset %d: %s", e.Type, e.Offset, strings.TrimPrefix(e.Err.Error(), "decoding: "))
}

func (e *DecodeError) Unwrap() error { return e.Err }

func decodeErr(t MessageType, off int, err error) error {
	return &DecodeError{Type: t, Offset: off, Err: err}
}
