package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/initcopy"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/replication"
)

// Sentinel errors. An *ApplyError wraps one of the kinds below (besides the cause), so that
// errors.Is(err, apply.ErrConstraint) tells what went wrong and errors.As(err, &pgErr) still
// reaches the server's *pgconn.PgError.
var (
	// ErrInvalidConfig is wrapped by errors about a Config that cannot work.
	ErrInvalidConfig = retry.Stop("apply: invalid configuration")

	// ErrSlotAhead is wrapped by the error Run stops with when the slot's confirmed position is
	// ahead of the target's progress row: the transactions in between were acknowledged to the
	// source but are not on the target (see Config.AcceptSlotAhead).
	ErrSlotAhead = retry.Stop("apply: the slot is ahead of the target's progress row")

	// ErrSourceChanged is wrapped by the error Run stops with when the target's progress row for
	// the slot does not come from the source: it was written for another database system (a
	// rebuilt source, or another source with a slot of the same name), on a later timeline, or at
	// a position beyond the source's WAL. The error says what to do.
	ErrSourceChanged = retry.Stop("apply: the progress row does not come from this source")

	// ErrMissingTable: a published table does not exist on the target (a *MissingTablesError
	// names every one a session found missing when it started, or those Config.SchemaChanges
	// cannot create; an *ApplyError, one that first appears in the stream).
	ErrMissingTable = retry.Stop("apply: target table does not exist")
	// ErrSchemaMismatch: the target table lacks a source column (Config.SchemaChanges can add
	// it), has it generated, or (with Source.Binary) with another type.
	ErrSchemaMismatch = retry.Stop("apply: target table does not match the source")
	// ErrNoReplicaIdentity: an UPDATE or DELETE cannot identify its row: the source relation has
	// no replica identity key and is not REPLICA IDENTITY FULL, or the target table has neither a
	// primary key nor a replica identity index made of source key columns (PostgreSQL's
	// subscriber requires the same).
	ErrNoReplicaIdentity = retry.Stop("apply: no usable replica identity")
	// ErrPermission: the target role may not write the table (SQLSTATE 42501).
	ErrPermission = retry.Stop("apply: permission denied on the target")
	// ErrConstraint: the target refused a row for a constraint (SQLSTATE class 23: unique,
	// check, not-null, foreign key, exclusion), when applied alone, in commit order.
	ErrConstraint = retry.Stop("apply: constraint violation on the target")
	// ErrData: the target refused a value (SQLSTATE class 22, such as invalid input syntax for
	// its column's type).
	ErrData = retry.Stop("apply: value rejected by the target")

	// ErrNotStarted is wrapped by the error Run stops with when its first sessions could not
	// reach both servers within Config.StartTimeout; the error names the side and what failed.
	ErrNotStarted = retry.Stop("apply: not started")

	// ErrSlotInUse is wrapped by the *SlotInUseError returned when another session of the slot
	// still holds it on the target after Config.SlotWait, and returned by Uninstall while an
	// Applier of the slot runs.
	ErrSlotInUse = retry.Stop("apply: the slot is in use by another session")

	// ErrCopyBlocked: the copy of tables added to the publications waits for source commits that
	// wait for a synchronous standby none of which streams (apply itself, named as one).
	ErrCopyBlocked = initcopy.ErrBlocked
)

// SlotInUseError reports connections to the target that another session of the slot (another
// Applier, or what is left of one that died) held for longer than Config.SlotWait. Run stops
// with it. A slot that another consumer streams from on the source is reported by the
// replication package's *replication.SlotActiveError instead.
type SlotInUseError struct {
	Slot    string
	Holders []replication.Backend // the target's backends holding the slot's lock
	Waited  time.Duration
}

func (e *SlotInUseError) holders() string {
	if len(e.Holders) == 0 {
		return "a connection the server did not show"
	}
	var parts []string
	for _, h := range e.Holders {
		parts = append(parts, h.String())
	}
	return strings.Join(parts, "; ")
}

func (e *SlotInUseError) Error() string { return e.Named(configerr.Field.String) }

// Named returns the message with the field it names (SlotWait) named by name.
func (e *SlotInUseError) Named(name FieldNamer) string {
	end := "SELECT pg_terminate_backend(PID)"
	if len(e.Holders) == 1 {
		end = fmt.Sprintf("SELECT pg_terminate_backend(%d)", e.Holders[0].PID)
	}
	return fmt.Sprintf("apply: slot %q is in use on the target by another session (%s), still after waiting %s (%s): "+
		"stop the other apply of the slot; if it is gone and its connection lingers, end it with %s on the target",
		e.Slot, e.holders(), e.Waited.Round(time.Second), name(field("SlotWait")), end)
}

func (e *SlotInUseError) Unwrap() error { return ErrSlotInUse }

// Retryable reports false: the slot was waited for already, up to Config.SlotWait.
func (e *SlotInUseError) Retryable() bool { return false }

// ApplyError reports a source transaction the target refused. Run stops with it (it is not
// retried: restarting would fail the same way); nothing at or after the transaction was
// acknowledged to the source, so once the cause is fixed a new Run resumes with that
// transaction, or, with Config.SkipLSN set to CommitLSN, skips it. Its message names that LSN.
type ApplyError struct {
	// Kind is one of ErrMissingTable, ErrSchemaMismatch, ErrNoReplicaIdentity, ErrPermission,
	// ErrConstraint and ErrData, or nil for another error of the target.
	Kind error
	// Relation is the target table, quoted and qualified ("public"."t"), or "" when the error
	// is not about one table.
	Relation string
	// Op is what was applied, OpNone when the error is not about one statement.
	Op Op
	// Xid is the source transaction.
	Xid uint32
	// CommitLSN and EndLSN are the source transaction's commit record; EndLSN is the position it
	// would have been acknowledged at.
	CommitLSN, EndLSN decoding.LSN
	// Err is the cause, usually a *pgconn.PgError.
	Err error
}

func (e *ApplyError) Error() string { return e.Named(configerr.Field.String) }

// Named returns the message with the field of its hint (SkipLSN) named by name.
func (e *ApplyError) Named(name FieldNamer) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apply: source transaction %d (commit %s, end %s)", e.Xid, e.CommitLSN, e.EndLSN)
	if e.Op != OpNone {
		b.WriteString(": " + e.Op.String())
		if e.Relation != "" {
			b.WriteString(" " + e.Relation)
		}
	} else if e.Relation != "" {
		b.WriteString(": " + e.Relation)
	}
	if e.Kind != nil {
		b.WriteString(": " + strings.TrimPrefix(e.Kind.Error(), "apply: "))
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	if e.CommitLSN != 0 && e.Op != OpCopy {
		fmt.Fprintf(&b, " (to skip the whole transaction instead, losing its changes on the target: %s)", name(skipField(e.CommitLSN)))
	}
	return b.String()
}

// Retryable reports whether the session is worth starting again: only when the connection went
// while the change was applied (retry.Lost: the progress row tells what committed), never when
// the target refused it.
func (e *ApplyError) Retryable() bool { return retry.Lost(e.Err) }

// Unwrap returns Kind and Err.
func (e *ApplyError) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// kinds are the sentinel errors of the target package's kinds of change errors.
var kinds = [...]error{target.KindMissingTable: ErrMissingTable, target.KindSchemaMismatch: ErrSchemaMismatch,
	target.KindNoReplicaIdentity: ErrNoReplicaIdentity, target.KindPermission: ErrPermission,
	target.KindConstraint: ErrConstraint, target.KindData: ErrData, target.KindConflict: ErrConflict}

// kindErr returns the sentinel error of k, or nil for target.KindNone.
func kindErr(k target.Kind) error {
	if k > 0 && int(k) < len(kinds) {
		return kinds[k]
	}
	return nil
}

// changeError is a change the target refused (a *target.ChangeError) as users see it: wrapping
// the sentinel error of its kind, for errors.Is, and the *target.ChangeError with its cause.
type changeError struct{ *target.ChangeError }

func (e changeError) Unwrap() []error {
	if k := kindErr(e.Kind); k != nil {
		return []error{k, e.ChangeError}
	}
	return []error{e.ChangeError}
}

// configErr wraps an error of the target's configuration (a *target.ConfigError) in
// ErrInvalidConfig; other errors are returned as they are.
func configErr(err error) error {
	var ce *target.ConfigError
	if errors.As(err, &ce) {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return err
}

// connectTarget opens a target connection set up to apply changes (target.Connect).
func connectTarget(ctx context.Context, o *target.Options, name string, stats *target.Counters) (*target.Conn, error) {
	tg, err := target.Connect(ctx, o, name, stats)
	return tg, configErr(err)
}

// retryable reports whether starting the session again can cure err, as the errors say
// (internal/retry): connection failures of the source or the target, server restarts, deadlocks
// and other transient errors are; refused changes (*ApplyError, unless the connection went), bad
// configuration (a failed pre-flight check of the source included: wal_level, a missing
// publication, a slot that cannot serve), a slot still in use after SlotWait, protocol
// violations, lost data and errors nobody classified are not.
func retryable(err error) bool { return retry.Retryable(err) }

// restartError asks for the session to start again at once, applying the named source
// transactions serially: they failed, or had to be rolled back, while applied concurrently with
// others, which may have been the cause.
type restartError struct {
	xids     []uint32
	reason   error
	stepwise bool // and one statement at a time (see Applier.stepwise)
}

func (e *restartError) Error() string {
	return fmt.Sprintf("apply: retrying transaction(s) %v serially: %v", e.xids, e.reason)
}

func (e *restartError) Unwrap() error { return e.reason }

// Retryable reports true: the session starts again at once.
func (e *restartError) Retryable() bool { return true }
