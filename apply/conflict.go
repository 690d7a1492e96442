package apply

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/target"
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
	bad := func(format string, args ...any) (conflict.Config, error) {
		return c, fmt.Errorf("%w: Conflicts: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	keys := make([]conflict.Type, 0, len(c.Resolutions))
	for ct := range c.Resolutions {
		keys = append(keys, ct)
	}
	slices.Sort(keys)
	for _, ct := range keys {
		r := c.Resolutions[ct]
		switch {
		case !ct.Valid():
			return bad("unknown conflict type %d", int(ct))
		case !r.Valid():
			return bad("%s: unknown resolution %d", ct, int(r))
		case c.Off && r != conflict.Default:
			return bad("%s: a resolution needs detection (Off is set)", ct)
		}
	}
	switch {
	case c.Retention < 0:
		return bad("Retention %v", c.Retention)
	case c.Retention > 0 && c.Retention < conflict.MinRetention:
		return bad("Retention %v (want 0 or at least %v)", c.Retention, conflict.MinRetention)
	case c.Retention > 0 && c.Off:
		return bad("Retention needs detection (Off is set)")
	case c.LogTable != "" && c.Off:
		return bad("LogTable needs detection (Off is set)")
	case c.MaxLoggedValue < 0:
		return bad("MaxLoggedValue %d", c.MaxLoggedValue)
	}
	if c.MaxLoggedValue == 0 {
		c.MaxLoggedValue = conflict.DefaultMaxLoggedValue
	}
	if c.LogTable != "" {
		if _, err := target.ParseQualified(c.LogTable); err != nil {
			return bad("LogTable: %v", err)
		}
	}
	if c.TombstoneTable != "" {
		if _, err := target.ParseQualified(c.TombstoneTable); err != nil {
			return bad("TombstoneTable: %v", err)
		}
	}
	c.Resolutions = maps.Clone(c.Resolutions) // the caller may change its map
	return c, nil
}

// ErrConflict is wrapped by the *ApplyError of a conflict whose resolution is conflict.Error;
// its Err is a *conflict.StopError.
var ErrConflict = errors.New("apply: conflict")

// conflictStopped counts and logs a conflict that stops Run (err is the transaction's final
// error: a transaction retried alone after failing among others is counted once).
func (s *session) conflictStopped(err error) {
	var ce *conflict.StopError
	if errors.As(err, &ce) {
		s.stats.Conflicts[ce.Report.Type].Add(1)
		detect.LogConflict(ce.Report, s.log, slog.LevelError)
	}
}
