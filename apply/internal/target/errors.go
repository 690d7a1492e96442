package target

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
)

// ChangeError is an error of the target while applying one change, before the transaction's
// commit LSN is known: the caller names the transaction.
type ChangeError struct {
	Kind     Kind
	Relation string
	Op       Op
	Err      error
}

// Retryable reports whether the session that failed with the error is worth starting again:
// only when the connection went while the change was applied (retry.Lost), never when the
// target refused it.
func (e *ChangeError) Retryable() bool { return retry.Lost(e.Err) }

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

// Op is the statement a ChangeError names. It is the applier's Op too (apply.Op is an alias of
// it): the values and their names are part of apply's API.
type Op int

const (
	OpNone     Op = iota // not one statement
	OpInsert             // INSERT, or a COPY of inserted rows
	OpUpdate             // UPDATE
	OpDelete             // DELETE
	OpTruncate           // TRUNCATE
	OpCommit             // COMMIT: a deferred constraint, say
	OpCopy               // the initial copy's COPY
)

var opText = [...]string{OpNone: "", OpInsert: "INSERT", OpUpdate: "UPDATE", OpDelete: "DELETE",
	OpTruncate: "TRUNCATE", OpCommit: "COMMIT", OpCopy: "COPY"}

// String returns the statement's SQL keyword, such as "INSERT" ("" for OpNone).
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

// Retryable reports false: the configuration has to be put right.
func (e *ConfigError) Retryable() bool { return false }

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

// Concurrent reports whether err is, or wraps, an error the concurrency of several sessions may
// cause, which the same statements applied alone would not meet: a deadlock detected, a
// serialization failure, a lock not available.
func Concurrent(err error) bool {
	switch pgsession.Code(err) {
	case pgsession.DeadlockDetected, pgsession.SerializationFailure, pgsession.LockNotAvailable:
		return true
	}
	return false
}

// kindOf classifies an error of the target by its SQLSTATE.
func kindOf(err error) Kind {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return KindNone
	}
	switch c := pgErr.Code; {
	case c == pgsession.UndefinedTable:
		return KindMissingTable
	case c == pgsession.UndefinedColumn, c == pgsession.DatatypeMismatch, c == pgsession.GeneratedAlways:
		return KindSchemaMismatch
	case c == pgsession.InsufficientPrivilege:
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

// The errors of statements: what failed, on which table, and where the server says so, which
// column.

// statementError describes the failure of a statement of a batch.
func (t *Conn) statementError(op batchOp, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err // the connection: retried as a whole
	}
	param := paramOf(pgErr)
	kind := kindOf(err)
	switch {
	case pgErr.Code == pgsession.ProtocolViolation && param > 0:
		kind = KindData // a binary value the column's type cannot read: trying again fails the same way
	case pgsession.TransientSQLState(pgErr.Code):
		return err // a transient error: retried as a whole
	}
	ce := &ChangeError{Kind: kind, Op: opName(op.op), Err: err}
	switch {
	case op.rel != nil:
		ce.Relation = op.rel.Name
	case op.name != "":
		ce.Relation = op.name
	case pgErr.TableName != "":
		ce.Relation = pgsession.QuoteQualified(pgErr.SchemaName, pgErr.TableName)
	}
	if pgErr.Code == pgsession.GeneratedAlways && ce.Op == OpUpdate {
		ce.Err = fmt.Errorf("%w (no UPDATE may write a column that is GENERATED ALWAYS AS IDENTITY on the target, and this one "+
			"writes it: the source changed the key, or the column is not the replica identity key; make it GENERATED BY DEFAULT "+
			"there, ALTER TABLE %s ALTER COLUMN ... SET GENERATED BY DEFAULT)", err, ce.Relation)
	}
	if m := op.rel; m != nil {
		col := -1
		switch {
		case param > 0 && op.st != nil && param <= len(op.st.cols):
			col = op.st.cols[param-1]
		case param > 0 && op.st == nil && op.op == 'I' && param <= len(m.cols):
			col = param - 1 // an INSERT of every column (see insertSQL)
		case param == 0 && strings.HasPrefix(pgErr.Where, "COPY "):
			col = copyColumn(m, pgErr.Where)
		case param == 0 && pgErr.Code == pgsession.StringDataRightTruncation && t.det.On() && op.st != nil && op.narg > 0:
			col = t.tooLong(m, op)
		}
		if col >= 0 && col < len(m.cols) {
			var already *columnError
			if !errors.As(err, &already) {
				ce.Err = &columnError{column: m.cols[col].name, typ: m.cols[col].typ, err: err}
			}
		}
	}
	return ce
}

// tooLong returns the column of a character varying(n) or character(n) whose value in op's
// kept parameters is longer than n, or -1 (the server names no column for such a value).
func (t *Conn) tooLong(m *Table, op batchOp) int {
	params, _ := t.det.Kept(op.arg, op.narg)
	for k, v := range params {
		if k >= len(op.st.cols) || v == nil {
			continue
		}
		c := m.cols[op.st.cols[k]]
		if c.chars > 0 && utf8.RuneCount(bytes.TrimRight(v, " ")) > c.chars {
			return op.st.cols[k]
		}
	}
	return -1
}

// paramOf returns the parameter (from 1) whose value the server refused, or 0: its error
// context says "unnamed portal parameter $N", or its message "... in bind parameter N".
func paramOf(e *pgconn.PgError) int {
	for _, s := range []struct{ text, mark string }{{e.Where, "parameter $"}, {e.Message, "bind parameter "}} {
		i := strings.LastIndex(s.text, s.mark)
		if i < 0 {
			continue
		}
		rest := s.text[i+len(s.mark):]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if p, err := strconv.Atoi(rest[:n]); err == nil && p > 0 {
			return p
		}
	}
	return 0
}

// copyColumn returns the column a COPY's error context names ("COPY t, line 3, column v: ..."),
// or -1.
func copyColumn(m *Table, where string) int {
	if !strings.HasPrefix(where, "COPY ") {
		return -1
	}
	best, bestLen := -1, 0
	for i, c := range m.info.Rel.Columns {
		mark := ", column " + c.Name
		j := strings.Index(where, mark)
		if j < 0 || len(c.Name) <= bestLen {
			continue
		}
		if rest := where[j+len(mark):]; rest == "" || strings.HasPrefix(rest, ":") {
			best, bestLen = i, len(c.Name)
		}
	}
	return best
}

// columnAt returns the column the character position pos (from 1, as the server reports it)
// of sql points at: the column's name, or the operator or cast just after it; else -1.
func columnAt(m *Table, sql string, pos int) int {
	off := len(sql)
	for i := range sql {
		if pos--; pos == 0 {
			off = i
			break
		}
	}
	best, at := -1, -1
	for i, c := range m.cols {
		j := strings.LastIndex(sql[:min(len(sql), off+len(c.name))], c.name)
		if j < 0 || j <= at {
			continue
		}
		if end := j + len(c.name); end < off && (off-end > 16 || strings.ContainsAny(sql[end:off], ",()$")) {
			continue // the position is past what follows the name
		}
		best, at = i, j
	}
	return best
}

func opName(op byte) Op {
	switch op {
	case 'I':
		return OpInsert
	case 'U':
		return OpUpdate
	case 'D':
		return OpDelete
	case 'T':
		return OpTruncate
	}
	return OpNone
}
