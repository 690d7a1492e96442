package reorderbuffer

import (
	"errors"
	"fmt"

	"github.com/pgreorder/pgreorder/decoding"
)

var (
	// ErrClosed is returned by every method of a Buffer after Close.
	ErrClosed = errors.New("reorderbuffer: closed")

	// ErrFailed is wrapped by every error returned after an earlier error: once input was rejected
	// or spilling failed, the buffer refuses further input rather than risk emitting a
	// transaction with holes. Close it and start again from the last acknowledged position.
	ErrFailed = errors.New("reorderbuffer: refusing input after an earlier error")

	// ErrReleased is yielded by Txn.Changes when the transaction was released by a later call to
	// Buffer.Next or Buffer.Close.
	ErrReleased = errors.New("reorderbuffer: transaction already released")

	// ErrForeignTxn is returned by Ack for a nil transaction or one another Buffer handed out.
	ErrForeignTxn = errors.New("reorderbuffer: Ack of a transaction this buffer did not hand out")

	// ErrNotCommit is returned by Ack for a part of a transaction that does not commit it (see
	// PartKind): only whole transactions and their commit parts are acknowledged.
	ErrNotCommit = errors.New("reorderbuffer: Ack of a part that does not commit")

	// ErrProtocol is wrapped by errors for streams that are well formed message by message but
	// inconsistent as a whole, such as a continued stream of a transaction never started.
	ErrProtocol = errors.New("reorderbuffer: protocol violation")
)

// InputError describes a message the buffer could not accept.
type InputError struct {
	LSN  decoding.LSN         // the position passed to Add
	Type decoding.MessageType // the message's type, 0 if the message was empty
	Err  error                // the cause: a decoding error, a protocol violation, or a spill I/O error
}

func (e *InputError) Error() string {
	if e.Type == 0 {
		return fmt.Sprintf("reorderbuffer: message at %s: %v", e.LSN, e.Err)
	}
	return fmt.Sprintf("reorderbuffer: %v message at %s: %v", e.Type, e.LSN, e.Err)
}

func (e *InputError) Unwrap() error { return e.Err }

// MissingError reports the end, or the continuation, of a transaction whose earlier messages the
// buffer never received, and that does not end at or before Config.SkipThrough: its changes were
// lost upstream of the buffer (replication started past its beginning, or a connection was
// resumed without Restart). It wraps ErrProtocol.
type MissingError struct {
	Xid  uint32
	GID  string       // for two-phase transactions
	LSN  decoding.LSN // the commit (or prepare) LSN the message carries, or the position passed to Add
	What string       // what arrived
}

func (e *MissingError) Error() string {
	gid := ""
	if e.GID != "" {
		gid = fmt.Sprintf(" (gid %q)", e.GID)
	}
	return fmt.Sprintf("reorderbuffer: transaction %d%s at %s: %s; replication must start at the slot's "+
		"confirmed position, with the consumer's own position as Config.SkipThrough", e.Xid, gid, e.LSN, e.What)
}

func (e *MissingError) Unwrap() error { return ErrProtocol }

func errorf(format string, args ...any) error { return fmt.Errorf("reorderbuffer: "+format, args...) }
