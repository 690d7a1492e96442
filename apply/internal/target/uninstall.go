package target

import (
	"context"
	"fmt"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Removing what an Applier made on the target (apply's Applier.Uninstall; the caller checks that
// no Applier of the slot runs).

// Uninstall says what RemoveInstalled removes besides the tombstone store.
type Uninstall struct {
	Slot           string
	TombstoneTable string // the configured names (conflict.Config.TombstoneTable, Config.ProgressTable)
	ProgressTable  string
	// Progress deletes the slot's rows from the progress table, its copy table and its ahead table,
	// and drops each of them once no slot has a row in it.
	Progress bool
	// Origin, when not "", is the replication origin whose origins are dropped: itself and those of
	// the workers (Origin_wN) and of the initial copy's connections (Origin_cN).
	Origin string
}

// RemoveInstalled removes the tombstone store (the tombstone trigger of every table, the trigger
// function and the tombstone table) and, as u says, the slot's progress, in one transaction, and
// then the replication origins. Its errors say what failed; the caller names the operation.
func (t *Conn) RemoveInstalled(ctx context.Context, u Uninstall) error {
	conn := t.pg
	exec := func(sql string, args ...string) error {
		_, err := Query(ctx, conn, sql, args...)
		return err
	}
	table, fn, _ := TombstoneNames(t, u.TombstoneTable, u.ProgressTable)
	if err := exec("BEGIN"); err != nil {
		return err
	}
	rollback := func(err error) error {
		conn.ExecParams(context.WithoutCancel(ctx), "ROLLBACK", nil, nil, nil, nil).Close()
		return err
	}
	rows, err := Query(ctx, conn, `SELECT n.nspname, c.relname FROM pg_catalog.pg_trigger t
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
	if u.Progress {
		progress := t.Table(u.ProgressTable)
		for _, tb := range []string{progress, CompanionTable(progress, "_copy"), CompanionTable(progress, "_ahead")} {
			rows, err := Query(ctx, conn, "SELECT (pg_catalog.to_regclass($1) IS NOT NULL)::pg_catalog.text", tb)
			if err != nil {
				return rollback(err)
			}
			if string(rows[0][0]) != "true" {
				continue
			}
			// Locked: an Applier of another slot that writes a row meanwhile keeps the table.
			if err := exec("LOCK TABLE " + tb + " IN ACCESS EXCLUSIVE MODE"); err != nil {
				return rollback(err)
			}
			if err := exec("DELETE FROM "+tb+" WHERE slot = $1", u.Slot); err != nil {
				return rollback(fmt.Errorf("deleting the slot's rows from %s: %w", tb, err))
			}
			rows, err = Query(ctx, conn, "SELECT (NOT EXISTS (SELECT FROM "+tb+"))::pg_catalog.text")
			if err != nil {
				return rollback(err)
			}
			if string(rows[0][0]) == "true" {
				if err := exec("DROP TABLE " + tb); err != nil {
					return rollback(fmt.Errorf("dropping %s: %w", tb, err))
				}
			}
		}
	}
	if err := exec("COMMIT"); err != nil {
		return err
	}
	if u.Origin != "" {
		err := exec(`SELECT pg_catalog.pg_replication_origin_drop(roname) FROM pg_catalog.pg_replication_origin
			WHERE roname = $1 OR (pg_catalog.left(roname, pg_catalog.length($1) + 2) IN ($1 || '_w', $1 || '_c')
				AND pg_catalog.substr(roname, pg_catalog.length($1) + 3) ~ '^[0-9]+$')`, u.Origin)
		if err != nil {
			return fmt.Errorf("dropping the replication origins %q...: %w", u.Origin, err)
		}
	}
	return nil
}
