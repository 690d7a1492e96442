package apply

import (
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
)

// ConfigError is the error about one field of a Config (or of the replication, snapshot or
// conflict configurations the Applier makes from it): Field names it (Field.Config is the
// package whose Config holds it, Field.Path its path there), Reason says what is wrong, and it
// wraps ErrInvalidConfig (or that package's), for errors.Is. It is the same type as
// replication.ConfigError, snapshot.ConfigError and the others: one errors.As finds any.
//
// Errors whose message names fields of a Config (an *ApplyError's hint, a *SlotInUseError)
// implement Named, which returns the message with the fields named as a program's users know
// them (a command names its flags).
type ConfigError = configerr.Error

// Field names a field of a Config in an error; FieldNamer names one for a message.
type (
	Field      = configerr.Field
	FieldNamer = configerr.Namer
)

// field names field path of apply.Config.
func field(path string) configerr.Field { return configerr.Field{Config: "apply", Path: path} }

// invalid returns the *ConfigError about the field of apply.Config at path, with the reason
// format and args (a Field among args is named in the message as the reader names fields).
func invalid(f configerr.Field, format string, args ...any) error {
	return configerr.New(ErrInvalidConfig, f, format, args...)
}

// skipField is SkipLSN set to lsn, as messages name it.
func skipField(lsn decoding.LSN) configerr.Field {
	return configerr.Field{Config: "apply", Path: "SkipLSN", Value: lsn.String()}
}

// sourceConnStringError is the error of a Source.ConnString that does not parse (or a
// Source.ConnConfig not made by pgconn.ParseConfig).
func sourceConnStringError(err error) error {
	return &ConfigError{Field: field("Source.ConnString"), Reason: configerr.Words("is not a connection string"), Err: ErrInvalidConfig, Cause: err}
}
