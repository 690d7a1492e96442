package target

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ChangeError is an error of the target while applying one change, before the transaction's
// commit LSN is known: the caller names the transaction.
type ChangeError struct {
	Kind     Kind
	Relation string
	Op       Op
	Err      error
}

func (e *ChangeError) Error() string {
	s := e.Op.String()
	if e.Relation != "" {
		s += " " + e.Relation
	}
	if e.Kind != KindNone {
		s += ": " + e.Kind.String()
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause, usually a *pgconn.PgError.
func (e *ChangeError) Unwrap() error { return e.Err }

// Kind says what a ChangeError is about.
type Kind int

const (
	KindNone              Kind = iota // another error of the target
	KindMissingTable                  // the target table does not exist
	KindSchemaMismatch                // the target table lacks a column, has it generated, or of another type
	KindNoReplicaIdentity             // an UPDATE or DELETE cannot identify its row
	KindPermission                    // SQLSTATE 42501
	KindConstraint                    // SQLSTATE class 23
	KindData                          // SQLSTATE class 22
	KindConflict                      // a conflict whose resolution is conflict.Error
)

var kindText = [...]string{KindNone: "", KindMissingTable: "target table does not exist",
	KindSchemaMismatch: "target table does not match the source", KindNoReplicaIdentity: "no usable replica identity",
	KindPermission: "permission denied on the target", KindConstraint: "constraint violation on the target",
	KindData: "value rejected by the target", KindConflict: "conflict"}

// String describes the kind, as the error of the applier that stands for it does.
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindText) {
		return kindText[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Op is the statement a ChangeError names (the applier's Op, value for value).
type Op int

const (
	OpNone     Op = iota // not one statement
	OpInsert             // INSERT, or a COPY of inserted rows
	OpUpdate             // UPDATE
	OpDelete             // DELETE
	OpTruncate           // TRUNCATE
	OpCommit             // COMMIT
	OpCopy               // the initial copy's COPY
)

var opText = [...]string{OpNone: "", OpInsert: "INSERT", OpUpdate: "UPDATE", OpDelete: "DELETE",
	OpTruncate: "TRUNCATE", OpCommit: "COMMIT", OpCopy: "COPY"}

// String returns the statement's SQL keyword ("" for OpNone).
func (o Op) String() string {
	if o >= 0 && int(o) < len(opText) {
		return opText[o]
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// ConfigError is an error of the configuration the connections are made with: a connection
// string or configuration that cannot be used, or a table name that cannot be resolved. The
// caller wraps it in its own sentinel for invalid configuration.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }

func (e *ConfigError) Unwrap() error { return e.Err }

func configError(format string, args ...any) error {
	return &ConfigError{Err: fmt.Errorf(format, args...)}
}

// columnError names the target column of a value or a condition the target refused.
type columnError struct {
	column string // quoted
	typ    string // the column's type on the target
	err    error
}

func (e *columnError) Error() string {
	s := "column " + e.column
	if e.typ != "" {
		s += " (" + e.typ + ")"
	}
	return s + ": " + e.err.Error()
}

func (e *columnError) Unwrap() error { return e.err }

// kindOf classifies an error of the target by its SQLSTATE.
func kindOf(err error) Kind {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return KindNone
	}
	switch c := pgErr.Code; {
	case c == "42P01": // undefined_table
		return KindMissingTable
	case c == "42703", c == "42804", c == "428C9": // undefined_column, datatype_mismatch, generated_always
		return KindSchemaMismatch
	case c == "42501": // insufficient_privilege
		return KindPermission
	case strings.HasPrefix(c, "23"):
		return KindConstraint
	case strings.HasPrefix(c, "22"):
		return KindData
	}
	return KindNone
}

// StatementError is the error a statement op whose parameters were not kept reports for err:
// err itself when the connection failed (or a transient error), else a *ChangeError.
func StatementError(op Op, err error) error {
	var b byte
	switch op {
	case OpInsert:
		b = 'I'
	case OpUpdate:
		b = 'U'
	case OpDelete:
		b = 'D'
	case OpTruncate:
		b = 'T'
	}
	return (&Conn{}).statementError(batchOp{op: b}, err)
}
