package detect

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// LogConflict writes the report to l: the message at level, with the detail and the report's fields.
func LogConflict(c *conflict.Report, l *slog.Logger, level slog.Level) {
	attrs := []slog.Attr{
		slog.String("conflict", c.Type.String()),
		slog.String("relation", c.Relation),
		slog.String("resolution", c.Resolution.String()),
		slog.Uint64("remote_xid", uint64(c.RemoteXid)),
		slog.String("detail", c.Detail()),
	}
	l.LogAttrs(context.Background(), level, c.Message(), attrs...)
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

// logRow makes the conflict's row of the log table; values longer than max bytes are replaced
// by {"omitted_bytes": N}.
func logRow(c *conflict.Report, slot string, max int) logRecord {
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
func rowJSON(row []conflict.ColumnValue, max int) json.RawMessage {
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

// logColumns are the conflict log table's columns filled from a logRecord.
const logColumns = "slot, conflict, relation, resolution, remote_xid, remote_final_lsn, remote_commit_ts, remote_origin, " +
	"replica_identity, remote_tuple, local_conflicts, note"

// SetupLogTable creates the conflict log table (quoted and qualified) if it is missing and
// returns the statement that inserts a JSON array of logRecords into it.
func SetupLogTable(ctx context.Context, conn *pgconn.PgConn, table string) (string, error) {
	_, err := conn.ExecParams(ctx, "CREATE TABLE IF NOT EXISTS "+table+` (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	logged_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	slot text NOT NULL,
	conflict text NOT NULL,
	relation text NOT NULL,
	resolution text NOT NULL,
	remote_xid bigint NOT NULL,
	remote_final_lsn pg_lsn,
	remote_commit_ts timestamptz,
	remote_origin text,
	replica_identity jsonb,
	remote_tuple jsonb,
	local_conflicts jsonb,
	note text)`, nil, nil, nil, nil).Close()
	if err != nil && !pgsession.IsCode(err, pgsession.DuplicateTable) {
		return "", fmt.Errorf("apply: creating the conflict log table %s: %w", table, err)
	}
	return "INSERT INTO " + table + " (" + logColumns + ") SELECT " + logColumns +
		" FROM pg_catalog.jsonb_populate_recordset(NULL::" + table + ", $1::jsonb)", nil
}

// LogRows returns the rows of reports for the log table's insert (SetupLogTable's), for slot;
// values longer than max bytes are left out.
func LogRows(reports []*conflict.Report, slot string, max int) ([]byte, error) {
	recs := make([]logRecord, len(reports))
	for i, c := range reports {
		recs[i] = logRow(c, slot, max)
	}
	return json.Marshal(recs)
}
