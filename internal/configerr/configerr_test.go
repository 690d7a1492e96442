package configerr

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

var errInvalid = errors.New("pkg: invalid configuration")

func flagName(f Field) string {
	name := "-" + strings.ToLower(f.Path)
	if v := f.Text(); v != "" {
		name += " " + v
	}
	return name
}

func TestError(t *testing.T) {
	off := Field{Config: "pkg", Path: "Off"}
	cause := errors.New("bad string")
	e := &Error{Field: Field{Config: "pkg", Path: "Table"}, Reason: Words("%q (100%%) needs %s, not %v", "a%b", off, 3),
		Err: errInvalid, Cause: cause}
	if got, want := e.Error(), `pkg: invalid configuration: Table "a%b" (100%) needs Off, not 3: bad string`; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if got, want := e.Named(flagName), `pkg: invalid configuration: -table "a%b" (100%) needs -off, not 3: bad string`; got != want {
		t.Fatalf("Named = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("starting: %w", e)
	if !errors.Is(wrapped, errInvalid) || !errors.Is(wrapped, cause) {
		t.Fatal("errors.Is does not see the sentinel and the cause")
	}
	var ce *Error
	if !errors.As(wrapped, &ce) || ce.Field.Key() != "pkg.Table" {
		t.Fatalf("errors.As: %v", ce)
	}
}

func TestHintAndWalk(t *testing.T) {
	lsn := Field{Config: "pkg", Path: "SkipLSN", Value: "0/10", Arg: "0/10"}
	mode := Field{Config: "pkg", Path: "Mode", Value: "ModeFast", Arg: "fast"}
	h := WithHint(errors.New("stopped"), ": ", "retry with %s or %s", lsn, mode)
	if got, want := h.Error(), "stopped: retry with Config.SkipLSN = 0/10 or Config.Mode = ModeFast"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	err := errors.Join(errors.New("other"), fmt.Errorf("outer: %w", h))
	msg := err.Error()
	Walk(err, func(n Named) { msg = strings.Replace(msg, n.Error(), n.Named(flagName), 1) })
	if want := "other\nouter: stopped: retry with -skiplsn 0/10 or -mode fast"; msg != want {
		t.Fatalf("walked: %q, want %q", msg, want)
	}
}
