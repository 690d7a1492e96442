package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// minFailoverMajor is the first PostgreSQL major version that keeps logical slots on standbys.
const minFailoverMajor = 17

// checkFailoverVersion refuses Config.Failover on a server that cannot honour it.
func checkFailoverVersion(cfg *Config, major int) error {
	if !cfg.Failover || major >= minFailoverMajor {
		return nil
	}
	return configerr.New(ErrInvalidConfig, field("Failover"), "needs PostgreSQL %d or later, the server is PostgreSQL %d: "+
		"earlier versions keep no logical slot on a standby", minFailoverMajor, major)
}

// enableFailover turns failover on for the session's slot when Config.Failover asks for it and
// the slot was made without it (ALTER_REPLICATION_SLOT, PostgreSQL 17+). The slot must not be in
// use: a *SlotActiveError is returned otherwise, which is retried like START_REPLICATION's.
func enableFailover(ctx context.Context, sess *session, cfg *Config, log *slog.Logger) error {
	if !cfg.Failover || sess.slot == nil || sess.slot.Failover || sess.major < minFailoverMajor {
		return nil
	}
	_, err := query(ctx, sess.conn, "ALTER_REPLICATION_SLOT "+cfg.Slot+" (FAILOVER true)")
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgsession.ObjectInUse {
			e := &SlotActiveError{Slot: cfg.Slot, Cause: err}
			rows, qerr := query(ctx, sess.conn, "SELECT "+pgsession.BackendColumns+" FROM pg_catalog.pg_replication_slots s "+
				"JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = "+pgsession.QuoteLiteral(cfg.Slot))
			if qerr == nil && len(rows) == 1 {
				e.Holder, _ = pgsession.ScanBackend(rows[0])
			}
			return e
		}
		return fmt.Errorf("replication: enabling failover on slot %q (ALTER_REPLICATION_SLOT): %w", cfg.Slot, err)
	}
	sess.slot.Failover = true
	log.Info("enabled failover on the existing slot: a standby with sync_replication_slots on keeps a copy of it",
		"slot", cfg.Slot)
	return nil
}

// failoverProblem is one thing the server lacks for a failover slot to survive a promotion.
type failoverProblem struct {
	setting, problem, fix string
}

// failoverWarnings logs, at Warn, what the server lacks for the slot to survive the promotion of
// a standby: a physical standby streaming through a slot listed in synchronized_standby_slots.
// The standby's own settings (hot_standby_feedback, sync_replication_slots) are not visible from
// the primary; the warnings' fix names them. A primary may have no standby yet, so none of it is
// an error. On a server whose slot is a synchronized copy (a promoted standby) a missing standby
// goes unsaid, as its new standbys may not be set up yet; a slot synchronized_standby_slots lists
// that no standby streams through is still worth a warning there (the setting is often copied
// from the former primary), since logical walsenders wait for it. One query, on the replication
// connection's SQL.
func failoverWarnings(ctx context.Context, conn *pgconn.PgConn, cfg *Config, slot *SlotInfo, log *slog.Logger) {
	promoted := slot != nil && slot.Synced
	if promoted {
		log.Info("the slot is a copy synchronized from a former primary: this server is a promoted standby", "slot", cfg.Slot)
	}
	row, err := queryRow(ctx, conn, "SELECT pg_catalog.pg_is_in_recovery()::text, "+
		"pg_catalog.current_setting('synchronized_standby_slots'), "+
		"coalesce((SELECT pg_catalog.string_agg(slot_name || ' ' || (active_pid IS NOT NULL)::text, ',') "+
		"FROM pg_catalog.pg_replication_slots WHERE slot_type = 'physical'), '')", 3)
	if err != nil {
		log.Warn("could not check the server's settings for failover", "slot", cfg.Slot, "err", err)
		return
	}
	for _, p := range failoverProblems(row[0] == "true", promoted, row[1], row[2]) {
		log.Warn("the slot may not survive a failover: "+p.problem, "slot", cfg.Slot, "setting", p.setting, "fix", p.fix)
	}
}

// standbyFix is how a physical standby is set up to keep copies of failover slots.
const standbyFix = "on the standby: primary_slot_name = a physical slot of this server listed in its synchronized_standby_slots, " +
	"hot_standby_feedback = on, sync_replication_slots = on, and dbname in primary_conninfo"

// failoverProblems reads the failover check's row: whether the server is in recovery, whether it
// is a promoted standby (nothing is said about its missing standbys), its
// synchronized_standby_slots, and its physical slots as "name active" items joined by commas.
func failoverProblems(inRecovery, promoted bool, syncSlots, physical string) []failoverProblem {
	if inRecovery {
		return []failoverProblem{{setting: "pg_is_in_recovery", problem: "the server is a standby: failover slots are kept by the primary",
			fix: "connect to the primary (a connection string that names every server with target_session_attrs=read-write finds it)"}}
	}
	active := map[string]bool{}
	for _, item := range strings.Split(physical, ",") {
		if f := strings.Fields(item); len(f) == 2 {
			active[f[0]] = f[1] == "true"
		}
	}
	var listed []string
	for _, n := range strings.Split(syncSlots, ",") {
		if n = strings.Trim(strings.TrimSpace(n), `"`); n != "" {
			listed = append(listed, n)
		}
	}
	if len(listed) == 0 {
		if promoted {
			return nil
		}
		return []failoverProblem{{setting: "synchronized_standby_slots",
			problem: "synchronized_standby_slots is empty: the consumer may receive changes no standby has yet, which a promoted standby would not have",
			fix:     "ALTER SYSTEM SET synchronized_standby_slots = '<the physical slot of each standby that can be promoted>'; SELECT pg_reload_conf(); " + standbyFix}}
	}
	var out []failoverProblem
	for _, n := range listed {
		on, ok := active[n]
		switch {
		case !ok:
			out = append(out, failoverProblem{setting: "synchronized_standby_slots",
				problem: fmt.Sprintf("synchronized_standby_slots names %q, which is not a physical slot of this server: logical walsenders wait for it", n),
				fix:     "create the standby's slot with SELECT pg_create_physical_replication_slot('" + n + "'), or remove it from synchronized_standby_slots"})
		case !on:
			out = append(out, failoverProblem{setting: "synchronized_standby_slots",
				problem: fmt.Sprintf("no standby streams through slot %q, listed in synchronized_standby_slots: logical walsenders hold changes back until it does", n),
				fix:     "start the standby, or remove its slot from synchronized_standby_slots; " + standbyFix})
		}
	}
	return out
}

// slotLostToFailover is the error for a slot missing on a server of the same system on a later
// timeline: a promoted standby that kept no copy of it.
func slotLostToFailover(cfg *Config, db string, was, now int) error {
	problem := fmt.Sprintf("replication slot %q does not exist on this server, a standby promoted since the stream started "+
		"(timeline %d, then %d): ", cfg.Slot, was, now)
	if !cfg.Failover {
		return checkError(&CheckError{Setting: "slot", Err: ErrSlotNotFound,
			Problem: problem + "the slot was not created for failover, so the standby kept no copy of it, and the changes the consumer has not received are lost"},
			configerr.Words("start again from a fresh copy of the tables, with the slot created in database %q for failover (%s) "+
				"so that it survives the next promotion", db, field("Failover")))
	}
	return checkError(&CheckError{Setting: "slot", Err: ErrSlotNotFound,
		Problem: problem + "the standby had not synchronized it, and the changes the consumer has not received are lost"},
		configerr.Words("start again from a fresh copy of the tables; set the standbys up to keep copies of failover slots (%s; "+
			"on the primary, synchronized_standby_slots) and check that pg_replication_slots shows the slot with synced = true on them", standbyFix))
}
