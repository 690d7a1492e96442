package apply

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Conflict describes one conflict: the source change, the local rows it met, and what the
// Applier did about it. Values are as the servers print them (text; binary values as \x hex).
type Conflict struct {
	Type       ConflictType
	Resolution Resolution // what was done: never ResolveDefault or ResolveLastUpdateWins
	// Winner, for ResolveLastUpdateWins, says which side won: "remote" or "local".
	Winner string
	// Relation is the target table, quoted and qualified.
	Relation string

	// The source transaction.
	RemoteXid        uint32
	RemoteFinalLSN   LSN       // its commit LSN
	RemoteCommitTime time.Time // zero while unknown (a transaction applied before its commit arrived)
	RemoteOrigin     string    // the origin of the change as the resolution compares it

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

// message is the first line of the report, PostgreSQL's.
func (c *Conflict) message() string {
	return fmt.Sprintf("conflict detected on relation %q: conflict=%s", unquoteRelation(c.Relation), c.Type)
}

// unquoteRelation turns "s"."t" into s.t, as PostgreSQL prints relations in conflict reports.
func unquoteRelation(q string) string {
	parts, err := parseQualified(q)
	if err != nil {
		return q
	}
	return strings.Join(parts, ".")
}

// detail is the report's DETAIL, in PostgreSQL's words.
func (c *Conflict) detail() string {
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
	if c.Winner != "" {
		b.WriteString(" (" + c.Winner + " change is the last update)")
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

// log writes the report to l: the message at level, with the detail and the report's fields.
func (c *Conflict) log(l *slog.Logger, level slog.Level) {
	attrs := []slog.Attr{
		slog.String("conflict", c.Type.String()),
		slog.String("relation", c.Relation),
		slog.String("resolution", c.Resolution.String()),
		slog.Uint64("remote_xid", uint64(c.RemoteXid)),
		slog.String("detail", c.detail()),
	}
	l.LogAttrs(context.Background(), level, c.message(), attrs...)
}

// logRecord is one row of the conflict log table, as JSON for jsonb_populate_recordset.
type logRecord struct {
	Slot             string          `json:"slot"`
	Conflict         string          `json:"conflict"`
	Relation         string          `json:"relation"`
	Resolution       string          `json:"resolution"`
	RemoteXid        uint32          `json:"remote_xid"`
	RemoteFinalLSN   string          `json:"remote_final_lsn"`
	RemoteCommitTime *time.Time      `json:"remote_commit_ts"`
	RemoteOrigin     *string         `json:"remote_origin"`
	ReplicaIdentity  json.RawMessage `json:"replica_identity"`
	RemoteTuple      json.RawMessage `json:"remote_tuple"`
	LocalConflicts   json.RawMessage `json:"local_conflicts"`
	Note             *string         `json:"note"`
}

// record makes the conflict's row of the log table; values longer than max bytes are replaced
// by {"omitted_bytes": N}.
func (c *Conflict) record(slot string, max int) logRecord {
	r := logRecord{Slot: slot, Conflict: c.Type.String(), Relation: c.Relation, Resolution: c.Resolution.String(),
		RemoteXid: c.RemoteXid, RemoteFinalLSN: c.RemoteFinalLSN.String()}
	if !c.RemoteCommitTime.IsZero() {
		t := c.RemoteCommitTime
		r.RemoteCommitTime = &t
	}
	if c.RemoteOrigin != "" {
		o := c.RemoteOrigin
		r.RemoteOrigin = &o
	}
	if c.Note != "" {
		n := c.Note
		r.Note = &n
	}
	r.ReplicaIdentity = rowJSON(c.Identity, max)
	r.RemoteTuple = rowJSON(c.Remote, max)
	var b bytes.Buffer
	b.WriteByte('[')
	for i, l := range c.Local {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"xid":` + strconv.FormatUint(uint64(l.Xid), 10))
		if !l.CommitTime.IsZero() {
			ts, _ := json.Marshal(l.CommitTime)
			b.WriteString(`,"commit_ts":`)
			b.Write(ts)
		} else {
			b.WriteString(`,"commit_ts":null`)
		}
		if l.Origin != "" {
			o, _ := json.Marshal(l.Origin)
			b.WriteString(`,"origin":`)
			b.Write(o)
		} else {
			b.WriteString(`,"origin":null`)
		}
		if l.Index != "" {
			ix, _ := json.Marshal(l.Index)
			b.WriteString(`,"index":`)
			b.Write(ix)
			b.WriteString(`,"key":`)
			b.Write(rowJSON(l.Key, max))
		}
		if l.Row != nil {
			b.WriteString(`,"tuple":`)
			b.Write(rowJSON(l.Row, max))
		} else {
			b.WriteString(`,"deleted":true`)
		}
		b.WriteByte('}')
	}
	b.WriteByte(']')
	r.LocalConflicts = b.Bytes()
	return r
}

// rowJSON renders a row as a JSON object of its columns' text values (null for NULL, and
// {"omitted_bytes": N} for a value over max bytes), in column order; nil for no row.
func rowJSON(row []ColumnValue, max int) json.RawMessage {
	if row == nil {
		return json.RawMessage("null")
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, c := range row {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(c.Name)
		b.Write(k)
		b.WriteByte(':')
		switch {
		case c.Value == nil:
			b.WriteString("null")
		case len(*c.Value) > max:
			b.WriteString(`{"omitted_bytes":` + strconv.Itoa(len(*c.Value)) + `}`)
		default:
			v, _ := json.Marshal(*c.Value)
			b.Write(v)
		}
	}
	b.WriteByte('}')
	return b.Bytes()
}
