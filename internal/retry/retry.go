package retry

import (
	"context"
	"io"
	"io/fs"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/spill"
)

// Behaviour is implemented by an error that states whether the work that failed with it is
// worth starting again: Retryable reports true when another attempt can succeed, false when it
// would fail the same way. It decides for the errors it wraps (see the package documentation).
type Behaviour interface {
	error
	Retryable() bool
}

// Retryable reports whether the work that failed with err is worth starting again, by the rule
// of the package documentation: the first error of err's chain that states a behaviour decides,
// and an error that states none stops. Retryable(nil) is false.
func Retryable(err error) bool {
	retry, _ := decide(err, false)
	return retry
}

// Decided reports whether some error of err's chain states a behaviour, by the rule of the
// package documentation: false when Retryable(err) is false only because nothing in err says
// anything.
func Decided(err error) bool {
	_, ok := decide(err, false)
	return ok
}

// decide walks err's chain in errors.As order and returns the first behaviour stated, and
// whether one was. connecting is true inside a *pgconn.ConnectError.
func decide(err error, connecting bool) (retry, stated bool) {
	if err == nil {
		return false, false
	}
	if b, ok := err.(Behaviour); ok {
		return b.Retryable(), true
	}
	if err == context.Canceled || err == context.DeadlineExceeded || err == spill.ErrCorrupt {
		return false, true
	}
	switch e := err.(type) {
	case *spill.CorruptError:
		return false, true
	case *pgconn.PgError:
		return pgsession.TransientSQLState(e.Code) || (!connecting && endsSession(e)), true
	case *pgconn.ConnectError:
		return decide(e.Unwrap(), true)
	case *fs.PathError:
		return true, true
	}
	if lostHere(err) {
		return true, true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return decide(u.Unwrap(), connecting)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if retry, ok := decide(e, connecting); ok {
				return retry, true
			}
		}
	}
	return false, false
}

// Lost reports whether err says that a connection is gone: see the package documentation. It is
// the one definition of a lost connection.
func Lost(err error) bool { return lost(err, false) }

func lost(err error, connecting bool) bool {
	if err == nil {
		return false
	}
	switch e := err.(type) {
	case *spill.CorruptError:
		return false
	case *pgconn.PgError:
		return !connecting && endsSession(e)
	case *pgconn.ConnectError:
		return lost(e.Unwrap(), true)
	case *pgsession.AttemptError:
		return lost(e.Err, true)
	}
	if lostHere(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return lost(u.Unwrap(), connecting)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if lost(e, connecting) {
				return true
			}
		}
	}
	return false
}

// lostHere reports whether err itself, not what it wraps, is an error of a lost connection other
// than a server's.
func lostHere(err error) bool {
	if err == io.EOF || err == io.ErrUnexpectedEOF || err == net.ErrClosed || err == pgconn.ErrConnClosed {
		return true
	}
	if _, ok := err.(syscall.Errno); ok {
		return false // it has net.Error's methods, but it is as often an error of a file
	}
	_, ok := err.(net.Error)
	return ok
}

// endsSession reports whether the server ended the session with e: a FATAL or PANIC error, or
// one of SQLSTATE class 08 (connection exception).
func endsSession(e *pgconn.PgError) bool {
	return e.Severity == "FATAL" || e.Severity == "PANIC" || len(e.Code) == 5 && e.Code[:2] == "08"
}

// Stop returns a new error with message msg, for a sentinel, that states that the work that
// failed with it would fail the same way again.
func Stop(msg string) error { return &sentinel{msg: msg, retry: false} }

// Retry returns a new error with message msg, for a sentinel, that states that another attempt
// can succeed.
func Retry(msg string) error { return &sentinel{msg: msg, retry: true} }

// sentinel is an error made by Stop or Retry. Each is a distinct pointer, for errors.Is.
type sentinel struct {
	msg   string
	retry bool
}

func (e *sentinel) Error() string   { return e.msg }
func (e *sentinel) Retryable() bool { return e.retry }

// Mark returns err, wrapped so that it states the behaviour retry, with the same message; nil
// for nil. It is for an error that a package classifies where it gets it, from a package that
// cannot state its behaviour itself.
func Mark(err error, retry bool) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, retry: retry}
}

type marked struct {
	err   error
	retry bool
}

func (e *marked) Error() string   { return e.err.Error() }
func (e *marked) Unwrap() error   { return e.err }
func (e *marked) Retryable() bool { return e.retry }

// Interface checks.
var (
	_ Behaviour = (*sentinel)(nil)
	_ Behaviour = (*marked)(nil)
)
