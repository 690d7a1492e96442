package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// durationFlag is a time.Duration flag that also takes a bare number, in seconds (as
// PostgreSQL's settings of that unit do): -status-interval 10 is 10s.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		*f.d = time.Duration(n * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 10s, 500ms or 2m (a bare number is in seconds)")
	}
	*f.d = d
	return nil
}

// durationVar defines a durationFlag.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(durationFlag{p}, name, usage)
}

// cliSlotWait turns -slot-wait into the libraries' SlotWait: 0 there means the default, here it
// means not waiting.
func cliSlotWait(d time.Duration) time.Duration {
	if d == 0 {
		return time.Nanosecond
	}
	return d
}

// errUsage is wrapped by the errors of a command line that cannot be run as it is: main exits
// with status 2 for them, 1 for other errors, and 0 after -h.
var errUsage = errors.New("usage")

// usageError is a command line's error: a flag that does not parse, a missing argument.
type usageError struct{ err error }

func (e *usageError) Error() string   { return e.err.Error() }
func (e *usageError) Unwrap() []error { return []error{e.err, errUsage} }

// parseFlags parses args with fs. Asked for help (-h, -help), it prints the usage on stdout
// and returns flag.ErrHelp; for a flag that does not parse it returns a usageError that says so
// once (not followed by the whole usage) and points to -h.
func parseFlags(fs *flag.FlagSet, args []string) error {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(os.Stderr)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		os.Stdout.Write(buf.Bytes())
		return flag.ErrHelp
	}
	return &usageError{fmt.Errorf("%w (see pgreorder %s -h)", err, fs.Name())}
}

// syncCommitFlag is -synchronous-commit: a boolean flag (given alone it is on) that also takes
// PostgreSQL's spellings of on and off, and explains the levels it does not take.
type syncCommitFlag struct{ on *bool }

func (f syncCommitFlag) IsBoolFlag() bool { return true }

func (f syncCommitFlag) String() string {
	if f.on == nil || !*f.on {
		return "false"
	}
	return "true"
}

func (f syncCommitFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "true", "on", "1", "yes":
		*f.on = true
	case "false", "off", "0", "no":
		*f.on = false
	case "local", "remote_write", "remote_apply":
		return fmt.Errorf("%s is not taken here: the flag is on or off (on: each commit waits as the target's "+
			"synchronous_commit says); for %s, set it for the target role (ALTER ROLE ... SET synchronous_commit = %s) "+
			"or in -target (options='-c synchronous_commit=%s'), and pass -synchronous-commit", s, s, s, s)
	default:
		return fmt.Errorf("want on or off (or true or false)")
	}
	return nil
}
