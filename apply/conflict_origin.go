package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

// setupConflicts prepares conflict detection and replication origins for a session, on the
// leader's connection: it reads track_commit_timestamp, creates the Applier's origins (the
// leader's and, in Eager and Parallel, one per worker), sets up the leader's, and the tombstone
// store. Things the target cannot do are said once per Applier.
func (s *session) setupConflicts(ctx context.Context) error {
	cfg := s.cfg
	tg := s.leader
	if cfg.Origin != "" {
		names := []string{cfg.Origin}
		if cfg.Mode != Buffered {
			for i := range cfg.Workers {
				names = append(names, workerOrigin(cfg.Origin, i+1))
			}
		}
		var ids []uint32
		for _, n := range names {
			rows, err := query(ctx, tg.conn, `SELECT coalesce(pg_catalog.pg_replication_origin_oid($1),
				pg_catalog.pg_replication_origin_create($1))`, n)
			if isCode(err, "42501") {
				s.a.once("origin", func() {
					s.log.Warn("the target role may not use replication origins: transactions are committed without origin "+
						"(no loop protection, no *_origin_differs detection)", "err", err)
				})
				ids = nil
				break
			}
			if err != nil {
				return fmt.Errorf("apply: creating replication origin %q on the target: %w", n, err)
			}
			id, _ := strconv.ParseUint(string(rows[0][0]), 10, 32)
			ids = append(ids, uint32(id))
		}
		if ids != nil {
			// Rows an initial copy wrote carry the origins of its connections (copyOrigin).
			rows, err := query(ctx, tg.conn, `SELECT roident::text FROM pg_catalog.pg_replication_origin
				WHERE left(roname, length($1) + 2) = $1 || '_c' AND substr(roname, length($1) + 3) ~ '^[0-9]+$'`, cfg.Origin)
			if err != nil {
				return fmt.Errorf("apply: looking up the initial copy's replication origins on the target: %w", err)
			}
			for _, r := range rows {
				id, _ := strconv.ParseUint(string(r[0]), 10, 32)
				ids = append(ids, uint32(id))
			}
			if err := tg.setupOrigin(ctx, cfg.Origin); err != nil {
				return err
			}
			s.ours = ids
		}
	}
	if cfg.Conflicts.Off {
		return nil
	}
	det := &detection{cfg: &cfg.Conflicts, log: s.log}
	if s.ours != nil {
		det.ours, det.origin = s.ours, cfg.Origin
	}
	rows, err := query(ctx, tg.conn, "SELECT pg_catalog.current_setting('track_commit_timestamp')::bool::text")
	if err != nil {
		return fmt.Errorf("apply: reading track_commit_timestamp on the target: %w", err)
	}
	det.trackTS = string(rows[0][0]) == "true"
	if !det.trackTS {
		s.a.once("track_commit_timestamp", func() {
			s.log.Info("track_commit_timestamp is off on the target: update_origin_differs and delete_origin_differs " +
				"are not detected, and last_update_wins takes the source's change as the later")
		})
	} else if det.ours == nil {
		s.a.once("no origin", func() {
			s.log.Info("the Applier has no replication origin (Config.Origin): update_origin_differs and " +
				"delete_origin_differs are not detected")
		})
	}
	if cfg.Conflicts.LogTable != "" {
		sql, err := setupLogTable(ctx, tg, tg.table(cfg.Conflicts.LogTable))
		if err != nil {
			return err
		}
		det.logSQL = sql
	}
	if cfg.Conflicts.Retention > 0 {
		tb, err := newTombstones(ctx, tg, &cfg.Conflicts, cfg.ProgressTable, &s.stats.tombstoneCounters, s.log)
		if err != nil {
			return err
		}
		det.tomb = tb
	}
	s.det = det
	tg.det.detection = det
	return nil
}

// attachConflicts gives a worker's connection the session's detection and origin.
func (s *session) attachConflicts(ctx context.Context, tg *target, worker int) error {
	if s.ours != nil {
		if err := tg.setupOrigin(ctx, workerOrigin(s.cfg.Origin, worker)); err != nil {
			return err
		}
	}
	if s.det != nil && s.det.tomb != nil && !tg.replicaRole {
		// Deletions the worker applies are not local ones (see tombstones).
		if _, err := tg.conn.ExecParams(ctx, "SET pgreorder.applying = on", nil, nil, nil, nil).Close(); err != nil {
			return fmt.Errorf("apply: setting up the target connection: %w", err)
		}
	}
	tg.det.detection = s.det
	return nil
}

func workerOrigin(origin string, worker int) string {
	return origin + "_w" + strconv.Itoa(worker)
}

// copyOrigin names the origin of the initial copy's target connection n (from 1).
func copyOrigin(origin string, n int) string {
	return origin + "_c" + strconv.Itoa(n)
}

// copyOriginSetup makes the transactions of the initial copy's target connection n carry an
// origin of the Applier's, so that the rows it writes count as the Applier's own: an update of
// a copied row is not update_origin_differs.
func (s *session) copyOriginSetup(ctx context.Context, tg *target, n int) error {
	if s.ours == nil {
		return nil
	}
	name := copyOrigin(s.cfg.Origin, n)
	rows, err := query(ctx, tg.conn, `SELECT coalesce(pg_catalog.pg_replication_origin_oid($1),
		pg_catalog.pg_replication_origin_create($1))::text`, name)
	if err != nil {
		return fmt.Errorf("apply: creating replication origin %q on the target: %w", name, err)
	}
	id64, _ := strconv.ParseUint(string(rows[0][0]), 10, 32)
	id := uint32(id64)
	if !slices.Contains(s.ours, id) {
		s.ours = append(s.ours, id)
		if s.det != nil && s.det.ours != nil {
			s.det.ours = append(s.det.ours, id)
		}
	}
	return tg.setupOrigin(ctx, name)
}

// setupOrigin makes the connection's transactions carry the origin name.
func (t *target) setupOrigin(ctx context.Context, name string) error {
	if _, err := query(ctx, t.conn, "SELECT pg_catalog.pg_replication_origin_session_setup($1)", name); err != nil {
		return fmt.Errorf("apply: setting up replication origin %q on the target: %w", name, err)
	}
	t.origin = name
	return nil
}

// originXact queues the origin's transaction setup: the source transaction's end LSN and
// commit time become the target commit's origin LSN and commit timestamp.
func (t *target) originXact(end decoding.LSN) {
	ts := t.det.remote.commitTime
	if ts.IsZero() {
		ts = t.opts.now()
	}
	t.batch.ExecParams("SELECT pg_catalog.pg_replication_origin_xact_setup($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)",
		[][]byte{end.AppendText(nil), []byte(ts.UTC().Format(time.RFC3339Nano))}, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
}

// logColumns are the conflict log table's columns filled from a logRecord.
const logColumns = "slot, conflict, relation, resolution, remote_xid, remote_final_lsn, remote_commit_ts, remote_origin, " +
	"replica_identity, remote_tuple, local_conflicts, note"

// setupLogTable creates the conflict log table (quoted and qualified) if it is missing and
// returns the statement that inserts a JSON array of logRecords into it.
func setupLogTable(ctx context.Context, tg *target, table string) (string, error) {
	_, err := tg.conn.ExecParams(ctx, "CREATE TABLE IF NOT EXISTS "+table+` (
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
func (t *target) queueLogRows() {
	if !t.det.on() || t.det.logSQL == "" || len(t.det.reports) == 0 {
		return
	}
	recs := make([]logRecord, len(t.det.reports))
	for i, c := range t.det.reports {
		recs[i] = logRow(c, t.opts.slot, t.det.cfg.MaxLoggedValue)
	}
	b, err := json.Marshal(recs)
	if err != nil {
		t.log.Warn("conflict log table: encoding the rows", "err", err)
		return
	}
	t.batch.ExecParams(t.det.logSQL, [][]byte{b}, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
}
