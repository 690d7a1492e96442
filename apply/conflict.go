package apply

import (
	"errors"
	"log/slog"
	"maps"
	"slices"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
)

// lastUpdateWins reports whether some conflict type is resolved by commit timestamps.
func lastUpdateWins(c *conflict.Config) bool {
	for _, ct := range conflict.Types() {
		if c.Resolution(ct) == conflict.LastUpdateWins {
			return true
		}
	}
	return false
}

// validateConflicts checks c and fills in its defaults.
func validateConflicts(c conflict.Config) (conflict.Config, error) {
	bad := func(f configerr.Field, format string, args ...any) (conflict.Config, error) {
		return c, invalid(f, format, args...)
	}
	off := field("Conflicts.Off")
	keys := make([]conflict.Type, 0, len(c.Resolutions))
	for ct := range c.Resolutions {
		keys = append(keys, ct)
	}
	slices.Sort(keys)
	for _, ct := range keys {
		r := c.Resolutions[ct]
		switch {
		case !ct.Valid():
			return bad(field("Conflicts.Resolutions"), "has an unknown conflict type %d", int(ct))
		case !r.Valid():
			return bad(field("Conflicts.Resolutions"), "has an unknown resolution %d for %s", int(r), ct)
		case c.Off && r != conflict.Default:
			return bad(field("Conflicts.Resolutions"), "has a resolution for %s: resolutions need detection, which %s turns off", ct, off)
		}
	}
	switch {
	case c.Retention < 0:
		return bad(field("Conflicts.Retention"), "%v (want 0, or at least %v)", c.Retention, conflict.MinRetention)
	case c.Retention > 0 && c.Retention < conflict.MinRetention:
		return bad(field("Conflicts.Retention"), "%v (want 0, or at least %v)", c.Retention, conflict.MinRetention)
	case c.Retention > 0 && c.Off:
		return bad(field("Conflicts.Retention"), "needs detection, which %s turns off", off)
	case c.LogTable != "" && c.Off:
		return bad(field("Conflicts.LogTable"), "needs detection, which %s turns off", off)
	case c.MaxLoggedValue < 0:
		return bad(field("Conflicts.MaxLoggedValue"), "%d (want bytes, or 0 for the default)", c.MaxLoggedValue)
	}
	if c.MaxLoggedValue == 0 {
		c.MaxLoggedValue = conflict.DefaultMaxLoggedValue
	}
	if c.LogTable != "" {
		if _, err := target.ParseQualified(c.LogTable); err != nil {
			return bad(field("Conflicts.LogTable"), "%q: %v", c.LogTable, err)
		}
	}
	if c.TombstoneTable != "" {
		if _, err := target.ParseQualified(c.TombstoneTable); err != nil {
			return bad(field("Conflicts.TombstoneTable"), "%q: %v", c.TombstoneTable, err)
		}
	}
	c.Resolutions = maps.Clone(c.Resolutions) // the caller may change its map
	return c, nil
}

// ErrConflict is wrapped by the *ApplyError of a conflict whose resolution is conflict.Error;
// its Err is a *conflict.StopError.
var ErrConflict = retry.Stop("apply: conflict")

// conflictStopped counts and logs a conflict that stops Run (err is the transaction's final
// error: a transaction retried alone after failing among others is counted once).
func (s *session) conflictStopped(err error) {
	var ce *conflict.StopError
	if errors.As(err, &ce) {
		s.stats.Conflicts[ce.Report.Type].Add(1)
		detect.LogConflict(ce.Report, s.log, slog.LevelError)
	}
}
