package apply

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/pgsession"
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
			id, err := tg.CreateOrigin(ctx, n)
			if pgsession.IsCode(err, pgsession.InsufficientPrivilege) {
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
			ids = append(ids, id)
		}
		if ids != nil {
			// Rows an initial copy wrote carry the origins of its connections (copyOrigin).
			copies, err := tg.CopyOrigins(ctx, cfg.Origin)
			if err != nil {
				return err
			}
			ids = append(ids, copies...)
			if err := tg.SetupOrigin(ctx, cfg.Origin); err != nil {
				return err
			}
			s.ours = ids
		}
	}
	if cfg.Conflicts.Off {
		return nil
	}
	det := &detect.Detection{Config: &cfg.Conflicts, Log: s.log}
	if s.ours != nil {
		det.Ours, det.Origin = s.ours, cfg.Origin
	}
	var err error
	if det.TrackTS, err = tg.TrackCommitTimestamp(ctx); err != nil {
		return err
	}
	if !det.TrackTS && (det.Ours != nil || lastUpdateWins(&cfg.Conflicts)) {
		// Said where it matters: an origin to tell changes apart by, or a resolution by time.
		s.a.once("track_commit_timestamp", func() {
			s.log.Info("track_commit_timestamp is off on the target: update_origin_differs and delete_origin_differs " +
				"are not detected, and last_update_wins takes the source's change as the later")
		})
	} else if det.TrackTS && det.Ours == nil {
		s.a.once("no origin", func() {
			s.log.Info("the Applier has no replication origin (Config.Origin): update_origin_differs and " +
				"delete_origin_differs are not detected")
		})
	}
	if cfg.Conflicts.LogTable != "" {
		sql, err := detect.SetupLogTable(ctx, tg.PG(), tg.Table(cfg.Conflicts.LogTable))
		if err != nil {
			return err
		}
		det.LogSQL = sql
	}
	if cfg.Conflicts.Retention > 0 {
		tb, err := target.NewTombstones(ctx, tg, &cfg.Conflicts, cfg.ProgressTable, &s.stats.TombstoneCounters, s.log)
		if err != nil {
			return configErr(err)
		}
		det.Tomb = tb
	}
	s.det = det
	tg.SetDetection(det)
	return nil
}

// attachConflicts gives a worker's connection the session's detection and origin.
func (s *session) attachConflicts(ctx context.Context, tg *target.Conn, worker int) error {
	if s.ours != nil {
		if err := tg.SetupOrigin(ctx, workerOrigin(s.cfg.Origin, worker)); err != nil {
			return err
		}
	}
	if s.det != nil && s.det.Tomb != nil && !tg.ReplicaRole() {
		// Deletions the worker applies are not local ones (see tombstones).
		if _, err := tg.PG().ExecParams(ctx, "SET pgreorder.applying = on", nil, nil, nil, nil).Close(); err != nil {
			return fmt.Errorf("apply: setting up the target connection: %w", err)
		}
	}
	tg.SetDetection(s.det)
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
func (s *session) copyOriginSetup(ctx context.Context, tg *target.Conn, n int) error {
	if s.ours == nil {
		return nil
	}
	name := copyOrigin(s.cfg.Origin, n)
	id, err := tg.CreateOrigin(ctx, name)
	if err != nil {
		return fmt.Errorf("apply: creating replication origin %q on the target: %w", name, err)
	}
	if !slices.Contains(s.ours, id) {
		s.ours = append(s.ours, id)
		if s.det != nil && s.det.Ours != nil {
			s.det.Ours = append(s.det.Ours, id)
		}
	}
	return tg.SetupOrigin(ctx, name)
}
