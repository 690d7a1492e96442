package target

import (
	"context"
	"fmt"
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
