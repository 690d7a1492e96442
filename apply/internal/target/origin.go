package target

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

// SetupOrigin makes the connection's transactions carry the origin name.
func (t *Conn) SetupOrigin(ctx context.Context, name string) error {
	if _, err := Query(ctx, t.PG, "SELECT pg_catalog.pg_replication_origin_session_setup($1)", name); err != nil {
		return fmt.Errorf("apply: setting up replication origin %q on the target: %w", name, err)
	}
	t.Origin = name
	return nil
}

// originXact queues the origin's transaction setup: the source transaction's end LSN and
// commit time become the target commit's origin LSN and commit timestamp.
func (t *Conn) originXact(end decoding.LSN) {
	ts := t.det.remote.commitTime
	if ts.IsZero() {
		ts = t.opts.Now()
	}
	t.batch.ExecParams("SELECT pg_catalog.pg_replication_origin_xact_setup($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)",
		[][]byte{end.AppendText(nil), []byte(ts.UTC().Format(time.RFC3339Nano))}, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
}

// logColumns are the conflict log table's columns filled from a logRecord.
const logColumns = "slot, conflict, relation, resolution, remote_xid, remote_final_lsn, remote_commit_ts, remote_origin, " +
	"replica_identity, remote_tuple, local_conflicts, note"

// SetupLogTable creates the conflict log table (quoted and qualified) if it is missing and
// returns the statement that inserts a JSON array of logRecords into it.
func SetupLogTable(ctx context.Context, tg *Conn, table string) (string, error) {
	_, err := tg.PG.ExecParams(ctx, "CREATE TABLE IF NOT EXISTS "+table+` (
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
	if err != nil && !isCode(err, "42P07") {
		return "", fmt.Errorf("apply: creating the conflict log table %s: %w", table, err)
	}
	return "INSERT INTO " + table + " (" + logColumns + ") SELECT " + logColumns +
		" FROM pg_catalog.jsonb_populate_recordset(NULL::" + table + ", $1::jsonb)", nil
}

// queueLogRows queues the rows of the transaction's conflicts into the log table, in the
// transaction that resolved them.
func (t *Conn) queueLogRows() {
	if !t.det.on() || t.det.LogSQL == "" || len(t.det.reports) == 0 {
		return
	}
	recs := make([]logRecord, len(t.det.reports))
	for i, c := range t.det.reports {
		recs[i] = logRow(c, t.opts.Slot, t.det.Config.MaxLoggedValue)
	}
	b, err := json.Marshal(recs)
	if err != nil {
		t.log.Warn("conflict log table: encoding the rows", "err", err)
		return
	}
	t.batch.ExecParams(t.det.LogSQL, [][]byte{b}, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
}
