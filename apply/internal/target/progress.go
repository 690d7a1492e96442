package target

import (
	"context"
	"fmt"
	"strconv"

	"github.com/pgreorder/pgreorder/decoding"
)

// ProgressKey is what identifies the stream in its progress row: the slot, and the source system
// (System.ID and Timeline) whose positions the row holds.
type ProgressKey struct {
	Slot     string
	System   string
	Timeline int
}

// Args returns the parameters of the progress upserts for position end.
func (k ProgressKey) Args(end decoding.LSN) [][]byte {
	return [][]byte{[]byte(k.Slot), end.AppendText(nil), []byte(k.System), strconv.AppendInt(nil, int64(k.Timeline), 10)}
}

// ProgressSQL returns the progress upserts for the progress table (quoted and qualified):
// upsert writes the row at a position, flush never moves it back and returns the WAL insert
// position (see FlushWAL). Neither writes a row of another source system: a row of another
// system found at the start stops the session; these guard against one made meanwhile.
func ProgressSQL(table string) (upsert, flush string) {
	ins := "INSERT INTO " + table + " AS p (slot, end_lsn, system_id, timeline) VALUES ($1, $2::pg_lsn, $3, $4::int) " +
		"ON CONFLICT (slot) DO UPDATE SET end_lsn = "
	upsert = ins + "excluded.end_lsn WHERE p.system_id = excluded.system_id"
	flush = ins + "GREATEST(p.end_lsn, excluded.end_lsn) WHERE p.system_id = excluded.system_id " +
		"RETURNING pg_catalog.pg_current_wal_insert_lsn()::text"
	return upsert, flush
}

// PrepareProgress prepares upsert (ProgressSQL's) on the connection: Commit writes the
// progress row with it.
func (t *Conn) PrepareProgress(ctx context.Context, upsert string) error {
	if _, err := t.PG.Prepare(ctx, "pgr_progress", upsert, nil); err != nil {
		return fmt.Errorf("apply: preparing the progress update: %w", err)
	}
	t.progress = &stmt{name: "pgr_progress", nparams: 4}
	return nil
}
