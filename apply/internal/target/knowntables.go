package target

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
)

// companions are the suffixes of the tables that live beside the progress table (see
// CompanionTable).
var companions = []string{"_copy", "_tables", "_ahead"}

// The tables table (the progress table's name with "_tables") records, for each slot, the source
// tables the target holds whole: those of the initial copy, those published when a slot was first
// followed without one, and those copied since they were added to the publications. A row
// (slot, relid) names a source table by OID (the source system's: system_id), its name as it was
// then, for people, and synced_lsn: for a table copied after it was added, the consistent point
// of its copy, before which the stream's changes of the table are in the copy already; NULL
// otherwise. The row of relid 0 says the slot's tables were recorded at all (an empty
// publication too). These are its statements, on the leader's connection or, for an added
// table's copy, on the copy's, in the copy's transaction.

// KnownTable is a row of the tables table.
type KnownTable struct {
	OID    uint32
	Name   string       // quoted and qualified, as the source named it when recorded
	Synced decoding.LSN // the consistent point of its copy when it was added; 0 if none
}

// CreateTablesTable creates the tables table tt (quoted) if it is missing.
func (t *Conn) CreateTablesTable(ctx context.Context, tt string) error {
	return t.createIfMissing(ctx, "the tables table", tt, "(slot text NOT NULL, relid oid NOT NULL, system_id text NOT NULL, "+
		"relation text NOT NULL, synced_lsn pg_lsn, PRIMARY KEY (slot, relid))")
}

// ReadTables returns the tables tt records for key's slot and source system, and whether it
// records them at all (the row of relid 0). Rows of another source system are not returned:
// OIDs of one system name nothing on another.
func (t *Conn) ReadTables(ctx context.Context, tt string, key ProgressKey) (tables []KnownTable, recorded bool, err error) {
	rows, err := Query(ctx, t.pg, `SELECT relid::pg_catalog.text, relation, synced_lsn::pg_catalog.text FROM `+tt+`
WHERE slot OPERATOR(pg_catalog.=) $1 AND system_id OPERATOR(pg_catalog.=) $2 ORDER BY relid`, key.Slot, key.System)
	if err != nil {
		return nil, false, fmt.Errorf("reading the tables table %s: %w", tt, err)
	}
	for _, r := range rows {
		oid, err := strconv.ParseUint(string(r[0]), 10, 32)
		if err != nil {
			return nil, false, fmt.Errorf("reading the tables table %s: relid %q: %w", tt, r[0], err)
		}
		if oid == 0 {
			recorded = true
			continue
		}
		k := KnownTable{OID: uint32(oid), Name: string(r[1])}
		if r[2] != nil {
			if err := k.Synced.UnmarshalText(r[2]); err != nil {
				return nil, false, fmt.Errorf("reading the tables table %s: synced_lsn: %w", tt, err)
			}
		}
		tables = append(tables, k)
	}
	return tables, recorded, nil
}

// RecordTables records tables for key's slot in tt, replacing what it recorded of them; with
// reset, it first deletes every row of the slot (of any source system), and records the slot's
// tables as recorded. It runs in the connection's open transaction, if any.
func (t *Conn) RecordTables(ctx context.Context, tt string, key ProgressKey, tables []KnownTable, reset bool) error {
	if reset {
		if _, err := Query(ctx, t.pg, "DELETE FROM "+tt+" WHERE slot OPERATOR(pg_catalog.=) $1", key.Slot); err != nil {
			return fmt.Errorf("recording the tables in %s: %w", tt, err)
		}
		tables = append([]KnownTable{{}}, tables...)
	}
	for start := 0; start < len(tables); start += 1000 {
		batch := tables[start:min(start+1000, len(tables))]
		var b strings.Builder
		b.WriteString("INSERT INTO " + tt + " (slot, system_id, relid, relation, synced_lsn) VALUES ")
		args := []string{key.Slot, key.System}
		for i, k := range batch {
			if i > 0 {
				b.WriteString(", ")
			}
			n := len(args)
			args = append(args, strconv.FormatUint(uint64(k.OID), 10), k.Name)
			fmt.Fprintf(&b, "($1, $2, $%d::pg_catalog.oid, $%d, ", n+1, n+2)
			if k.Synced == 0 {
				b.WriteString("NULL)")
				continue
			}
			args = append(args, k.Synced.String())
			fmt.Fprintf(&b, "$%d::pg_catalog.pg_lsn)", n+3)
		}
		b.WriteString(" ON CONFLICT (slot, relid) DO UPDATE SET system_id = excluded.system_id, relation = excluded.relation, " +
			"synced_lsn = excluded.synced_lsn")
		if _, err := Query(ctx, t.pg, b.String(), args...); err != nil {
			return fmt.Errorf("recording the tables in %s: %w", tt, err)
		}
	}
	return nil
}

// ForgetTables deletes the rows of oids from slot's in tt.
func (t *Conn) ForgetTables(ctx context.Context, tt, slot string, oids []uint32) error {
	list := make([]string, len(oids))
	for i, o := range oids {
		list[i] = strconv.FormatUint(uint64(o), 10)
	}
	_, err := Query(ctx, t.pg, "DELETE FROM "+tt+" WHERE slot OPERATOR(pg_catalog.=) $1 AND relid OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.oid[])",
		slot, "{"+strings.Join(list, ",")+"}")
	if err != nil {
		return fmt.Errorf("deleting tables from %s: %w", tt, err)
	}
	return nil
}
