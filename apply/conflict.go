package apply

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// ConflictType is a kind of conflict between a source change and the target's rows, with
// PostgreSQL's names (pg_stat_subscription_stats counts the same ones).
type ConflictType int

const (
	// InsertExists: an INSERT violates a unique constraint (NOT DEFERRABLE) of the target.
	InsertExists ConflictType = iota
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
	// after the source transaction committed. Needs ConflictConfig.Retention (tombstones).
	UpdateDeleted
	// DeleteMissing: the row to delete does not exist on the target.
	DeleteMissing
	// MultipleUniqueConflicts: an INSERT or UPDATE violates several unique constraints at once;
	// every conflicting local row is reported.
	MultipleUniqueConflicts

	numConflictTypes = iota
)

var conflictNames = [numConflictTypes]string{
	InsertExists:            "insert_exists",
	UpdateOriginDiffers:     "update_origin_differs",
	UpdateExists:            "update_exists",
	UpdateMissing:           "update_missing",
	DeleteOriginDiffers:     "delete_origin_differs",
	UpdateDeleted:           "update_deleted",
	DeleteMissing:           "delete_missing",
	MultipleUniqueConflicts: "multiple_unique_conflicts",
}

func (c ConflictType) String() string {
	if c >= 0 && int(c) < len(conflictNames) {
		return conflictNames[c]
	}
	return fmt.Sprintf("ConflictType(%d)", int(c))
}

// ConflictTypes returns every conflict type, in PostgreSQL's order.
func ConflictTypes() []ConflictType {
	out := make([]ConflictType, numConflictTypes)
	for i := range out {
		out[i] = ConflictType(i)
	}
	return out
}

// ParseConflictType parses a conflict type's name, such as "insert_exists".
func ParseConflictType(s string) (ConflictType, error) {
	for i, n := range conflictNames {
		if strings.EqualFold(s, n) {
			return ConflictType(i), nil
		}
	}
	return 0, fmt.Errorf("%w: conflict type %q (want one of %s)", ErrInvalidConfig, s, strings.Join(conflictNames[:], ", "))
}

// Resolution is what the Applier does about a conflict.
type Resolution int

const (
	// ResolveDefault is PostgreSQL's behaviour for the type: ResolveError for insert_exists,
	// update_exists and multiple_unique_conflicts, ResolveApplyRemote for update_origin_differs
	// and delete_origin_differs, ResolveSkip for update_missing, update_deleted and
	// delete_missing.
	ResolveDefault Resolution = iota
	// ResolveError stops Run with an *ApplyError wrapping ErrConflict: nothing from the source
	// transaction on is acknowledged, so once the target is fixed a new Run applies it again.
	ResolveError
	// ResolveSkip leaves the target as it is: the source change is not applied.
	ResolveSkip
	// ResolveApplyRemote makes the source change win: an INSERT or UPDATE that violates a unique
	// constraint replaces the conflicting local rows; an UPDATE or DELETE applies to a row
	// another origin changed; an UPDATE whose row is missing inserts the new row (when the
	// source sent all of it: an unchanged TOASTed value leaves it skipped). A missing row to
	// delete stays missing.
	ResolveApplyRemote
	// ResolveKeepLocal keeps the local rows: like ResolveSkip.
	ResolveKeepLocal
	// ResolveLastUpdateWins applies the source change when its commit timestamp is later than
	// the local rows' (for update_deleted: than the deletion's), and keeps the local rows
	// otherwise; equal timestamps are decided by the rows' text, the greater winning, so that
	// two nodes replicating to each other pick the same version. A source transaction applied
	// before its commit arrived counts as committing now. Needs track_commit_timestamp on the
	// target (without it the source's change wins), and Config.Origin on both sides so that
	// the commit timestamps of replicated rows are their source's.
	ResolveLastUpdateWins

	numResolutions = iota
)

var resolutionNames = [numResolutions]string{
	ResolveDefault:        "default",
	ResolveError:          "error",
	ResolveSkip:           "skip",
	ResolveApplyRemote:    "apply_remote",
	ResolveKeepLocal:      "keep_local",
	ResolveLastUpdateWins: "last_update_wins",
}

func (r Resolution) String() string {
	if r >= 0 && int(r) < len(resolutionNames) {
		return resolutionNames[r]
	}
	return fmt.Sprintf("Resolution(%d)", int(r))
}

// ParseResolution parses a resolution's name: error, skip, apply_remote, keep_local,
// last_update_wins or default.
func ParseResolution(s string) (Resolution, error) {
	for i, n := range resolutionNames {
		if strings.EqualFold(s, n) {
			return Resolution(i), nil
		}
	}
	return 0, fmt.Errorf("%w: resolution %q (want one of %s)", ErrInvalidConfig, s, strings.Join(resolutionNames[:], ", "))
}

// defaultResolution is PostgreSQL's behaviour for each type.
var defaultResolution = [numConflictTypes]Resolution{
	InsertExists:            ResolveError,
	UpdateOriginDiffers:     ResolveApplyRemote,
	UpdateExists:            ResolveError,
	UpdateMissing:           ResolveSkip,
	DeleteOriginDiffers:     ResolveApplyRemote,
	UpdateDeleted:           ResolveSkip,
	DeleteMissing:           ResolveSkip,
	MultipleUniqueConflicts: ResolveError,
}

// Defaults of ConflictConfig.
const (
	// DefaultTombstoneTable is the target table of tombstones (ConflictConfig.Retention).
	DefaultTombstoneTable = "pgreorder_tombstones"
	// DefaultMaxLoggedValue is the longest value a row of the conflict log table holds as it
	// is; a longer one is replaced by a marker.
	DefaultMaxLoggedValue = 1024
	// MinRetention is the shortest ConflictConfig.Retention.
	MinRetention = 100 * time.Millisecond
)

// ConflictConfig says how conflicts are detected, resolved and reported. Its zero value
// detects every conflict the target's settings allow and resolves each as PostgreSQL's
// subscriber does.
type ConflictConfig struct {
	// Off turns detection off: statements are sent without the checks below; an UPDATE or
	// DELETE that finds no row is still counted (update_missing, delete_missing) and skipped,
	// and a unique violation stops Run with an *ApplyError wrapping ErrConstraint.
	Off bool
	// Resolutions overrides the resolution of some conflict types (missing or ResolveDefault:
	// PostgreSQL's behaviour, see ResolveDefault).
	Resolutions map[ConflictType]Resolution
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
	// schema of Config.ProgressTable when that one is qualified. A name without a schema is
	// resolved as Config.ProgressTable's is. Its trigger function, named after it with
	// "_record", is beside it. Applier.Uninstall removes both, and the triggers.
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

// resolution returns what to do about a conflict of type c.
func (c *ConflictConfig) resolution(ct ConflictType) Resolution {
	if r, ok := c.Resolutions[ct]; ok && r != ResolveDefault {
		return r
	}
	return defaultResolution[ct]
}

// lastUpdateWins reports whether some conflict type is resolved by commit timestamps.
func (c *ConflictConfig) lastUpdateWins() bool {
	for ct := range ConflictType(numConflictTypes) {
		if c.resolution(ct) == ResolveLastUpdateWins {
			return true
		}
	}
	return false
}

// validate checks c and fills in its defaults.
func (c ConflictConfig) validate() (ConflictConfig, error) {
	bad := func(format string, args ...any) (ConflictConfig, error) {
		return c, fmt.Errorf("%w: Conflicts: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	keys := make([]ConflictType, 0, len(c.Resolutions))
	for ct := range c.Resolutions {
		keys = append(keys, ct)
	}
	slices.Sort(keys)
	for _, ct := range keys {
		r := c.Resolutions[ct]
		switch {
		case ct < 0 || ct >= numConflictTypes:
			return bad("unknown conflict type %d", int(ct))
		case r < 0 || r >= numResolutions:
			return bad("%s: unknown resolution %d", ct, int(r))
		case c.Off && r != ResolveDefault:
			return bad("%s: a resolution needs detection (Off is set)", ct)
		}
	}
	switch {
	case c.Retention < 0:
		return bad("Retention %v", c.Retention)
	case c.Retention > 0 && c.Retention < MinRetention:
		return bad("Retention %v (want 0 or at least %v)", c.Retention, MinRetention)
	case c.Retention > 0 && c.Off:
		return bad("Retention needs detection (Off is set)")
	case c.LogTable != "" && c.Off:
		return bad("LogTable needs detection (Off is set)")
	case c.MaxLoggedValue < 0:
		return bad("MaxLoggedValue %d", c.MaxLoggedValue)
	}
	if c.MaxLoggedValue == 0 {
		c.MaxLoggedValue = DefaultMaxLoggedValue
	}
	if c.LogTable != "" {
		if _, err := parseQualified(c.LogTable); err != nil {
			return bad("LogTable: %v", err)
		}
	}
	if c.TombstoneTable != "" {
		if _, err := parseQualified(c.TombstoneTable); err != nil {
			return bad("TombstoneTable: %v", err)
		}
	}
	c.Resolutions = maps.Clone(c.Resolutions) // the caller may change its map
	return c, nil
}

// ParseResolutions parses "type=resolution" pairs separated by commas, such as
// "insert_exists=last_update_wins,update_missing=apply_remote", into m (made if nil).
func ParseResolutions(s string, m map[ConflictType]Resolution) (map[ConflictType]Resolution, error) {
	if m == nil {
		m = map[ConflictType]Resolution{}
	}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, res, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %q: want type=resolution", ErrInvalidConfig, part)
		}
		ct, err := ParseConflictType(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		r, err := ParseResolution(strings.TrimSpace(res))
		if err != nil {
			return nil, err
		}
		m[ct] = r
	}
	return m, nil
}

// ErrConflict is wrapped by the *ApplyError of a conflict whose resolution is ResolveError; its
// Err is a *ConflictError.
var ErrConflict = errors.New("apply: conflict")

// ConflictError is a conflict that stopped Run (ResolveError).
type ConflictError struct {
	Conflict *Conflict
	// Hint, printed at the end of the error, says how to get past the conflict in terms of
	// Config (see Resolutions). A program with options of its own may replace it with its
	// words before printing the error.
	Hint string
}

func (e *ConflictError) Error() string {
	s := e.Conflict.message() + ": " + e.Conflict.detail()
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

// Resolutions returns the resolutions of the conflict's type that would get past it, the one
// that applies the source change first: ResolveApplyRemote and ResolveSkip (for delete_missing,
// where there is nothing to apply, ResolveSkip).
func (e *ConflictError) Resolutions() []Resolution {
	if e.Conflict.Type == DeleteMissing {
		return []Resolution{ResolveSkip}
	}
	return []Resolution{ResolveApplyRemote, ResolveSkip}
}

// conflictIdents and resolutionIdents are the Go names of the constants, for hints.
var (
	conflictIdents = [numConflictTypes]string{
		InsertExists: "InsertExists", UpdateOriginDiffers: "UpdateOriginDiffers", UpdateExists: "UpdateExists",
		UpdateMissing: "UpdateMissing", DeleteOriginDiffers: "DeleteOriginDiffers", UpdateDeleted: "UpdateDeleted",
		DeleteMissing: "DeleteMissing", MultipleUniqueConflicts: "MultipleUniqueConflicts",
	}
	resolutionIdents = [numResolutions]string{
		ResolveDefault: "ResolveDefault", ResolveError: "ResolveError", ResolveSkip: "ResolveSkip",
		ResolveApplyRemote: "ResolveApplyRemote", ResolveKeepLocal: "ResolveKeepLocal",
		ResolveLastUpdateWins: "ResolveLastUpdateWins",
	}
)

// newConflictError is the error of conflict c, which stops Run, with its hint in terms of Config.
func newConflictError(c *Conflict) *ConflictError {
	e := &ConflictError{Conflict: c}
	rs := e.Resolutions()
	h := "set Config.Conflicts.Resolutions[apply." + conflictIdents[c.Type] + "] to apply." + resolutionIdents[rs[0]]
	if len(rs) > 1 {
		h += " (or apply." + resolutionIdents[rs[1]] + ")"
	}
	e.Hint = h + " to get past it"
	return e
}

// Unwrap returns ErrConflict.
func (e *ConflictError) Unwrap() error { return ErrConflict }
