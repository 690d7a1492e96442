package apply

import (
	"context"
	"fmt"
	"strconv"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// UninstallOptions says what Uninstall removes besides the tombstone store. The zero value
// removes the tombstone store only.
type UninstallOptions struct {
	// Progress deletes the slot's rows from the progress table (Config.ProgressTable), from
	// its copy table and from its ahead table (relaxed commit order), and drops each of them once
	// no slot has a row in it. A later Run
	// starts from the slot's position on the source, or, with Config.Copy, copies again.
	Progress bool
	// Origins drops the Applier's replication origins on the target: Config.Origin and those of
	// its workers and of its initial copy's connections.
	Origins bool
}

// Uninstall removes from the target what the Applier created there for update_deleted
// detection (conflict.Config.Retention): the tombstone trigger of every table, the trigger
// function and the tombstone table; and, as opts says, the slot's progress and the Applier's
// replication origins. It fails with ErrSlotInUse while an Applier of the slot runs. The
// tombstone store is shared by the Appliers whose tombstone table is the same one: one of
// them that runs creates it again. Nothing on the source is touched: drop the slot there
// (pg_drop_replication_slot) when the Applier is retired.
func (a *Applier) Uninstall(ctx context.Context, opts UninstallOptions) error {
	cfg := &a.cfg
	tg, err := target.Dial(ctx, cfg.targetOptions(), "pgreorder apply "+cfg.Slot+" uninstall")
	if err != nil {
		return configErr(err)
	}
	conn := tg.PG()
	defer conn.Close(context.WithoutCancel(ctx))
	exec := func(sql string, args ...string) error {
		_, err := target.Query(ctx, conn, sql, args...)
		return err
	}
	// A running Applier of the slot holds its lead lock, keyed by the source system: the system
	// of the slot's progress row, or else the source's own (an Applier still in its initial copy
	// has no progress row yet).
	system, err := progressSystem(ctx, tg, cfg)
	if err != nil {
		return fmt.Errorf("apply: uninstall: %w", err)
	}
	if system == "" {
		sys, _, err := identifySource(ctx, cfg)
		if err != nil {
			return fmt.Errorf("apply: uninstall: identifying the source system (to find a running Applier of the slot): %w", err)
		}
		system = sys.ID
	}
	lead, _ := fenceKeys(system, cfg.Slot)
	rows, err := target.Query(ctx, conn, "SELECT pg_catalog.pg_try_advisory_lock($1::pg_catalog.int8)::pg_catalog.text", strconv.FormatInt(lead, 10))
	if err != nil {
		return fmt.Errorf("apply: uninstall: locking the slot's progress on the target: %w", err)
	}
	if string(rows[0][0]) != "true" {
		return fmt.Errorf("%w: slot %q: stop it first", ErrSlotInUse, cfg.Slot)
	}

	table, fn, _ := target.TombstoneNames(tg, cfg.Conflicts.TombstoneTable, cfg.ProgressTable)
	if err := exec("BEGIN"); err != nil {
		return fmt.Errorf("apply: uninstall: %w", err)
	}
	rollback := func(err error) error {
		conn.ExecParams(context.WithoutCancel(ctx), "ROLLBACK", nil, nil, nil, nil).Close()
		return fmt.Errorf("apply: uninstall: %w", err)
	}
	rows, err = target.Query(ctx, conn, `SELECT n.nspname, c.relname FROM pg_catalog.pg_trigger t
		JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE t.tgfoid = pg_catalog.to_regprocedure($1) AND t.tgname = $2`, fn+"()", detect.TombstoneTrigger)
	if err != nil {
		return rollback(fmt.Errorf("listing the tombstone triggers: %w", err))
	}
	for _, r := range rows {
		rel := pgsession.QuoteQualified(string(r[0]), string(r[1]))
		if err := exec("DROP TRIGGER IF EXISTS " + pgsession.QuoteIdent(detect.TombstoneTrigger) + " ON " + rel); err != nil {
			return rollback(fmt.Errorf("dropping the tombstone trigger of %s: %w", rel, err))
		}
	}
	if err := exec("DROP FUNCTION IF EXISTS " + fn + "()"); err != nil {
		return rollback(fmt.Errorf("dropping the tombstone function %s: %w", fn, err))
	}
	if err := exec("DROP TABLE IF EXISTS " + table); err != nil {
		return rollback(fmt.Errorf("dropping the tombstone table %s: %w", table, err))
	}
	if opts.Progress {
		progress := tg.Table(cfg.ProgressTable)
		for _, t := range []string{progress, companionTable(progress, "_copy"), companionTable(progress, "_ahead")} {
			rows, err := target.Query(ctx, conn, "SELECT (pg_catalog.to_regclass($1) IS NOT NULL)::pg_catalog.text", t)
			if err != nil {
				return rollback(err)
			}
			if string(rows[0][0]) != "true" {
				continue
			}
			// Locked: an Applier of another slot that writes a row meanwhile keeps the table.
			if err := exec("LOCK TABLE " + t + " IN ACCESS EXCLUSIVE MODE"); err != nil {
				return rollback(err)
			}
			if err := exec("DELETE FROM "+t+" WHERE slot = $1", cfg.Slot); err != nil {
				return rollback(fmt.Errorf("deleting the slot's rows from %s: %w", t, err))
			}
			rows, err = target.Query(ctx, conn, "SELECT (NOT EXISTS (SELECT FROM "+t+"))::pg_catalog.text")
			if err != nil {
				return rollback(err)
			}
			if string(rows[0][0]) == "true" {
				if err := exec("DROP TABLE " + t); err != nil {
					return rollback(fmt.Errorf("dropping %s: %w", t, err))
				}
			}
		}
	}
	if err := exec("COMMIT"); err != nil {
		return fmt.Errorf("apply: uninstall: %w", err)
	}
	if opts.Origins && cfg.Origin != "" {
		err := exec(`SELECT pg_catalog.pg_replication_origin_drop(roname) FROM pg_catalog.pg_replication_origin
			WHERE roname = $1 OR (pg_catalog.left(roname, pg_catalog.length($1) + 2) IN ($1 || '_w', $1 || '_c')
				AND pg_catalog.substr(roname, pg_catalog.length($1) + 3) ~ '^[0-9]+$')`, cfg.Origin)
		if err != nil {
			return fmt.Errorf("apply: uninstall: dropping the replication origins %q...: %w", cfg.Origin, err)
		}
	}
	return nil
}

// progressSystem returns the source system named by the slot's progress row, or "" when there is
// no such row (or no progress table).
func progressSystem(ctx context.Context, tg *target.Conn, cfg *Config) (string, error) {
	table := tg.Table(cfg.ProgressTable)
	rows, err := target.Query(ctx, tg.PG(), "SELECT (pg_catalog.to_regclass($1) IS NOT NULL)::pg_catalog.text", table)
	if err != nil || string(rows[0][0]) != "true" {
		return "", err
	}
	rows, err = target.Query(ctx, tg.PG(), `SELECT system_id FROM `+table+` WHERE slot OPERATOR(pg_catalog.=) $1`, cfg.Slot)
	if err != nil {
		// A table made before it recorded the source system.
		if pgsession.IsCode(err, "42703") {
			return "", nil
		}
		return "", fmt.Errorf("reading the progress table %s: %w", table, err)
	}
	if len(rows) == 0 || rows[0][0] == nil {
		return "", nil
	}
	return string(rows[0][0]), nil
}
