package replication

import (
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
)

var (
	// ErrClosed is returned by the methods of a Stream or Conn after Close.
	ErrClosed = retry.Stop("replication: closed")

	// ErrServerEndedStream is returned (or, with reconnection on, logged and retried) when the
	// server ends the replication stream: CopyDone, or CommandComplete without CopyDone, which is
	// how a walsender says goodbye when the server shuts down.
	ErrServerEndedStream = retry.Retry("replication: server ended the replication stream")

	// ErrSlotActive is wrapped by the *SlotActiveError returned when another connection streams
	// from the slot. After a consumer dies, its walsender may hold the slot for a moment; Start
	// and the reconnection loop retry it with backoff, up to Config.Reconnect.SlotWait, unless
	// Config.Reconnect.Disabled is set.
	ErrSlotActive = retry.Retry("replication: slot is in use by another connection")

	// ErrNotConnected is returned by SendStatus while the stream has no connection: the last
	// one was lost and Next has not connected again yet.
	ErrNotConnected = retry.Retry("replication: not connected")

	// ErrServerConfig is wrapped by the *CheckError returned when a server setting prevents
	// logical replication (wal_level, max_replication_slots, max_wal_senders).
	ErrServerConfig = retry.Stop("replication: server configuration does not allow it")

	// ErrPublicationNotFound is wrapped by the *CheckError returned when a publication in
	// Config.Publications does not exist in the connection's database.
	ErrPublicationNotFound = retry.Stop("replication: publication does not exist")

	// ErrSlotNotFound is wrapped by the *CheckError returned when the slot does not exist and
	// Config.CreateSlot is off, or when the slot disappeared between two connections.
	ErrSlotNotFound = retry.Stop("replication: replication slot does not exist")

	// ErrSlotExists is wrapped by the error Conn.CreateSlot returns when the slot already exists.
	ErrSlotExists = retry.Stop("replication: replication slot already exists")

	// ErrSlotMismatch is wrapped by the *CheckError returned when the slot exists but cannot
	// serve the Config: another plugin, another database, physical, two-phase decoding on one side
	// only, or its WAL was removed.
	ErrSlotMismatch = retry.Stop("replication: replication slot does not match the configuration")

	// ErrResumeAhead is wrapped by the *CheckError returned when Config.Buffer.SkipThrough lies
	// beyond the server's current WAL position: it cannot be a position this server sent, and
	// confirming it would make the slot skip every change up to it.
	ErrResumeAhead = retry.Stop("replication: resume position is beyond the server's WAL")

	// ErrSlotAhead is wrapped by the *CheckError StartStreaming returns when, with
	// Config.Buffer.HandOutAdvances, the slot's confirmed position is ahead of
	// Config.Buffer.SkipThrough: transactions were acknowledged that the consumer did not persist.
	ErrSlotAhead = retry.Stop("replication: the slot is ahead of the consumer's position")

	// ErrSystemChanged is wrapped by the *CheckError a Stream fails with when it reconnects to a
	// server with another system identifier (System.ID) than the one it started on.
	ErrSystemChanged = retry.Stop("replication: the server is another database system")
)

// CheckError reports a pre-flight check that failed when connecting: the server, the slot or a
// publication cannot serve the Config as it is. It names what was checked and says how to fix it.
// It wraps one of the sentinels above and, when the server reported the problem, its
// *pgconn.PgError. It is never retried.
type CheckError struct {
	Setting string // what was checked: "wal_level", "publication", "slot", "two_phase", "Buffer.SkipThrough"...
	Problem string // what is wrong
	Fix     string // how to put it right
	Err     error  // the sentinel
	Cause   error  // the server's error, if any

	fix configerr.Text // Fix, when it names fields of the Config
}

// checkError returns e with the fix fix, which may name fields of the Config.
func checkError(e *CheckError, fix configerr.Text) *CheckError {
	e.Fix, e.fix = fix.String(), fix
	return e
}

func (e *CheckError) Error() string { return e.Named(configerr.Field.String) }

// Named returns the message with the fields its fix names named by name.
func (e *CheckError) Named(name FieldNamer) string {
	msg := "replication: " + e.Setting + ": " + e.Problem
	fix := e.Fix
	if len(e.fix.Fields) > 0 && fix == e.fix.String() {
		fix = e.fix.Name(name)
	}
	if fix != "" {
		msg += " (" + fix + ")"
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Retryable reports false: the server, the slot or a publication has to be put right first.
func (e *CheckError) Retryable() bool { return false }

func (e *CheckError) Unwrap() []error {
	errs := []error{e.Err}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}

// ProtocolError reports a replication envelope message that could not be understood, or a
// message the replication protocol does not allow at that point.
type ProtocolError struct {
	Msg string
	Err error // the cause, if any
}

func (e *ProtocolError) Error() string {
	if e.Err != nil {
		return "replication: protocol error: " + e.Msg + ": " + e.Err.Error()
	}
	return "replication: protocol error: " + e.Msg
}

func (e *ProtocolError) Unwrap() error { return e.Err }

// Retryable reports false: the same server sends the same messages again.
func (e *ProtocolError) Retryable() bool { return false }

// Retryable reports whether err is worth another connection attempt, by the one rule of the
// library (package internal/retry): the first error of err's chain that states a behaviour
// decides, and an error that states none is not retried. The connection was lost or refused,
// the server ended the stream (ErrServerEndedStream), the server reported a transient error (see
// Transient) or ended the session, a spill file could not be written (a full disk), or the slot
// is in use (ErrSlotActive, a *SlotActiveError until Config.Reconnect.SlotWait is over): retried.
// Configuration errors, failed pre-flight checks (*CheckError, *OptionError), protocol errors,
// data loss reported by the reorder buffer, a corrupt spill file, server errors of other
// SQLSTATEs, cancellation and errors nobody classified: not. Next applies it when
// Config.Reconnect is on; with reconnection off, a consumer can apply it to the errors Next
// returns.
func Retryable(err error) bool { return retry.Retryable(err) }

// Transient reports whether err is, or wraps, an error reported by a server (*pgconn.PgError)
// whose SQLSTATE is transient: it can go away by itself, so that the same statement or
// connection can succeed when tried again. Those are lost or refused connections, shutdowns and
// restarts of the server, resource shortages, timeouts, cancellation, deadlocks, serialization
// failures, lock timeouts, I/O errors of the server, and an object (a slot) in use by another
// session. Like pgconn.SafeToRetry, it answers for one error and knows nothing of what the
// caller was doing; errors that are not the server's are not transient here.
func Transient(err error) bool {
	return pgsession.TransientSQLState(pgsession.Code(err))
}

// Backend describes a server process, as pg_stat_activity shows it: who holds a slot. Fields
// the server did not show (a role without pg_read_all_stats sees only its own sessions' client
// details) are empty. Its String method prints what is known of it.
type Backend = pgsession.Backend

// SlotActiveError reports a slot that another connection streams from. It wraps ErrSlotActive
// and the server's error. Start and reconnections wait for such a slot up to
// Config.Reconnect.SlotWait; Waited is how long they did.
type SlotActiveError struct {
	Slot   string
	Holder Backend // PID 0 when the server would not say
	Waited time.Duration
	Cause  error
}

func (e *SlotActiveError) Error() string { return e.Named(configerr.Field.String) }

// Named returns the message with the field it names (Reconnect.SlotWait) named by name.
func (e *SlotActiveError) Named(name FieldNamer) string {
	msg := fmt.Sprintf("replication: slot %q is in use by another connection", e.Slot)
	if e.Holder.PID != 0 {
		msg += " (" + e.Holder.String() + ")"
	}
	if e.Waited > 0 {
		msg += fmt.Sprintf("; still in use after waiting %s (%s)", e.Waited.Round(time.Second), name(field("Reconnect.SlotWait")))
	}
	end := fmt.Sprintf("SELECT pg_terminate_backend(%d)", e.Holder.PID)
	if e.Holder.PID == 0 {
		end = "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = " + pgsession.QuoteLiteral(e.Slot)
	}
	msg += ": stop the other consumer or use another slot; if the other consumer is gone and its walsender lingers, " +
		"end it with " + end + " on the source"
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Retryable reports whether the slot is worth asking for again: true while it has not been
// waited for (Waited is 0), false once Start or a reconnection gave up after
// Config.Reconnect.SlotWait.
func (e *SlotActiveError) Retryable() bool { return e.Waited == 0 }

func (e *SlotActiveError) Unwrap() []error {
	errs := []error{ErrSlotActive}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}
