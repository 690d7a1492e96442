package apply

import (
	"context"
	"fmt"
	"strconv"
	"time"
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
	if cfg.Conflicts.Retention > 0 {
		tb, err := newTombstones(ctx, tg, cfg, s.stats, s.log)
		if err != nil {
			return err
		}
		det.tomb = tb
	}
	s.det = det
	tg.det = det
	return nil
}

// attachConflicts gives a worker's connection the session's detection and origin.
func (s *session) attachConflicts(ctx context.Context, tg *target, worker int) error {
	if s.ours != nil {
		if err := tg.setupOrigin(ctx, workerOrigin(s.cfg.Origin, worker)); err != nil {
			return err
		}
	}
	tg.det = s.det
	return nil
}

func workerOrigin(origin string, worker int) string {
	return origin + "_w" + strconv.Itoa(worker)
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
func (t *target) originXact(end LSN) {
	ts := t.remote.commitTime
	if ts.IsZero() {
		ts = time.Now()
	}
	t.batch.ExecParams("SELECT pg_catalog.pg_replication_origin_xact_setup($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)",
		[][]byte{end.AppendText(nil), []byte(ts.UTC().Format(time.RFC3339Nano))}, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
}
