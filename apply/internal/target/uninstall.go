package target

import (
	"context"
	"fmt"
	"strconv"

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

// Removed is what RemoveInstalled removed.
type Removed struct {
	TombstoneTriggers []string // the tables whose tombstone trigger was dropped, quoted and qualified
	TombstoneFunction string   // the trigger function, "" if there was none
	TombstoneTable    string   // the tombstone table, "" if there was none
	ProgressRows      int64    // the slot's rows deleted from the progress, copy, tables and ahead tables
	DroppedTables     []string // those of them dropped, left without rows
	Origins           []string // the replication origins dropped
}

// RemoveInstalled removes the tombstone store (the tombstone trigger of every table, the trigger
// function and the tombstone table) and, as u says, the slot's progress, in one transaction, and
// then the replication origins, and says what it removed. What is not there is left alone
// (looked up first: no "does not exist, skipping" notices). Its errors say what failed; the
// caller names the operation.
func (t *Conn) RemoveInstalled(ctx context.Context, u Uninstall) (Removed, error) {
	var done Removed
	conn := t.pg
	exec := func(sql string, args ...string) error {
		_, err := Query(ctx, conn, sql, args...)
		return err
	}
	exists := func(sql, arg string) (bool, error) {
		rows, err := Query(ctx, conn, "SELECT ("+sql+" IS NOT NULL)::pg_catalog.text", arg)
		if err != nil {
			return false, err
		}
		return string(rows[0][0]) == "true", nil
	}
	table, fn, _ := TombstoneNames(t, u.TombstoneTable, u.ProgressTable)
	if err := exec("BEGIN"); err != nil {
		return done, err
	}
	rollback := func(err error) (Removed, error) {
		conn.ExecParams(context.WithoutCancel(ctx), "ROLLBACK", nil, nil, nil, nil).Close()
		return Removed{}, err
	}
	rows, err := Query(ctx, conn, `SELECT n.nspname, c.relname FROM pg_catalog.pg_trigger t
		JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE t.tgfoid = pg_catalog.to_regprocedure($1) AND t.tgname = $2`, fn+"()", detect.TombstoneTrigger)
	if err != nil {
		return rollback(fmt.Errorf("listing the tombstone triggers: %w", err))
	}
	for _, r := range rows {
		rel := pgsession.QuoteQualified(string(r[0]), string(r[1]))
		if err := exec("DROP TRIGGER " + pgsession.QuoteIdent(detect.TombstoneTrigger) + " ON " + rel); err != nil {
			return rollback(fmt.Errorf("dropping the tombstone trigger of %s: %w", rel, err))
		}
		done.TombstoneTriggers = append(done.TombstoneTriggers, rel)
	}
	if ok, err := exists("pg_catalog.to_regprocedure($1)", fn+"()"); err != nil {
		return rollback(err)
	} else if ok {
		if err := exec("DROP FUNCTION " + fn + "()"); err != nil {
			return rollback(fmt.Errorf("dropping the tombstone function %s: %w", fn, err))
		}
		done.TombstoneFunction = fn
	}
	if ok, err := exists("pg_catalog.to_regclass($1)", table); err != nil {
		return rollback(err)
	} else if ok {
		if err := exec("DROP TABLE " + table); err != nil {
			return rollback(fmt.Errorf("dropping the tombstone table %s: %w", table, err))
		}
		done.TombstoneTable = table
	}
	if u.Progress {
		progress := t.Table(u.ProgressTable)
		tables := []string{progress}
		for _, part := range companions {
			tables = append(tables, CompanionTable(progress, part))
		}
		for _, tb := range tables {
			ok, err := exists("pg_catalog.to_regclass($1)", tb)
			if err != nil {
				return rollback(err)
			}
			if !ok {
				continue
			}
			// Locked: an Applier of another slot that writes a row meanwhile keeps the table.
			if err := exec("LOCK TABLE " + tb + " IN ACCESS EXCLUSIVE MODE"); err != nil {
				return rollback(err)
			}
			rows, err := Query(ctx, conn, "WITH d AS (DELETE FROM "+tb+" WHERE slot = $1 RETURNING 1) SELECT pg_catalog.count(*)::pg_catalog.text FROM d", u.Slot)
			if err != nil {
				return rollback(fmt.Errorf("deleting the slot's rows from %s: %w", tb, err))
			}
			n, _ := strconv.ParseInt(string(rows[0][0]), 10, 64)
			done.ProgressRows += n
			rows, err = Query(ctx, conn, "SELECT (NOT EXISTS (SELECT FROM "+tb+"))::pg_catalog.text")
			if err != nil {
				return rollback(err)
			}
			if string(rows[0][0]) == "true" {
				if err := exec("DROP TABLE " + tb); err != nil {
					return rollback(fmt.Errorf("dropping %s: %w", tb, err))
				}
				done.DroppedTables = append(done.DroppedTables, tb)
			}
		}
	}
	if err := exec("COMMIT"); err != nil {
		return Removed{}, err
	}
	if u.Origin != "" {
		rows, err := Query(ctx, conn, `SELECT roname, pg_catalog.pg_replication_origin_drop(roname)::pg_catalog.text
			FROM pg_catalog.pg_replication_origin
			WHERE roname = $1 OR (pg_catalog.left(roname, pg_catalog.length($1) + 2) IN ($1 || '_w', $1 || '_c')
				AND pg_catalog.substr(roname, pg_catalog.length($1) + 3) ~ '^[0-9]+$')`, u.Origin)
		if err != nil {
			return done, fmt.Errorf("dropping the replication origins %q...: %w", u.Origin, err)
		}
		for _, r := range rows {
			done.Origins = append(done.Origins, string(r[0]))
		}
	}
	return done, nil
}
