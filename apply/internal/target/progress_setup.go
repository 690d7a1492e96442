package target

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// The statements a session runs on the leader's connection before it applies: the progress
// table set up and its row read, the skip columns (Config.SkipLSN), the ahead table (relaxed
// commit order) read and folded. What they mean is the session's to decide.

// SetupProgressTable creates the progress table (quoted) if it is missing, and adds the source
// system's columns to one made before they existed; it says whether it added them.
func (t *Conn) SetupProgressTable(ctx context.Context, table string) (upgraded bool, err error) {
	rows, err := Query(ctx, t.pg, "SELECT pg_catalog.to_regclass($1) IS NOT NULL", table)
	if err != nil {
		return false, fmt.Errorf("looking for the progress table: %w", err)
	}
	if string(rows[0][0]) != "t" {
		err := t.pg.Exec(ctx, "CREATE TABLE "+table+" (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)").Close()
		if err != nil && !pgsession.IsCode(err, pgsession.DuplicateTable) { // made meanwhile
			return false, fmt.Errorf("creating the progress table %s: %w", table, err)
		}
	}
	rows, err = Query(ctx, t.pg, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute
		WHERE attrelid = $1::regclass AND attname IN ('system_id', 'timeline') AND NOT attisdropped`, table)
	if err != nil {
		return false, fmt.Errorf("reading the progress table %s: %w", table, err)
	}
	if string(rows[0][0]) == "2" {
		return false, nil
	}
	// Made by an older version: (slot, end_lsn).
	err = t.pg.Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN IF NOT EXISTS system_id text, ADD COLUMN IF NOT EXISTS timeline int").Close()
	if err != nil {
		return false, fmt.Errorf("adding the source system's columns to the progress table %s (as its owner, run "+
			"ALTER TABLE %s ADD COLUMN system_id text, ADD COLUMN timeline int): %w", table, table, err)
	}
	return true, nil
}

// ProgressRow is a slot's row of the progress table.
type ProgressRow struct {
	End       decoding.LSN
	System    string // the source system whose positions it holds; "" with HasSystem false for none
	HasSystem bool
	Timeline  int
}

// ReadProgress reads slot's row of the progress table (quoted); found is false without one.
func (t *Conn) ReadProgress(ctx context.Context, table, slot string) (row ProgressRow, found bool, err error) {
	rows, err := Query(ctx, t.pg, "SELECT end_lsn::text, system_id, timeline::text FROM "+table+" WHERE slot = $1", slot)
	if err != nil {
		return row, false, fmt.Errorf("reading the progress table %s: %w", table, err)
	}
	if len(rows) == 0 {
		return row, false, nil
	}
	if row.End, err = decoding.ParseLSN(string(rows[0][0])); err != nil {
		return row, false, fmt.Errorf("progress table %s: %w", table, err)
	}
	row.System, row.HasSystem = string(rows[0][1]), rows[0][1] != nil
	if rows[0][2] != nil {
		row.Timeline, _ = strconv.Atoi(string(rows[0][2]))
	}
	return row, true, nil
}

// RecordSystem records k's source system and timeline in the slot's progress row, if it
// records no system yet.
func (t *Conn) RecordSystem(ctx context.Context, table string, k ProgressKey) error {
	_, err := Query(ctx, t.pg, "UPDATE "+table+" SET system_id = $2, timeline = $3::int WHERE slot = $1 AND system_id IS NULL",
		k.Slot, k.System, strconv.Itoa(k.Timeline))
	if err != nil {
		return fmt.Errorf("recording the source system in the progress table %s: %w", table, err)
	}
	return nil
}

// RecordTimeline records k's timeline in the slot's progress row.
func (t *Conn) RecordTimeline(ctx context.Context, table string, k ProgressKey) error {
	if _, err := Query(ctx, t.pg, "UPDATE "+table+" SET timeline = $2::int WHERE slot = $1", k.Slot, strconv.Itoa(k.Timeline)); err != nil {
		return fmt.Errorf("recording the source's timeline in the progress table %s: %w", table, err)
	}
	return nil
}

// SetupSkip adds the skip columns to the progress table (quoted) if they are missing, and
// returns what slot's row says was skipped last (skipped is false for nothing), and the upsert
// that records a skip (arguments: ProgressKey.Args, the skipped LSN and xid).
func (t *Conn) SetupSkip(ctx context.Context, table, slot string) (done decoding.LSN, xid string, skipped bool, upsert string, err error) {
	rows, err := Query(ctx, t.pg, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute
		WHERE attrelid = $1::regclass AND attname IN ('skipped_lsn', 'skipped_xid', 'skipped_at') AND NOT attisdropped`, table)
	if err == nil && string(rows[0][0]) != "3" {
		err = t.pg.Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN IF NOT EXISTS skipped_lsn pg_lsn, "+
			"ADD COLUMN IF NOT EXISTS skipped_xid bigint, ADD COLUMN IF NOT EXISTS skipped_at timestamptz").Close()
	}
	if err != nil {
		return 0, "", false, "", fmt.Errorf("adding the skip columns to the progress table %s (as its owner, run ALTER TABLE %s "+
			"ADD COLUMN skipped_lsn pg_lsn, ADD COLUMN skipped_xid bigint, ADD COLUMN skipped_at timestamptz): %w", table, table, err)
	}
	rows, err = Query(ctx, t.pg, "SELECT skipped_lsn::text, skipped_xid::text FROM "+table+" WHERE slot = $1", slot)
	if err != nil {
		return 0, "", false, "", fmt.Errorf("reading the progress table %s: %w", table, err)
	}
	upsert = "INSERT INTO " + table + " AS p (slot, end_lsn, system_id, timeline, skipped_lsn, skipped_xid, skipped_at) " +
		"VALUES ($1, $2::pg_lsn, $3, $4::int, $5::pg_lsn, $6::bigint, pg_catalog.now()) ON CONFLICT (slot) DO UPDATE SET " +
		"end_lsn = GREATEST(p.end_lsn, excluded.end_lsn), skipped_lsn = excluded.skipped_lsn, skipped_xid = excluded.skipped_xid, " +
		"skipped_at = excluded.skipped_at WHERE p.system_id = excluded.system_id RETURNING pg_catalog.pg_current_wal_insert_lsn()::text"
	if len(rows) == 1 && rows[0][0] != nil {
		if done, err := decoding.ParseLSN(string(rows[0][0])); err == nil {
			return done, string(rows[0][1]), true, upsert, nil
		}
	}
	return 0, "", false, upsert, nil
}

// HasProgress says whether the progress table (quoted) has a row for slot.
func (t *Conn) HasProgress(ctx context.Context, table, slot string) (bool, error) {
	rows, err := Query(ctx, t.pg, "SELECT pg_catalog.count(*) FROM "+table+" WHERE slot = $1", slot)
	if err != nil {
		return false, fmt.Errorf("reading the progress table %s: %w", table, err)
	}
	return string(rows[0][0]) != "0", nil
}

// AheadRow is a row of the ahead table: a worker's prefix and the spans (pairs of positions)
// it committed past it.
type AheadRow struct {
	End   decoding.LSN
	Spans []decoding.LSN
}

// AheadRows reads slot's rows of the ahead table (quoted) of source system; all counts the
// rows of every system. exists is false when there is no ahead table; create makes it then.
func (t *Conn) AheadRows(ctx context.Context, ahead, slot, system string, create bool) (rows []AheadRow, all int, exists bool, err error) {
	r, err := Query(ctx, t.pg, "SELECT pg_catalog.to_regclass($1) IS NOT NULL", ahead)
	if err != nil {
		return nil, 0, false, fmt.Errorf("looking for the ahead table: %w", err)
	}
	if string(r[0][0]) != "t" {
		if !create {
			return nil, 0, false, nil
		}
		err := t.pg.Exec(ctx, AheadTableSQL(ahead)).Close()
		if err != nil && !pgsession.IsCode(err, pgsession.DuplicateTable) && !pgsession.IsCode(err, pgsession.UniqueViolation) { // made meanwhile
			return nil, 0, false, fmt.Errorf("creating the ahead table %s (relaxed commit order; as the progress table's owner, run %s): %w",
				ahead, AheadTableSQL(ahead), err)
		}
		return nil, 0, false, nil
	}
	r, err = Query(ctx, t.pg, "SELECT end_lsn::text, spans::text, system_id FROM "+ahead+" WHERE slot = $1", slot)
	if err != nil {
		return nil, 0, true, fmt.Errorf("reading the ahead table %s: %w", ahead, err)
	}
	for _, row := range r {
		if string(row[2]) != system { // another source system's: the progress row names this one
			continue
		}
		var a AheadRow
		if a.End, err = decoding.ParseLSN(string(row[0])); err == nil {
			a.Spans, err = ParseLSNs(string(row[1]))
		}
		if err != nil {
			return nil, 0, true, fmt.Errorf("ahead table %s: %w", ahead, err)
		}
		rows = append(rows, a)
	}
	return rows, len(r), true, nil
}

// DeleteAhead deletes slot's rows of the ahead table (quoted).
func (t *Conn) DeleteAhead(ctx context.Context, ahead, slot string) error {
	if _, err := Query(ctx, t.pg, "DELETE FROM "+ahead+" WHERE slot = $1", slot); err != nil {
		return fmt.Errorf("deleting the slot's rows of the ahead table %s: %w", ahead, err)
	}
	return nil
}

// FoldAhead replaces the slot's rows of the ahead table (quoted) by one, worker 0's, with the
// spans past prefix, and moves the progress row to prefix with flush (ProgressSQL's), in one
// synchronous target transaction.
func (t *Conn) FoldAhead(ctx context.Context, ahead, flush string, key ProgressKey, prefix decoding.LSN, spans []decoding.LSN) error {
	b := &pgconn.Batch{}
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	b.ExecParams("SET LOCAL synchronous_commit = on", nil, nil, nil, nil)
	b.ExecParams(flush, key.Args(prefix), nil, nil, nil)
	b.ExecParams("DELETE FROM "+ahead+" WHERE slot = $1", [][]byte{[]byte(key.Slot)}, nil, nil, nil)
	if len(spans) > 0 {
		b.ExecParams(AheadSQL(ahead), AheadArgs(key, 0, prefix, spans), nil, nil, nil)
	}
	b.ExecParams("COMMIT", nil, nil, nil, nil)
	if _, err := t.pg.ExecBatch(ctx, b).ReadAll(); err != nil {
		return fmt.Errorf("folding the slot's rows of the ahead table %s: %w", ahead, err)
	}
	return nil
}
