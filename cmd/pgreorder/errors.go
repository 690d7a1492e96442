package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/replication"
)

// The libraries' errors name the fields of their configurations (Config.Publications,
// CreateSlot, Reconnect.SlotWait...) and pgoutput's option names (slot, proto_version); a user of
// the command knows its flags. explain rewrites an error's message for the command's user: those
// names become flags, a resume position beyond the server's WAL is explained in the command's
// terms, and of pgx's connection attempts the refused TLS handshake before the attempt without
// TLS is left out when that attempt failed for a reason of its own (a password, a database).

// rename is one library name and the flag it is in a command.
type rename struct {
	re   *regexp.Regexp
	flag string
}

// renames makes the renames of name, flag pairs; a name matches as whole words.
func renames(pairs ...string) []rename {
	word := regexp.MustCompile(`^\w|\w$`)
	var out []rename
	for i := 0; i < len(pairs); i += 2 {
		name := pairs[i]
		expr := regexp.QuoteMeta(name)
		if word.MatchString(name[:1]) {
			expr = `\b` + expr
		}
		if word.MatchString(name[len(name)-1:]) {
			expr += `\b`
		}
		out = append(out, rename{regexp.MustCompile(expr), pairs[i+1]})
	}
	return out
}

// commonRenames are the replication package's names, in both commands (longest first).
var commonRenames = renames(
	"Config.Publications", "-publication",
	"Reconnect.SlotWait", "-slot-wait",
	"set CreateSlot", "pass -create-slot",
	"CreateSlot", "-create-slot",
	"StatusInterval", "-status-interval",
)

// fieldRenames are each command's own.
var fieldRenames = map[string][]rename{
	"stream": renames(
		"Buffer.WorkMem", "-work-mem",
	),
	"apply": renames(
		"Config.SkipLSN = ", "-skip-lsn ",
		"Config.SkipLSN", "-skip-lsn",
		"Config.SchemaChanges = SchemaAddColumns", "-schema-changes add-columns",
		"Config.SyncSequences", "-sync-sequences",
		"Conflicts.Retention", "-conflict-retention",
		"Conflicts.LogTable", "-conflict-log-table",
		"Off is set", "-no-conflict-detection is given",
		"Retention", "-conflict-retention",
		"LogTable", "-conflict-log-table",
		"OriginFilter", "-origin-filter",
		"ProgressTable", "-progress-table",
		"CopyWorkers", "-copy-workers",
		"CopyTruncate", "-copy-truncate",
		"Workers", "-workers",
		"WorkMem", "-work-mem",
		"SlotWait", "-slot-wait",
		"Source is required", "-source is required",
		"Target is required", "-target is required",
		"Source: ", "-source: ",
		"Target: ", "-target: ",
	),
}

// optionFlags maps pgoutput's option names, as replication.OptionError gives them, to flags.
var optionFlags = map[string]map[string]string{
	"stream": {"slot": "-slot", "publication_names": "-publication", "proto_version": "-proto", "streaming": "-streaming",
		"origin": "-origin-filter", "two_phase": "-two-phase", "binary": "-binary", "messages": "-messages"},
	"apply": {"slot": "-slot", "publication_names": "-publication", "origin": "-origin-filter", "binary": "-binary"},
}

// explain returns the message of err as the command's user should read it.
func explain(command string, err error) string {
	msg := err.Error()
	var oe *replication.OptionError
	if errors.As(err, &oe) {
		if flag, ok := optionFlags[command][oe.Option]; ok {
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
	msg = pgsession.TidyConnectError(msg, err)
	for _, rs := range [][]rename{fieldRenames[command], commonRenames} {
		for _, r := range rs {
			msg = r.re.ReplaceAllLiteralString(msg, r.flag)
		}
	}
	return msg
}
