// Package configerr is how the library's packages name the fields of their configurations in
// errors, so that a program can name them as its own users know them (the command's flags)
// without reading the messages.
//
// An Error is about one field of a Config: which field (a Field: the package whose Config it
// is and its path there, "Conflicts.Retention"), why, and the package's ErrInvalidConfig,
// which errors.Is finds through it. Each package exports the type under its own name
// (apply.ConfigError, replication.ConfigError, ...): it is the same type everywhere, so one
// errors.As finds it whichever package returned it. A Hint is any other error followed by words
// that name fields ("... (let Config.CreateSlot create it)"), and a Text is those words.
//
// Every error here, and every library error whose message names a field, implements Named: its
// message with the fields named by the caller's function. Error() names them as Go code does.
// The package imports the standard library only.
package configerr

import (
	"fmt"
	"strings"
)

// Field names a field of a package's Config, and optionally a value to give it.
type Field struct {
	Config string // the package whose Config holds the field: "apply", "replication"
	Path   string // the field's path in that Config: "Workers", "Conflicts.Off", "Reconnect.SlotWait"
	Value  string // a value for it, as Go code writes it ("SchemaAddColumns", "0/1D48BB0"), or ""
	Arg    string // Value as text, as the package's Parse function reads it ("add-columns"); "" if as Value
}

// Key is the field's name qualified by its package: "apply.Workers".
func (f Field) Key() string { return f.Config + "." + f.Path }

// String names the field as Go code does: "Config.Path", or "Config.Path = Value".
func (f Field) String() string {
	if f.Value != "" {
		return "Config." + f.Path + " = " + f.Value
	}
	return "Config." + f.Path
}

// Text returns the field's value as text: Arg, or Value if Arg is empty.
func (f Field) Text() string {
	if f.Arg != "" {
		return f.Arg
	}
	return f.Value
}

// Namer names a field for the reader of a message.
type Namer func(Field) string

func goName(f Field) string { return f.String() }

// Text is words that name fields: Format, with one %s for each of Fields, in order.
type Text struct {
	Format string
	Fields []Field
}

// Words returns the Text of format and args (fmt's): a Field among args stays a field, named
// as the reader of the message names fields; the other arguments are formatted at once.
func Words(format string, args ...any) Text { return reason(format, args) }

// String returns the words with the fields named as Go code does.
func (t Text) String() string { return t.Name(goName) }

// Name returns the words with each field named by name.
func (t Text) Name(name Namer) string {
	if len(t.Fields) == 0 {
		return t.Format
	}
	args := make([]any, len(t.Fields))
	for i, f := range t.Fields {
		args[i] = name(f)
	}
	return fmt.Sprintf(t.Format, args...)
}

// Named is implemented by errors whose message names configuration fields.
type Named interface {
	error
	// Named returns the error's message with each field named by name.
	Named(name Namer) string
}

// Error is an error about one field of a Config: its message is Err's, then the field's path
// and the reason, "apply: invalid configuration: Workers 70 (want 0 for the default, or 1 to 64)".
type Error struct {
	Field  Field
	Reason Text  // what is wrong with the field, after its name: "is required", "needs detection (%s is set)"
	Err    error // the package's ErrInvalidConfig
	Cause  error // what made the value wrong (a connection string's parse error), or nil
}

// New returns an *Error about field, wrapping sentinel, with the reason format and args (fmt's;
// a Field among args stays a field, named as the reader of the message names fields).
func New(sentinel error, field Field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: Words(format, args...), Err: sentinel}
}

// reason makes a Text of format and args: each Field argument stays a field, the others are
// formatted at once.
func reason(format string, args []any) Text {
	var fields []Field
	for _, a := range args {
		if f, ok := a.(Field); ok {
			fields = append(fields, f)
		}
	}
	if len(fields) == 0 {
		return Text{Format: fmt.Sprintf(format, args...)}
	}
	// Format the other arguments now, keeping a %s for each field (%% survives Sprintf as %).
	marks := make([]any, len(args))
	for i, a := range args {
		if _, ok := a.(Field); ok {
			marks[i] = "\x00"
		} else {
			marks[i] = a
		}
	}
	s := strings.ReplaceAll(fmt.Sprintf(format, marks...), "%", "%%")
	return Text{Format: strings.ReplaceAll(s, "\x00", "%s"), Fields: fields}
}

// Error names the fields by their paths: the sentinel says which Config they are in.
func (e *Error) Error() string {
	return e.Named(func(f Field) string {
		if f.Value != "" {
			return f.Path + " = " + f.Value
		}
		return f.Path
	})
}

// Named returns the message with the field, and those the reason names, named by name.
func (e *Error) Named(name Namer) string {
	msg := name(e.Field) + " " + e.Reason.Name(name)
	if e.Err != nil {
		msg = e.Err.Error() + ": " + msg
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap returns Err and Cause.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

// Hint is an error followed by words naming fields: Err's message, then Sep and Text.
type Hint struct {
	Err  error
	Sep  string // between the error's message and the words: ": ", " ("
	Text Text
}

// WithHint returns err followed by sep and the words of format and args (fmt's; a Field among
// args stays a field, named as the reader of the message names fields).
func WithHint(err error, sep, format string, args ...any) *Hint {
	return &Hint{Err: err, Sep: sep, Text: reason(format, args)}
}

func (h *Hint) Error() string { return h.Named(goName) }

// Named returns the message with the fields of the hint named by name.
func (h *Hint) Named(name Namer) string { return h.Err.Error() + h.Sep + h.Text.Name(name) }

// Unwrap returns Err.
func (h *Hint) Unwrap() error { return h.Err }

// Walk calls visit for every error in err's tree that implements Named, outermost first.
func Walk(err error, visit func(Named)) {
	if err == nil {
		return
	}
	if n, ok := err.(Named); ok {
		visit(n)
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		Walk(u.Unwrap(), visit)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			Walk(e, visit)
		}
	}
}
