package target

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// The copy table (the progress table's name with "_copy") records an initial copy under way:
// a row (slot, '') before the slot is created, and a row (slot, table) for every target table
// before the first row is written into it; the transaction that writes the progress row at the
// copy's consistent point deletes them. These are its statements, on the leader's connection.

// CreateCopyTable creates the copy table ct (quoted) if it is missing.
func (t *Conn) CreateCopyTable(ctx context.Context, ct string) error {
	return t.createIfMissing(ctx, "the copy table", ct, "(slot text NOT NULL, relation text NOT NULL, PRIMARY KEY (slot, relation))")
}

// createIfMissing creates table (quoted), what names it, with columns if it does not exist.
func (t *Conn) createIfMissing(ctx context.Context, what, table, columns string) error {
	rows, err := Query(ctx, t.pg, "SELECT pg_catalog.to_regclass($1) IS NOT NULL", table)
	if err != nil {
		return fmt.Errorf("looking for %s: %w", what, err)
	}
	if string(rows[0][0]) == "t" {
		return nil
	}
	err = t.pg.Exec(ctx, "CREATE TABLE "+table+" "+columns).Close()
	if err != nil && !pgsession.IsCode(err, pgsession.DuplicateTable) && !pgsession.IsCode(err, pgsession.UniqueViolation) { // made meanwhile
		return fmt.Errorf("creating %s %s: %w", what, table, err)
	}
	return nil
}

// WithTxn runs f in a transaction on t; sync makes its commit wait for the WAL flush (unless
// Options.SynchronousCommit leaves that to the role's setting). A failure rolls it back.
func (t *Conn) WithTxn(ctx context.Context, sync bool, f func() error) error {
	conn := t.pg
	if err := conn.Exec(ctx, "BEGIN").Close(); err != nil {
		return err
	}
	err := f()
	if err == nil && sync && !t.opts.SynchronousCommit {
		err = conn.Exec(ctx, "SET LOCAL synchronous_commit = on").Close()
	}
	if err == nil {
		return conn.Exec(ctx, "COMMIT").Close()
	}
	if !conn.IsClosed() {
		conn.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close()
	}
	return err
}

// ResetCopy empties the tables the copy table ct records for slot and deletes its rows, in one
// transaction; with begin, it records a new copy (the slot's row with an empty relation),
// durably. It logs on log the tables it empties.
func (t *Conn) ResetCopy(ctx context.Context, ct, slot string, begin bool, log *slog.Logger) error {
	return t.WithTxn(ctx, begin, func() error {
		// The tables as they are now: partitioned ones are truncated whole, others without
		// their inheritance children; dropped ones are gone already.
		rows, err := Query(ctx, t.pg, `SELECT r.relation, c.relkind = 'p'
FROM `+ct+` r JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(r.relation)
WHERE r.slot = $1 AND r.relation <> '' ORDER BY r.relation`, slot)
		if err != nil {
			return err
		}
		var names []string
		for _, r := range rows {
			names = append(names, TruncateName(string(r[0]), string(r[1]) == "t"))
		}
		if len(names) > 0 {
			log.Info("emptying the tables of an unfinished initial copy", "tables", strings.Join(names, ", "))
			if err := t.Truncate(ctx, names); err != nil {
				return err
			}
		}
		if _, err := Query(ctx, t.pg, "DELETE FROM "+ct+" WHERE slot = $1", slot); err != nil {
			return err
		}
		if begin {
			_, err = Query(ctx, t.pg, "INSERT INTO "+ct+" (slot, relation) VALUES ($1, '')", slot)
		}
		return err
	})
}

// TruncateName returns the name to TRUNCATE: the table alone, or a partitioned table whole.
func TruncateName(name string, partitioned bool) string {
	if partitioned {
		return name
	}
	return "ONLY " + name
}

// Truncate empties the tables names (as TruncateName returns them) in one statement.
func (t *Conn) Truncate(ctx context.Context, names []string) error {
	_, err := t.pg.ExecParams(ctx, "TRUNCATE "+strings.Join(names, ", "), nil, nil, nil, nil).Close()
	return err
}

// NonEmpty returns, of tables, the names of those that hold rows, and their names to TRUNCATE.
func (t *Conn) NonEmpty(ctx context.Context, tables []*Table) (full, names []string, err error) {
	for _, m := range tables {
		name := TruncateName(m.Name, m.Partitioned)
		rows, err := Query(ctx, t.pg, "SELECT EXISTS (SELECT FROM "+name+")")
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", m.Name, err)
		}
		if string(rows[0][0]) == "t" {
			full = append(full, m.Name)
			names = append(names, name)
		}
	}
	return full, names, nil
}

// RecordCopy records the target tables of slot's copy in the copy table ct.
func (t *Conn) RecordCopy(ctx context.Context, ct, slot string, tables []*Table) error {
	for start := 0; start < len(tables); start += 1000 {
		batch := tables[start:min(start+1000, len(tables))]
		var b strings.Builder
		b.WriteString("INSERT INTO " + ct + " (slot, relation) VALUES ")
		args := []string{slot}
		for i, m := range batch {
			if i > 0 {
				b.WriteString(", ")
			}
			args = append(args, m.Name)
			b.WriteString("($1, $" + strconv.Itoa(len(args)) + ")")
		}
		b.WriteString(" ON CONFLICT DO NOTHING")
		if _, err := Query(ctx, t.pg, b.String(), args...); err != nil {
			return fmt.Errorf("recording the tables in %s: %w", ct, err)
		}
	}
	return nil
}

// FinishCopy writes the progress row (with upsert, ProgressSQL's) at the copy's consistent
// point cp, deletes the copy's rows from ct, and records the source tables copied in the tables
// table tt (see RecordTables), in one durable transaction.
func (t *Conn) FinishCopy(ctx context.Context, ct, tt, upsert string, key ProgressKey, cp decoding.LSN, copied []KnownTable) error {
	if err := t.CreateTablesTable(ctx, tt); err != nil {
		return err
	}
	return t.WithTxn(ctx, true, func() error {
		if _, err := Query(ctx, t.pg, upsert, key.Slot, cp.String(), key.System, strconv.Itoa(key.Timeline)); err != nil {
			return err
		}
		if _, err := Query(ctx, t.pg, "DELETE FROM "+ct+" WHERE slot = $1", key.Slot); err != nil {
			return err
		}
		return t.RecordTables(ctx, tt, key, copied, true)
	})
}
