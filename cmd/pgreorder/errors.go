package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/replication"
)

// The libraries' errors name the fields of their configurations (Config.Publications,
// CreateSlot, Reconnect.SlotWait...) and pgoutput's option names (slot, proto_version); a user of
// the command knows its flags. explain rewrites an error's message for the command's user: those
// names become flags (fieldFlags, through the errors' types, never their words), a resume
// position beyond the server's WAL is explained in the command's terms, and of pgx's connection
// attempts the refused TLS handshake before the attempt without TLS is left out when that
// attempt failed for a reason of its own (a password, a database).

// flagNamer returns what names a field for the user of command: its flag, when the command has
// one, else the library's name.
func flagNamer(command string) configerr.Namer {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	if register, ok := commandFlags[command]; ok {
		register(fs)
	}
	return func(f configerr.Field) string {
		name := fieldFlags[f.Key()]
		if name == "" || fs.Lookup(strings.TrimPrefix(name, "-")) == nil {
			return f.String()
		}
		switch v, b := f.Text(), isBoolFlag(fs.Lookup(name[1:])); {
		case v != "" && !b:
			return name + " " + v
		case v == "false" && b:
			return name + "=false"
		}
		return name
	}
}

// isBoolFlag says whether f is given without a value.
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// explain returns the message of err as the command's user should read it.
func explain(command string, err error) string {
	msg := err.Error()
	name := flagNamer(command)
	var oe *replication.OptionError
	if errors.As(err, &oe) {
		if flag := name(configerr.Field{Config: "pgoutput", Path: oe.Option}); strings.HasPrefix(flag, "-") {
			var s string
			switch {
			case oe.ServerMajor != 0:
				s = fmt.Sprintf("%s %s is not supported by PostgreSQL %d", flag, oe.Value, oe.ServerMajor)
			case oe.Rule != "":
				s = fmt.Sprintf("%s %q: %s", flag, oe.Value, oe.Rule)
			default:
				s = fmt.Sprintf("%s %q is not valid", flag, oe.Value)
			}
			msg = strings.Replace(msg, oe.Error(), s, 1)
		}
	}
	var ce *replication.CheckError
	if errors.As(err, &ce) && errors.Is(ce.Err, replication.ErrResumeAhead) {
		var s string
		switch command {
		case "stream":
			s = "the resume position (-resume, or FILE.pos with -o) is beyond the server's current WAL position: " +
				"it does not come from this server (or the server was restored from a backup); " +
				"with -o, move FILE and FILE.pos away to start at the slot's position; without, leave -resume out or give the end_lsn " +
				"of the last transaction you have from this server (" + ce.Problem + ")"
		case "apply":
			s = "the target's progress row for the slot is beyond the source's current WAL position: the target was " +
				"replicated from another server (or the source was restored from a backup); check -source and -target, or delete " +
				"the slot's row from the progress table (-progress-table) to start at the slot's position (" + ce.Problem + ")"
		}
		if s != "" {
			msg = strings.Replace(msg, ce.Error(), s, 1)
		}
	}
	configerr.Walk(err, func(e configerr.Named) {
		msg = strings.Replace(msg, e.Error(), e.Named(name), 1)
	})
	return pgsession.TidyConnectError(msg, err)
}
