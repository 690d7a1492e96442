package pgsession

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes the packages decide on, named as PostgreSQL's errcodes.txt names them.
const (
	UniqueViolation            = "23505" // unique_violation
	ExclusionViolation         = "23P01" // exclusion_violation
	StringDataRightTruncation  = "22001" // string_data_right_truncation
	InvalidParameterValue      = "22023" // invalid_parameter_value
	ProtocolViolation          = "08P01" // protocol_violation
	InsufficientPrivilege      = "42501" // insufficient_privilege
	DuplicateColumn            = "42701" // duplicate_column
	UndefinedColumn            = "42703" // undefined_column
	UndefinedObject            = "42704" // undefined_object
	DuplicateObject            = "42710" // duplicate_object
	DatatypeMismatch           = "42804" // datatype_mismatch
	GeneratedAlways            = "428C9" // generated_always
	UndefinedTable             = "42P01" // undefined_table
	DuplicateTable             = "42P07" // duplicate_table
	TooManyConnections         = "53300" // too_many_connections
	ConfigurationLimitExceeded = "53400" // configuration_limit_exceeded
	ObjectInUse                = "55006" // object_in_use
	LockNotAvailable           = "55P03" // lock_not_available
	SerializationFailure       = "40001" // serialization_failure
	DeadlockDetected           = "40P01" // deadlock_detected
)

// transientClasses are the SQLSTATE classes whose every code is transient.
var transientClasses = [...]string{
	"08", // connection_exception: the connection failed or was refused
	"53", // insufficient_resources: too many connections, out of memory, disk full
}

// transientCodes are the other transient SQLSTATEs. Left out on purpose: 57P04
// database_dropped, and 58P01 undefined_file, which is how a walsender reports WAL that was
// already removed (trying again cannot bring it back).
var transientCodes = [...]string{
	"57P01", // admin_shutdown: the server is shutting down, or the backend was terminated
	"57P02", // crash_shutdown
	"57P03", // cannot_connect_now: the server is starting up or in recovery
	"57P05", // idle_session_timeout
	"57014", // query_canceled
	"25P03", // idle_in_transaction_session_timeout
	"25P04", // transaction_timeout
	SerializationFailure,
	DeadlockDetected,
	LockNotAvailable,
	ObjectInUse, // a slot still active for a previous connection
	"58000",     // system_error
	"58030",     // io_error
}

// TransientSQLState reports whether a server error with SQLSTATE code can go away by itself, so
// that trying again is worthwhile: lost or refused connections, shutdowns and restarts of the
// server, resource shortages, timeouts, cancellation, deadlocks, serialization failures, lock
// timeouts, I/O errors of the server, and an object (a slot) in use by another session.
func TransientSQLState(code string) bool {
	for _, c := range transientClasses {
		if strings.HasPrefix(code, c) {
			return true
		}
	}
	return slices.Contains(transientCodes[:], code)
}

// Code returns the SQLSTATE of the server error (*pgconn.PgError) err is or wraps, "" if it
// holds none.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsCode reports whether err is, or wraps, a server error with SQLSTATE code.
func IsCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// AttemptError is the error of an attempt to connect that failed: the connection could not be
// made (a *pgconn.ConnectError: the network, DNS, TLS, the server's refusal, a timeout of the
// attempt) or Options.BeforeConnect failed. It has the message of the error it wraps.
//
// Its Retryable method states whether another attempt can succeed (package internal/retry): an
// error in Err that states its own behaviour decides; otherwise a refusal by the server is
// decided by its SQLSTATE (TransientSQLState: too many connections and a server starting up
// retry, a password or a missing database stop); otherwise a cancelled context stops, and
// anything else (the network, DNS, TLS, a timeout of the attempt, an error of BeforeConnect)
// retries.
type AttemptError struct{ Err error }

func (e *AttemptError) Error() string { return e.Err.Error() }
func (e *AttemptError) Unwrap() error { return e.Err }

// Retryable reports whether another attempt to connect can succeed: see AttemptError.
func (e *AttemptError) Retryable() bool {
	var stated interface{ Retryable() bool }
	if errors.As(e.Err, &stated) {
		return stated.Retryable()
	}
	var pgErr *pgconn.PgError
	if errors.As(e.Err, &pgErr) {
		return TransientSQLState(pgErr.Code)
	}
	return !errors.Is(e.Err, context.Canceled)
}
