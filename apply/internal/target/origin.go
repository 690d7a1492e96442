package target

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
)

// SetupOrigin makes the connection's transactions carry the origin name.
func (t *Conn) SetupOrigin(ctx context.Context, name string) error {
	if _, err := Query(ctx, t.pg, "SELECT pg_catalog.pg_replication_origin_session_setup($1)", name); err != nil {
		return fmt.Errorf("apply: setting up replication origin %q on the target: %w", name, err)
	}
	t.origin = name
	return nil
}

// originXact queues the origin's transaction setup: the source transaction's end LSN and
// commit time become the target commit's origin LSN and commit timestamp.
func (t *Conn) originXact(end decoding.LSN) {
	ts := t.det.Remote.CommitTime
	if ts.IsZero() {
		ts = t.opts.Now()
	}
	t.batch.ExecParams("SELECT pg_catalog.pg_replication_origin_xact_setup($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)",
		[][]byte{end.AppendText(nil), []byte(ts.UTC().Format(time.RFC3339Nano))}, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
}

// queueLogRows queues the rows of the transaction's conflicts into the log table, in the
// transaction that resolved them.
func (t *Conn) queueLogRows() {
	if !t.det.On() || t.det.LogSQL == "" || len(t.det.Reports) == 0 {
		return
	}
	b, err := detect.LogRows(t.det.Reports, t.opts.Slot, t.det.Config.MaxLoggedValue)
	if err != nil {
		t.log.Warn("conflict log table: encoding the rows", "err", err)
		return
	}
	t.batch.ExecParams(t.det.LogSQL, [][]byte{b}, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
}

// CreateOrigin returns the id of the replication origin name, created if it is missing. The
// server's error is returned as it is (42501: the role may not use replication origins).
func (t *Conn) CreateOrigin(ctx context.Context, name string) (uint32, error) {
	rows, err := Query(ctx, t.pg, `SELECT coalesce(pg_catalog.pg_replication_origin_oid($1),
		pg_catalog.pg_replication_origin_create($1))::text`, name)
	if err != nil {
		return 0, err
	}
	id, _ := strconv.ParseUint(string(rows[0][0]), 10, 32)
	return uint32(id), nil
}

// CopyOrigins returns the ids of the origins of the initial copy's connections of origin (its
// name, "_c" and a number), which the rows an initial copy wrote carry.
func (t *Conn) CopyOrigins(ctx context.Context, origin string) ([]uint32, error) {
	rows, err := Query(ctx, t.pg, `SELECT roident::text FROM pg_catalog.pg_replication_origin
		WHERE left(roname, length($1) + 2) = $1 || '_c' AND substr(roname, length($1) + 3) ~ '^[0-9]+$'`, origin)
	if err != nil {
		return nil, fmt.Errorf("apply: looking up the initial copy's replication origins on the target: %w", err)
	}
	ids := make([]uint32, 0, len(rows))
	for _, r := range rows {
		id, _ := strconv.ParseUint(string(r[0]), 10, 32)
		ids = append(ids, uint32(id))
	}
	return ids, nil
}

// TrackCommitTimestamp says whether the target keeps commit timestamps (track_commit_timestamp).
func (t *Conn) TrackCommitTimestamp(ctx context.Context) (bool, error) {
	rows, err := Query(ctx, t.pg, "SELECT pg_catalog.current_setting('track_commit_timestamp')::bool::text")
	if err != nil {
		return false, fmt.Errorf("apply: reading track_commit_timestamp on the target: %w", err)
	}
	return string(rows[0][0]) == "true", nil
}
