package target

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/apply/conflict"
)

// What the source's catalog says of the tables to apply into: the tables the publications hold
// (PublishedTablesQuery, ParsePublished) and their definitions (SourceColumnsQuery,
// Definitions), for MissingTables and CreateStatement. The caller runs the queries on its
// connection to the source.

// Published is a table the session applies: its OID on the source, its name (the target
// table's), and the columns published, which a table created for it has.
type Published struct {
	OID  uint32
	Name TableName
	Cols []string
}

// PublishedTablesQuery lists the tables the publications ($1) hold, as the stream publishes
// them (pg_publication_tables: partitions under their root with publish_via_partition_root),
// with their OIDs and the columns published: the publication's column list (every column
// without one), less generated columns before PostgreSQL 18, whose pgoutput never publishes
// them (18 lists them only when it does). A table two publications publish comes once per
// column list.
const PublishedTablesQuery = `SELECT DISTINCT c.oid, t.schemaname::pg_catalog.text, t.tablename::pg_catalog.text,
	pg_catalog.array_to_json(ARRAY(SELECT a.attname FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY (t.attnames)
		AND (a.attgenerated = '' OR pg_catalog.current_setting('server_version_num')::int >= 180000)
		ORDER BY a.attnum))::pg_catalog.text
FROM pg_catalog.pg_publication_tables t
	JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname
	JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
WHERE t.pubname = ANY ($1::pg_catalog.text[])
ORDER BY 2, 3`

// ParsePublished reads the rows of PublishedTablesQuery: one table per OID, with the union of
// the columns its publications publish (the stream sends their union).
func ParsePublished(rows [][][]byte) ([]Published, error) {
	var tables []Published
	byOID := map[uint32]int{}
	for _, r := range rows {
		oid, err := strconv.ParseUint(string(r[0]), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("OID %q", r[0])
		}
		var cols []string
		if err := json.Unmarshal(r[3], &cols); err != nil {
			return nil, fmt.Errorf("columns %q: %w", r[3], err)
		}
		i, ok := byOID[uint32(oid)]
		if !ok {
			i = len(tables)
			byOID[uint32(oid)] = i
			tables = append(tables, Published{OID: uint32(oid), Name: TableName{Schema: string(r[1]), Name: string(r[2])}})
		}
		for _, c := range cols {
			if !slices.Contains(tables[i].Cols, c) {
				tables[i].Cols = append(tables[i].Cols, c)
			}
		}
	}
	return tables, nil
}

// SourceColumnsQuery reads the columns of the tables whose OIDs are $1 from the source's
// catalog, in each table's order: name, type (schema and name in pg_type, modifier, and
// format_type without the modifier, for messages), NOT NULL, and the column's position in the
// table's key (NULL when it is not in it). The key is the replica identity's index for a table
// whose replica identity is an index (REPLICA IDENTITY USING INDEX: unique, not partial, on NOT
// NULL columns, which is what the stream's old keys are made of), the primary key otherwise.
const SourceColumnsQuery = `SELECT a.attrelid, a.attname, tn.nspname, t.typname, a.atttypmod, pg_catalog.format_type(a.atttypid, NULL),
	a.attnotnull, pg_catalog.array_position(i.indkey::pg_catalog.int2[], a.attnum)
FROM pg_catalog.pg_attribute a
	JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
	JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
	JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
	LEFT JOIN pg_catalog.pg_index i ON i.indrelid = a.attrelid
		AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END
WHERE a.attrelid = ANY ($1::pg_catalog.oid[]) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum`

// SourceColumnsArg returns SourceColumnsQuery's argument for tables.
func SourceColumnsArg(tables []Published) string {
	oids := make([]string, len(tables))
	for i, t := range tables {
		oids[i] = strconv.FormatUint(uint64(t.OID), 10)
	}
	return "{" + strings.Join(oids, ",") + "}"
}

// Definitions makes the definitions of tables from the rows of SourceColumnsQuery: the
// published columns, in the source's order, with their types and NOT NULL, and the key (the
// replica identity's index, or the primary key: see SourceColumnsQuery) when every one of its
// columns is published. The key becomes the target table's primary key. A table the rows do not have (dropped since) is
// nil.
func Definitions(rows [][][]byte, tables []Published) []*TableDef {
	type column struct {
		def    ColumnDef
		keyPos int // -1: not in the key
	}
	byOID := map[string][]column{}
	for _, r := range rows {
		mod, _ := strconv.ParseInt(string(r[4]), 10, 32)
		c := column{def: ColumnDef{Name: string(r[1]), TypeSchema: string(r[2]), TypeName: string(r[3]), TypeMod: int32(mod),
			SourceType: string(r[5]), NotNull: string(r[6]) == "t"}, keyPos: -1}
		if r[7] != nil {
			c.keyPos, _ = strconv.Atoi(string(r[7]))
		}
		byOID[string(r[0])] = append(byOID[string(r[0])], c)
	}
	defs := make([]*TableDef, len(tables))
	for i, t := range tables {
		cols, ok := byOID[strconv.FormatUint(uint64(t.OID), 10)]
		if !ok {
			continue
		}
		def := &TableDef{TableName: t.Name}
		var key []column
		keyWhole := true
		for _, c := range cols {
			published := slices.Contains(t.Cols, c.def.Name)
			if published {
				def.Columns = append(def.Columns, c.def)
			}
			if c.keyPos >= 0 {
				key = append(key, c)
				keyWhole = keyWhole && published
			}
		}
		if keyWhole && len(key) > 0 {
			slices.SortFunc(key, func(x, y column) int { return x.keyPos - y.keyPos })
			for _, c := range key {
				def.Key = append(def.Key, c.def.Name)
			}
		}
		defs[i] = def
	}
	return defs
}

// OwnTables returns the quoted, qualified names of the tables an Applier keeps on the target
// whose progress table is progress (quoted): the progress, copy, tables and ahead tables, and the
// tables named others (the conflict log, the tombstones), resolved on t.
func (t *Conn) OwnTables(progress string, others ...string) map[string]bool {
	own := map[string]bool{progress: true}
	for _, part := range companions {
		own[CompanionTable(progress, part)] = true
	}
	for _, n := range append(others, conflict.DefaultTombstoneTable) {
		if n != "" {
			own[t.Table(n)] = true
		}
	}
	return own
}
