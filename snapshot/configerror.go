package snapshot

import "github.com/pgreorder/pgreorder/internal/configerr"

// ConfigError is the error about one field of a Config: Field names it (Field.Config is
// "snapshot", Field.Path its path there), Reason says what is wrong, and it wraps ErrInvalidConfig.
// It is the same type as the ConfigError of the other packages (replication, apply, ...): one
// errors.As finds any.
type ConfigError = configerr.Error

// field names field path of snapshot.Config.
func field(path string) configerr.Field { return configerr.Field{Config: "snapshot", Path: path} }
