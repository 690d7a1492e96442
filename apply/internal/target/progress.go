package target

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
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
	if _, err := t.pg.Prepare(ctx, "pgr_progress", upsert, nil); err != nil {
		return fmt.Errorf("apply: preparing the progress update: %w", err)
	}
	t.progress = &stmt{name: "pgr_progress", nparams: 4}
	return nil
}

// Relaxed commit order. A worker that commits transactions ahead of the committed prefix records
// them, in the same target transaction, in its row of the ahead table (the progress table's name
// with "_ahead"): (slot, worker) -> the prefix it knew when it sent its commit (every source
// transaction ending at or before end_lsn was committed on the target then) and the spans of
// transactions it committed past that prefix, this one's included. Its row is rewritten by each
// of its commits, which drop the spans the prefix has passed. After a crash the prefix is the
// highest of the slot's progress row and of these rows; the transactions to skip are the spans
// past it. Every commit a row's prefix counts returned before the row's transaction was sent, so
// its commit record is earlier in the WAL: if the row survived a crash, so did they.

// AheadSQL returns the upsert of a worker's row of the ahead table (quoted and qualified), with
// parameters AheadArgs'.
func AheadSQL(ahead string) string {
	return "INSERT INTO " + ahead + " AS a (slot, worker, system_id, end_lsn, spans) " +
		"VALUES ($1, $2::int, $3, $4::pg_lsn, $5::pg_lsn[]) ON CONFLICT (slot, worker) DO UPDATE SET " +
		"system_id = excluded.system_id, end_lsn = excluded.end_lsn, spans = excluded.spans"
}

// AheadTableSQL returns the statement that creates the ahead table (quoted and qualified) if
// it is missing.
func AheadTableSQL(ahead string) string {
	return "CREATE TABLE IF NOT EXISTS " + ahead + " (slot text NOT NULL, worker int NOT NULL, system_id text NOT NULL, " +
		"end_lsn pg_lsn NOT NULL, spans pg_lsn[] NOT NULL, PRIMARY KEY (slot, worker))"
}

// AheadArgs returns the parameters of AheadSQL: worker's row of the stream key, at prefix, with
// the spans of transactions committed past it: pairs of end LSNs (a span's first and last), one
// after the other, in one pg_lsn array.
func AheadArgs(key ProgressKey, worker int, prefix decoding.LSN, spans []decoding.LSN) [][]byte {
	return [][]byte{[]byte(key.Slot), strconv.AppendInt(nil, int64(worker), 10), []byte(key.System),
		prefix.AppendText(nil), AppendLSNs(nil, spans)}
}

// AppendLSNs appends lsns as the text of a pg_lsn array.
func AppendLSNs(b []byte, lsns []decoding.LSN) []byte {
	b = append(b, '{')
	for i, l := range lsns {
		if i > 0 {
			b = append(b, ',')
		}
		b = l.AppendText(b)
	}
	return append(b, '}')
}

// ParseLSNs reads the text of a pg_lsn array without NULLs, as AppendLSNs writes it.
func ParseLSNs(s string) ([]decoding.LSN, error) {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if s == "" {
		return nil, nil
	}
	f := strings.Split(s, ",")
	lsns := make([]decoding.LSN, len(f))
	for i, v := range f {
		l, err := decoding.ParseLSN(v)
		if err != nil {
			return nil, fmt.Errorf("apply: the pg_lsn array %q: %w", s, err)
		}
		lsns[i] = l
	}
	return lsns, nil
}

// PrepareAhead prepares upsert (AheadSQL's) on the connection: CommitAhead writes the worker's row
// with it.
func (t *Conn) PrepareAhead(ctx context.Context, upsert string) error {
	if _, err := t.pg.Prepare(ctx, "pgr_ahead", upsert, nil); err != nil {
		return fmt.Errorf("apply: preparing the ahead row update: %w", err)
	}
	t.ahead = &stmt{name: "pgr_ahead", nparams: 5}
	return nil
}

// CommitAhead is Commit, writing the worker's row of the ahead table (args, AheadArgs') instead of
// the progress row; end is the source transaction's end LSN.
func (t *Conn) CommitAhead(ctx context.Context, args [][]byte, end decoding.LSN, sync bool) error {
	if t.ahead == nil {
		return errors.New("apply: the ahead row statement is not prepared on the target connection")
	}
	return t.commit(ctx, t.ahead, args, end, sync)
}

// CompanionTable returns the quoted, qualified name of a table that lives beside the progress
// table: the progress table's name (as quoted and qualified by Conn.Table) with suffix appended
// to the table's part ("_copy" for the initial copy's, "_ahead" for relaxed commits').
func CompanionTable(progress, suffix string) string {
	parts, _ := ParseQualified(progress)
	parts[len(parts)-1] += suffix
	return pgsession.QuoteQualified(parts...)
}

// ProgressSystem returns the source system named by slot's row of the progress table (its
// configured name), or "" when there is no such row (or no progress table).
func (t *Conn) ProgressSystem(ctx context.Context, progressTable, slot string) (string, error) {
	table := t.Table(progressTable)
	rows, err := Query(ctx, t.pg, "SELECT (pg_catalog.to_regclass($1) IS NOT NULL)::pg_catalog.text", table)
	if err != nil || string(rows[0][0]) != "true" {
		return "", err
	}
	rows, err = Query(ctx, t.pg, `SELECT system_id FROM `+table+` WHERE slot OPERATOR(pg_catalog.=) $1`, slot)
	if err != nil {
		// A table made before it recorded the source system.
		if pgsession.IsCode(err, pgsession.UndefinedColumn) {
			return "", nil
		}
		return "", fmt.Errorf("reading the progress table %s: %w", table, err)
	}
	if len(rows) == 0 || rows[0][0] == nil {
		return "", nil
	}
	return string(rows[0][0]), nil
}
