package reorderbuffer

import (
	"errors"
	"fmt"
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

	// ErrProtocol is wrapped by errors for streams that are well formed message by message but
	// inconsistent as a whole, such as a continued stream of a transaction never started.
	ErrProtocol = errors.New("reorderbuffer: protocol violation")
)

// InputError describes a message the buffer could not accept.
type InputError struct {
	LSN  LSN   // the position passed to Add
	Type byte  // the message type byte, 0 if the message was empty
	Err  error // the cause: a decoding error, a protocol violation, or a spill I/O error
}

func (e *InputError) Error() string {
	if e.Type == 0 {
		return fmt.Sprintf("reorderbuffer: message at %s: %v", e.LSN, e.Err)
	}
	return fmt.Sprintf("reorderbuffer: %q message at %s: %v", e.Type, e.LSN, e.Err)
}

func (e *InputError) Unwrap() error { return e.Err }
