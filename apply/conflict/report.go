package conflict

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgreorder/pgreorder/decoding"
)

// Report describes one conflict: the source change, the local rows it met, and what the Applier
// did about it. Values are as the servers print them (text; binary values as \x hex).
type Report struct {
	Type       Type
	Resolution Resolution // what was done: Error, Skip or ApplyRemote
	// Winner, for LastUpdateWins, says which side won (Resolution is then ApplyRemote or Skip).
	Winner Winner
	// Relation is the target table, quoted and qualified.
	Relation string

	// The source transaction.
	RemoteXid        uint32
	RemoteFinalLSN   decoding.LSN // its commit LSN
	RemoteCommitTime time.Time    // zero while unknown (a transaction applied before its commit arrived)
	RemoteOrigin     string       // the origin of the change as the resolution compares it

	// Identity is the replica identity of the row the UPDATE or DELETE named (every column
	// with REPLICA IDENTITY FULL: IdentityFull), nil for an INSERT.
	Identity     []ColumnValue
	IdentityFull bool
	// Remote is the source's new row (INSERT, UPDATE): the columns sent.
	Remote []ColumnValue
	// Local are the conflicting local rows: for *_exists one per unique index violated, for
	// *_origin_differs the row found, for update_deleted the deletion (Row empty).
	Local []LocalRow
	// Note says why the resolution could not do what it says, if it could not (an UPDATE
	// turned into an INSERT without every column of the row, say).
	Note string
}

// Winner says which side's change LastUpdateWins kept.
type Winner int

const (
	NoWinner   Winner = iota // the resolution is not LastUpdateWins
	RemoteWins               // the source's change is later: applied
	LocalWins                // the local rows are later: kept
)

// String returns "remote", "local", or "" for NoWinner.
func (w Winner) String() string {
	switch w {
	case RemoteWins:
		return "remote"
	case LocalWins:
		return "local"
	case NoWinner:
		return ""
	}
	return fmt.Sprintf("Winner(%d)", int(w))
}

// ColumnValue is one column of a row in a conflict report. Value is nil for NULL.
type ColumnValue struct {
	Name  string
	Value *string
}

// LocalRow is a target row a conflict involves.
type LocalRow struct {
	Index      string        // the unique index (for *_exists and multiple_unique_conflicts)
	Key        []ColumnValue // the index's key values (for *_exists)
	Xid        uint32        // the transaction that last changed (or deleted) it
	CommitTime time.Time     // its commit timestamp (zero without track_commit_timestamp)
	Origin     string        // its replication origin: "" for a local change
	Row        []ColumnValue // the row (empty for a deletion)
}

// maxReportedValue is how much of a value a log line shows, as PostgreSQL's conflict reports
// (ExecBuildSlotValueDescription's 64 bytes); longer values end in "...".
const maxReportedValue = 64

// Message is the first line of the report, PostgreSQL's.
func (c *Report) Message() string {
	return fmt.Sprintf("conflict detected on relation %q: conflict=%s", unquoteRelation(c.Relation), c.Type)
}

// unquoteRelation turns "s"."t" into s.t, as PostgreSQL prints relations in conflict reports.
// A name not in that form is returned as it is.
func unquoteRelation(q string) string {
	var parts []string
	for rest := q; ; {
		if !strings.HasPrefix(rest, `"`) {
			return q
		}
		var part strings.Builder
		i := 1
		for {
			j := strings.IndexByte(rest[i:], '"')
			if j < 0 {
				return q
			}
			part.WriteString(rest[i : i+j])
			i += j + 1
			if !strings.HasPrefix(rest[i:], `"`) {
				break
			}
			part.WriteByte('"') // a doubled quote
			i++
		}
		parts, rest = append(parts, part.String()), rest[i:]
		if rest == "" {
			return strings.Join(parts, ".")
		}
		if rest[0] != '.' {
			return q
		}
		rest = rest[1:]
	}
}

// Detail is the report's DETAIL, in PostgreSQL's words.
func (c *Report) Detail() string {
	var b strings.Builder
	remote := describe("remote row", c.Remote, false)
	ident := ""
	if c.Identity != nil {
		if c.IdentityFull {
			ident = describe("replica identity full", c.Identity, false)
		} else {
			ident = describe("replica identity", c.Identity, true)
		}
	}
	joined := func(parts ...string) string {
		var out []string
		for _, p := range parts {
			if p != "" {
				out = append(out, p)
			}
		}
		return strings.Join(out, ", ")
	}
	// by says who changed a local row: "modified locally in transaction 740 at ...", "modified
	// by origin "x" in transaction ..." (by "a different origin" when different is set).
	by := func(l LocalRow, what string, different bool) string {
		at := ""
		if !l.CommitTime.IsZero() {
			at = " at " + pgTime(l.CommitTime)
		}
		switch {
		case l.Origin == "" && l.CommitTime.IsZero():
			return fmt.Sprintf("%s in transaction %d", what, l.Xid)
		case l.Origin == "":
			return fmt.Sprintf("%s locally in transaction %d%s", what, l.Xid, at)
		case different:
			return fmt.Sprintf("%s by a different origin %q in transaction %d%s", what, l.Origin, l.Xid, at)
		default:
			return fmt.Sprintf("%s by origin %q in transaction %d%s", what, l.Origin, l.Xid, at)
		}
	}
	switch c.Type {
	case InsertExists, UpdateExists, MultipleUniqueConflicts:
		if s := joined(remote, ident); s != "" {
			fmt.Fprintf(&b, "Could not apply remote change: %s.", s)
		} else {
			b.WriteString("Could not apply remote change.")
		}
		for _, l := range c.Local {
			fmt.Fprintf(&b, "\nKey already exists in unique index %q, %s", l.Index, by(l, "modified", false))
			if s := joined(describe("key", l.Key, true), describe("local row", l.Row, false)); s != "" {
				b.WriteString(": " + s)
			}
			b.WriteString(".")
		}
	case UpdateOriginDiffers, DeleteOriginDiffers:
		verb := "Updating"
		if c.Type == DeleteOriginDiffers {
			verb = "Deleting"
		}
		for i, l := range c.Local {
			if i > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "%s the row that was %s", verb, by(l, "modified", true))
			if s := joined(describe("local row", l.Row, false), remote, ident); s != "" {
				b.WriteString(": " + s)
			}
			b.WriteString(".")
		}
	case UpdateDeleted:
		if s := joined(remote, ident); s != "" {
			fmt.Fprintf(&b, "Could not find the row to be updated: %s.", s)
		} else {
			b.WriteString("Could not find the row to be updated.")
		}
		for _, l := range c.Local {
			b.WriteString("\nThe row to be updated was " + by(l, "deleted", true) + ".")
		}
	case UpdateMissing:
		if s := joined(remote, ident); s != "" {
			fmt.Fprintf(&b, "Could not find the row to be updated: %s.", s)
		} else {
			b.WriteString("Could not find the row to be updated.")
		}
	case DeleteMissing:
		if ident != "" {
			fmt.Fprintf(&b, "Could not find the row to be deleted: %s.", ident)
		} else {
			b.WriteString("Could not find the row to be deleted.")
		}
	}
	fmt.Fprintf(&b, "\nSource transaction %d", c.RemoteXid)
	if c.RemoteFinalLSN != 0 {
		fmt.Fprintf(&b, " finished at %s", c.RemoteFinalLSN)
	}
	if !c.RemoteCommitTime.IsZero() {
		fmt.Fprintf(&b, ", committed at %s", pgTime(c.RemoteCommitTime))
	}
	if c.RemoteOrigin != "" {
		fmt.Fprintf(&b, " (origin %q)", c.RemoteOrigin)
	}
	b.WriteString("; resolution " + c.Resolution.String())
	if c.Winner != NoWinner {
		b.WriteString(" (" + c.Winner.String() + " change is the last update)")
	}
	if c.Note != "" {
		b.WriteString(": " + c.Note)
	}
	b.WriteString(".")
	return b.String()
}

// pgTime prints a timestamp as PostgreSQL's timestamptz output does with DateStyle ISO in UTC.
func pgTime(t time.Time) string {
	return t.UTC().Format("2006-01-02 15:04:05.999999-07")
}

// describe renders a row as PostgreSQL's conflict reports do: "label (a, b)=(1, x)" with
// names, or "label (1, x)" without; each value cut at maxReportedValue bytes.
func describe(label string, row []ColumnValue, names bool) string {
	if len(row) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(label + " ")
	if names {
		b.WriteByte('(')
		for i, c := range row {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(c.Name)
		}
		b.WriteString(")=")
	}
	b.WriteByte('(')
	for i, c := range row {
		if i > 0 {
			b.WriteString(", ")
		}
		if c.Value == nil {
			b.WriteString("null")
			continue
		}
		b.WriteString(cut(*c.Value, maxReportedValue))
	}
	b.WriteByte(')')
	return b.String()
}

// cut shortens s to at most n bytes (on a character boundary), with "..." when it was longer.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// StopError is the cause of the error of a conflict that stopped apply.Run (resolution Error).
type StopError struct {
	Report *Report
	// Hint, printed at the end of the error, says how to get past the conflict in terms of
	// apply.Config (see Resolutions). A program with options of its own may replace it with
	// its words before printing the error.
	Hint string
}

func (e *StopError) Error() string {
	s := e.Report.Message() + ": " + e.Report.Detail()
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

// Resolutions returns the resolutions of the conflict's type that would get past it, the one
// that applies the source change first: ApplyRemote and Skip (for delete_missing, where there
// is nothing to apply, Skip).
func (e *StopError) Resolutions() []Resolution {
	if e.Report.Type == DeleteMissing {
		return []Resolution{Skip}
	}
	return []Resolution{ApplyRemote, Skip}
}
