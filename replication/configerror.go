package replication

import "github.com/pgreorder/pgreorder/internal/configerr"

// ConfigError is the error about one field of a Config: Field names it (Field.Config is
// "replication", Field.Path its path, "ConnString"), Reason says what is wrong, and it wraps
// ErrInvalidConfig. It is the same type as the ConfigError of the other packages (apply,
// changefeed, snapshot, kafkasink): one errors.As finds any. The options pgoutput is sent are
// reported by *OptionError instead, which names the option.
//
// Errors whose message names fields of the Config (a *CheckError's fix, a *SlotActiveError)
// implement Named, which returns the message with the fields named as a program's users know
// them (a command names its flags).
type ConfigError = configerr.Error

// Field names a field of a Config in an error; FieldNamer names one for a message.
type (
	Field      = configerr.Field
	FieldNamer = configerr.Namer
)

// field names field path of replication.Config.
func field(path string) configerr.Field { return configerr.Field{Config: "replication", Path: path} }
