// Package conflict names the conflicts package apply detects between a source change and the
// target's rows, the resolutions it can apply to them, and the reports it makes of them: the
// types of apply.Config.Conflicts, of the *StopError a conflict that stops apply.Run carries,
// and of Stats.Conflicts. Of pgreorder it imports only package decoding (for LSN): a program
// reads and writes these values without the apply machinery.
package conflict

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Type is a kind of conflict between a source change and the target's rows, with PostgreSQL's
// names (pg_stat_subscription_stats counts the same ones).
type Type int

const (
	// InsertExists: an INSERT violates a unique constraint (NOT DEFERRABLE) of the target.
	InsertExists Type = iota
	// UpdateOriginDiffers: the row to update was last changed by another origin than this
	// Applier's: locally, or by another replication. Needs track_commit_timestamp on the target.
	UpdateOriginDiffers
	// UpdateExists: the updated row violates a unique constraint of the target.
	UpdateExists
	// UpdateMissing: the row to update does not exist on the target.
	UpdateMissing
	// DeleteOriginDiffers: the row to delete was last changed by another origin.
	DeleteOriginDiffers
	// UpdateDeleted: the row to update does not exist because it was deleted on the target
	// after the source transaction committed. Needs Config.Retention (tombstones).
	UpdateDeleted
	// DeleteMissing: the row to delete does not exist on the target.
	DeleteMissing
	// MultipleUniqueConflicts: an INSERT or UPDATE violates several unique constraints at once;
	// every conflicting local row is reported.
	MultipleUniqueConflicts

	numTypes = iota
)

var typeNames = [numTypes]string{
	InsertExists:            "insert_exists",
	UpdateOriginDiffers:     "update_origin_differs",
	UpdateExists:            "update_exists",
	UpdateMissing:           "update_missing",
	DeleteOriginDiffers:     "delete_origin_differs",
	UpdateDeleted:           "update_deleted",
	DeleteMissing:           "delete_missing",
	MultipleUniqueConflicts: "multiple_unique_conflicts",
}

// String returns PostgreSQL's name of the type, such as "insert_exists".
func (t Type) String() string {
	if t.Valid() {
		return typeNames[t]
	}
	return fmt.Sprintf("Type(%d)", int(t))
}

// Valid reports whether t is one of the types above.
func (t Type) Valid() bool { return t >= 0 && t < numTypes }

// Types returns every conflict type, in PostgreSQL's order.
func Types() []Type {
	out := make([]Type, numTypes)
	for i := range out {
		out[i] = Type(i)
	}
	return out
}

// ErrInvalid is wrapped by the errors of ParseType, ParseResolution and ParseResolutions.
var ErrInvalid = errors.New("conflict: invalid")

// ParseType parses a conflict type's name, such as "insert_exists".
func ParseType(s string) (Type, error) {
	for i, n := range typeNames {
		if strings.EqualFold(s, n) {
			return Type(i), nil
		}
	}
	return 0, fmt.Errorf("%w conflict type %q (want one of %s)", ErrInvalid, s, strings.Join(typeNames[:], ", "))
}

// Resolution is what the Applier does about a conflict.
type Resolution int

const (
	// Default is PostgreSQL's behaviour for the type: Error for insert_exists, update_exists
	// and multiple_unique_conflicts, ApplyRemote for update_origin_differs and
	// delete_origin_differs, Skip for update_missing, update_deleted and delete_missing.
	Default Resolution = iota
	// Error stops apply.Run with an *apply.ApplyError wrapping apply.ErrConflict, whose Err is a
	// *StopError: nothing from the source transaction on is acknowledged, so once the target is
	// fixed a new Run applies it again.
	Error
	// Skip leaves the target as it is, the local rows included: the source change is not
	// applied.
	Skip
	// ApplyRemote makes the source change win: an INSERT or UPDATE that violates a unique
	// constraint replaces the conflicting local rows; an UPDATE or DELETE applies to a row
	// another origin changed; an UPDATE whose row is missing inserts the new row (when the
	// source sent all of it: an unchanged TOASTed value leaves it skipped). A missing row to
	// delete stays missing.
	ApplyRemote
	// LastUpdateWins applies the source change when its commit timestamp is later than the
	// local rows' (for update_deleted: than the deletion's), and keeps the local rows otherwise;
	// equal timestamps are decided by the rows' text, the greater winning, so that two nodes
	// replicating to each other pick the same version. A source transaction applied before its
	// commit arrived (in Eager or Parallel, applied as its parts arrive) counts as committing now. The local rows
	// are looked up FOR UPDATE (which needs UPDATE privilege), so that a local transaction
	// changing one meanwhile is waited for and judged. Needs track_commit_timestamp on the target
	// (without it the source's change wins), and apply.Config.Origin on both sides so that the
	// commit timestamps of replicated rows are their source's. Its reports say ApplyRemote or
	// Skip, with the Winner.
	LastUpdateWins

	numResolutions = iota
)

var resolutionNames = [numResolutions]string{
	Default:        "default",
	Error:          "error",
	Skip:           "skip",
	ApplyRemote:    "apply_remote",
	LastUpdateWins: "last_update_wins",
}

// String returns the resolution's name, such as "apply_remote".
func (r Resolution) String() string {
	if r.Valid() {
		return resolutionNames[r]
	}
	return fmt.Sprintf("Resolution(%d)", int(r))
}

// Valid reports whether r is one of the resolutions above.
func (r Resolution) Valid() bool { return r >= 0 && r < numResolutions }

// ParseResolution parses a resolution's name: error, skip, apply_remote, last_update_wins or
// default.
func ParseResolution(s string) (Resolution, error) {
	for i, n := range resolutionNames {
		if strings.EqualFold(s, n) {
			return Resolution(i), nil
		}
	}
	return 0, fmt.Errorf("%w resolution %q (want one of %s)", ErrInvalid, s, strings.Join(resolutionNames[:], ", "))
}

// ParseResolutions parses "type=resolution" pairs separated by commas, such as
// "insert_exists=last_update_wins,update_missing=apply_remote", into m (made if nil).
func ParseResolutions(s string, m map[Type]Resolution) (map[Type]Resolution, error) {
	if m == nil {
		m = map[Type]Resolution{}
	}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, res, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("%w pair %q: want type=resolution", ErrInvalid, part)
		}
		t, err := ParseType(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		r, err := ParseResolution(strings.TrimSpace(res))
		if err != nil {
			return nil, err
		}
		m[t] = r
	}
	return m, nil
}

// defaults is PostgreSQL's behaviour for each type.
var defaults = [numTypes]Resolution{
	InsertExists:            Error,
	UpdateOriginDiffers:     ApplyRemote,
	UpdateExists:            Error,
	UpdateMissing:           Skip,
	DeleteOriginDiffers:     ApplyRemote,
	UpdateDeleted:           Skip,
	DeleteMissing:           Skip,
	MultipleUniqueConflicts: Error,
}

// Defaults of Config.
const (
	// DefaultTombstoneTable is the target table of tombstones (Config.Retention).
	DefaultTombstoneTable = "pgreorder_tombstones"
	// DefaultMaxLoggedValue is the longest value a row of the conflict log table holds as it
	// is; a longer one is replaced by a marker.
	DefaultMaxLoggedValue = 1024
	// MinRetention is the shortest Config.Retention.
	MinRetention = 100 * time.Millisecond
)

// Config says how conflicts are detected, resolved and reported. Its zero value detects every
// conflict the target's settings allow and resolves each as PostgreSQL's subscriber does.
type Config struct {
	// Off turns detection off: statements are sent without the checks below; an UPDATE or
	// DELETE that finds no row is still counted (update_missing, delete_missing) and skipped,
	// and a unique violation stops Run with an *apply.ApplyError wrapping apply.ErrConstraint.
	Off bool
	// Resolutions overrides the resolution of some conflict types (missing or Default:
	// PostgreSQL's behaviour, see Default).
	Resolutions map[Type]Resolution
	// Retention, when positive, turns on update_deleted detection: the Applier installs on each
	// target table it writes (and that has a replica identity key) a trigger that records the
	// key, time and transaction of every local deletion (not the Applier's own, nor those of
	// other replications running with session_replication_role = replica) in TombstoneTable,
	// and purges tombstones older than Retention, a bounded number at a time.
	// An UPDATE whose row is missing is update_deleted when a tombstone for its key is newer
	// than the source transaction's commit, update_missing otherwise. While the apply lag
	// exceeds Retention, tombstones would not cover the source transactions still to come:
	// the Applier stops recording them (logged; Stats.RetentionActive is false) and resumes
	// once the lag is back under Retention, as PostgreSQL 19's max_retention_duration does.
	// Zero records nothing: every missing row is update_missing.
	Retention time.Duration
	// TombstoneTable is the target table of tombstones; "" means DefaultTombstoneTable, in the
	// schema of apply.Config.ProgressTable when that one is qualified. A name without a schema
	// is resolved as ProgressTable's is. Its trigger function, named after it with "_record",
	// is beside it. Applier.Uninstall removes both, and the triggers.
	TombstoneTable string
	// LogTable, when set, is a target table (created if missing) that receives one row per
	// conflict, in the transaction that resolves it: the source transaction (xid, final LSN,
	// commit time, origin), the type, the relation, the resolution, the replica identity, the
	// source row and the conflicting local rows (with their xid, commit time and origin) as
	// JSON. Values longer than MaxLoggedValue bytes are replaced by {"omitted_bytes": N}.
	LogTable string
	// MaxLoggedValue bounds the values the log table holds as they are; 0 means
	// DefaultMaxLoggedValue.
	MaxLoggedValue int
}

// Resolution returns what is done about a conflict of type t: its entry of Resolutions, or
// PostgreSQL's behaviour.
func (c *Config) Resolution(t Type) Resolution {
	if r, ok := c.Resolutions[t]; ok && r != Default {
		return r
	}
	if !t.Valid() {
		return Error
	}
	return defaults[t]
}
