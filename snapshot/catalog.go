package snapshot

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Table is one published table as the copy sees it in the snapshot.
type Table struct {
	OID    uint32 // the table's OID: the RelationID of its changes in the stream
	Schema string
	Name   string
	// Relation describes the table as the stream's Relation message does: the published
	// columns (column list applied, generated columns as the server's pgoutput publishes them)
	// in the table's order, their types, and which are part of the replica identity key. Do not
	// modify it.
	Relation *decoding.Relation
	// RowFilter is the condition a row must meet to be published (the publications' row
	// filters, joined with OR), as PostgreSQL prints it; "" when every row is published.
	RowFilter string
	// Publications are those of Config.Publications that publish the table.
	Publications []string
	// Partitioned is set for a partitioned table published through its root
	// (publish_via_partition_root): its partitions are copied, their rows delivered as the
	// root's, as the stream sends their changes.
	Partitioned bool
	// Size is the size in bytes of the table (or of its partitions) when Open looked.
	Size int64
	// Chunks is the number of chunks the table is copied in.
	Chunks int

	types   map[uint32]*decoding.DataType
	sources []source
	exprs   []string // the SELECT list
	kinds   []byte   // decoding.ColumnText or ColumnBinary per column
	rows    atomic.Int64
	done    atomic.Int64 // chunks copied
}

// Rows returns the number of rows copied so far.
func (t *Table) Rows() int64 { return t.rows.Load() }

// String returns the schema-qualified name, with the parts quoted only when they need it.
func (t *Table) String() string {
	return pgsession.DisplayIdent(t.Schema) + "." + pgsession.DisplayIdent(t.Name)
}

// sqlName returns the schema-qualified name, quoted for SQL.
func (t *Table) sqlName() string { return pgsession.QuoteQualified(t.Schema, t.Name) }

// Type returns the description of a type the table's columns use, as the stream's Type message
// gives it (for types that are not built in), and false for other types.
func (t *Table) Type(oid uint32) (*decoding.DataType, bool) {
	dt, ok := t.types[oid]
	return dt, ok
}

// source is one relation a table's rows are read from: the table itself, or one partition.
type source struct {
	sqlName string // schema-qualified, quoted
	only    bool   // SELECT FROM ONLY (a table with inheritance children published on their own)
	ranges  bool   // ctid ranges can split it
	pages   int64
}

// published is what the publications say about one table.
type published struct {
	oid     uint32
	name    string // schema-qualified, for messages
	pubs    []string
	attrs   []string // the column list, nil for every column
	filters []string // nil: every row
}

// firstGenbkiOID is FirstGenbkiObjectId: pgoutput describes every type at or above it with a
// Type message.
const firstGenbkiOID = 10000

// listPublished lists, from the current catalog, the tables the publications publish with their
// column lists and row filters (pg_publication_tables, on PostgreSQL 15+ with attnames and
// rowfilter), keyed by OID.
func listPublished(ctx context.Context, conn *pgconn.PgConn, major int, pubs []string) (map[uint32]*published, error) {
	extra := "NULL::text, NULL::text"
	if major >= 15 {
		extra = "pg_catalog.array_to_json(t.attnames)::text, t.rowfilter"
	}
	rows, err := query(ctx, conn, "SELECT c.oid, t.pubname, "+extra+", t.schemaname, t.tablename FROM pg_catalog.pg_publication_tables t "+
		"JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname "+
		"JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename "+
		"WHERE t.pubname IN ("+literals(pubs)+") ORDER BY 1, 2")
	if err != nil {
		return nil, fmt.Errorf("snapshot: listing published tables: %w", err)
	}
	out := map[uint32]*published{}
	lists := map[uint32][]string{} // the distinct column lists, as JSON
	noFilter := map[uint32]bool{}
	for _, row := range rows {
		oid, err := parseOID(row[0])
		if err != nil {
			return nil, err
		}
		p := out[oid]
		if p == nil {
			p = &published{oid: oid, name: pgsession.DisplayIdent(*row[4]) + "." + pgsession.DisplayIdent(*row[5])}
			out[oid] = p
		}
		p.pubs = append(p.pubs, *row[1])
		if row[2] != nil && !slices.Contains(lists[oid], *row[2]) {
			lists[oid] = append(lists[oid], *row[2])
		}
		if row[3] == nil {
			noFilter[oid] = true
		} else if !slices.Contains(p.filters, *row[3]) {
			p.filters = append(p.filters, *row[3])
		}
	}
	for oid, p := range out {
		if noFilter[oid] {
			p.filters = nil
		}
		switch l := lists[oid]; len(l) {
		case 0:
		case 1:
			if err := json.Unmarshal([]byte(l[0]), &p.attrs); err != nil {
				return nil, fmt.Errorf("snapshot: column list %s: %w", l[0], err)
			}
			if p.attrs == nil {
				p.attrs = []string{} // published with no column at all
			}
		default:
			return nil, fmt.Errorf("%w: %s is published with the columns %s by the publications %s",
				ErrColumnLists, p.name, strings.Join(l, " and "), strings.Join(p.pubs, ", "))
		}
	}
	return out, nil
}

// pubFingerprint identifies the versions of the catalog rows that define the publications:
// the same value read in two snapshots means no publication was created, altered or dropped in
// between (a row's xmin changes with every update).
func pubFingerprint(ctx context.Context, conn *pgconn.PgConn, major int, pubs []string) (string, error) {
	in := literals(pubs)
	sql := "SELECT 'p' || p.oid || ':' || p.xmin FROM pg_catalog.pg_publication p WHERE p.pubname IN (" + in + ")" +
		" UNION ALL SELECT 'r' || r.oid || ':' || r.xmin FROM pg_catalog.pg_publication_rel r" +
		" JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid WHERE p.pubname IN (" + in + ")"
	if major >= 15 {
		sql += " UNION ALL SELECT 'n' || s.oid || ':' || s.xmin FROM pg_catalog.pg_publication_namespace s" +
			" JOIN pg_catalog.pg_publication p ON p.oid = s.pnpubid WHERE p.pubname IN (" + in + ")"
	}
	rows, err := query(ctx, conn, "SELECT coalesce(pg_catalog.string_agg(x, ',' ORDER BY x), '') FROM ("+sql+") f(x)")
	if err != nil {
		return "", fmt.Errorf("snapshot: reading publications: %w", err)
	}
	if len(rows) != 1 || rows[0][0] == nil {
		return "", fmt.Errorf("snapshot: reading publications: no result")
	}
	return *rows[0][0], nil
}

// describe reads, in the snapshot, what the copy needs to know of the published tables: names,
// kinds, replica identity, columns, key, types, partitions and sizes. Tables that did not exist
// at the snapshot's point are left out (the stream carries all their rows), and so are
// partitions whose partitioned ancestor is published too (the stream publishes their changes as
// the ancestor's).
func describe(ctx context.Context, conn *pgconn.PgConn, major int, pub map[uint32]*published, binary bool, blockSize int64) ([]*Table, error) {
	if len(pub) == 0 {
		return nil, nil
	}
	oids := make([]string, 0, len(pub))
	for oid := range pub {
		oids = append(oids, strconv.FormatUint(uint64(oid), 10))
	}
	sort.Strings(oids)
	in := strings.Join(oids, ", ")
	rels, err := query(ctx, conn, "SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident, "+
		"pg_catalog.pg_relation_size(c.oid), c.relhassubclass, "+
		"c.relispartition AND EXISTS (SELECT 1 FROM pg_catalog.pg_partition_ancestors(c.oid) a "+
		"WHERE a.relid <> c.oid AND a.relid IN ("+in+")) "+
		"FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "+
		"WHERE c.oid IN ("+in+") ORDER BY 1")
	if err != nil {
		return nil, fmt.Errorf("snapshot: reading tables: %w", err)
	}
	byOID := map[uint32]*Table{}
	var tables []*Table
	for _, r := range rels {
		oid, err := parseOID(r[0])
		if err != nil {
			return nil, err
		}
		if *r[7] == "t" {
			continue
		}
		p := pub[oid]
		t := &Table{OID: oid, Schema: *r[1], Name: *r[2], Publications: p.pubs, Partitioned: *r[3] == "p",
			types: map[uint32]*decoding.DataType{}}
		if len(p.filters) > 0 {
			t.RowFilter = strings.Join(p.filters, " OR ")
		}
		ns := t.Schema
		if ns == "pg_catalog" {
			ns = "" // as pgoutput sends it
		}
		t.Relation = &decoding.Relation{RelationID: oid, Namespace: ns, Name: t.Name, ReplicaIdentity: (*r[4])[0]}
		size, _ := strconv.ParseInt(*r[5], 10, 64)
		if !t.Partitioned {
			t.Size = size
			// A table with inheritance children is read without them: each child is published
			// (and copied) as a table of its own.
			t.sources = []source{{sqlName: t.sqlName(), only: *r[6] == "t", ranges: major >= 14 && *r[3] == "r",
				pages: (size + blockSize - 1) / blockSize}}
		}
		byOID[oid] = t
		tables = append(tables, t)
	}
	if len(tables) == 0 {
		return nil, nil
	}
	oids = oids[:0]
	for _, t := range tables {
		oids = append(oids, strconv.FormatUint(uint64(t.OID), 10))
	}
	in = strings.Join(oids, ", ")

	if err := describeColumns(ctx, conn, major, in, byOID, pub, binary); err != nil {
		return nil, err
	}
	if err := describeTypes(ctx, conn, tables); err != nil {
		return nil, err
	}
	// The partitions of the partitioned tables, each a source.
	var parts []string
	for _, t := range tables {
		if t.Partitioned {
			parts = append(parts, strconv.FormatUint(uint64(t.OID), 10))
		}
	}
	if len(parts) > 0 {
		leaves, err := query(ctx, conn, "SELECT r.root, n.nspname, c.relname, c.relkind, pg_catalog.pg_relation_size(c.oid) "+
			"FROM pg_catalog.unnest(ARRAY["+strings.Join(parts, ", ")+"]::pg_catalog.oid[]) r(root), "+
			"LATERAL pg_catalog.pg_partition_tree(r.root) p "+
			"JOIN pg_catalog.pg_class c ON c.oid = p.relid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "+
			"WHERE p.isleaf ORDER BY 1, c.oid")
		if err != nil {
			return nil, fmt.Errorf("snapshot: reading partitions: %w", err)
		}
		for _, l := range leaves {
			root, err := parseOID(l[0])
			if err != nil {
				return nil, err
			}
			t := byOID[root]
			size, _ := strconv.ParseInt(*l[4], 10, 64)
			t.Size += size
			t.sources = append(t.sources, source{sqlName: pgsession.QuoteQualified(*l[1], *l[2]), only: true,
				ranges: major >= 14 && *l[3] == "r", pages: (size + blockSize - 1) / blockSize})
		}
	}
	return tables, nil
}

// describeColumns fills in the relations' columns and key flags and the SELECT lists.
func describeColumns(ctx context.Context, conn *pgconn.PgConn, major int, in string, byOID map[uint32]*Table,
	pub map[uint32]*published, binary bool) error {
	generated := "''"
	if major >= 12 {
		generated = "a.attgenerated"
	}
	cols, err := query(ctx, conn, "SELECT a.attrelid, a.attnum, a.attname, a.atttypid, a.atttypmod, "+generated+", "+
		"t.typsend::pg_catalog.oid <> 0, "+
		"a.attnum = ANY (coalesce((SELECT i.indkey::pg_catalog.int2[] FROM pg_catalog.pg_index i "+
		"WHERE i.indrelid = a.attrelid AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident)) "+
		"LIMIT 1), '{}')) "+
		"FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "+
		"JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "+
		"WHERE a.attrelid IN ("+in+") AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2")
	if err != nil {
		return fmt.Errorf("snapshot: reading columns: %w", err)
	}
	exists := map[uint32]map[string]bool{} // the columns of each table in the snapshot
	for _, c := range cols {
		oid, err := parseOID(c[0])
		if err != nil {
			return err
		}
		t := byOID[oid]
		name, gen := *c[2], *c[5]
		if exists[oid] == nil {
			exists[oid] = map[string]bool{}
		}
		exists[oid][name] = true
		if attrs := pub[oid].attrs; attrs != nil {
			// The column list, or on 15+ the published columns: PostgreSQL 18 lists the
			// generated columns it publishes, earlier versions list generated columns they do
			// not publish.
			if !slices.Contains(attrs, name) || (gen != "" && major < 18) {
				continue
			}
		} else if gen != "" {
			continue
		}
		typ, err := parseOID(c[3])
		if err != nil {
			return err
		}
		mod, _ := strconv.ParseInt(*c[4], 10, 32)
		var flags uint8
		if t.Relation.ReplicaIdentity == 'f' || *c[7] == "t" {
			flags = 1
		}
		t.Relation.Columns = append(t.Relation.Columns, decoding.RelationColumn{Flags: flags, Name: name,
			TypeOID: typ, TypeMod: int32(mod)})
		expr, kind := pgsession.QuoteIdent(name), decoding.ColumnText
		if binary {
			if *c[6] == "t" {
				kind = decoding.ColumnBinary
			} else {
				// No send function: pgoutput sends the text output, so does the copy (a text
				// value's send format is its text).
				expr = "CASE WHEN " + expr + " IS NULL THEN NULL ELSE pg_catalog.format('%s', " + expr + ") END"
			}
		}
		t.exprs = append(t.exprs, expr)
		t.kinds = append(t.kinds, kind)
	}
	for _, t := range byOID {
		for _, a := range pub[t.OID].attrs {
			if !exists[t.OID][a] {
				return fmt.Errorf("%w: column %q of %s is published but did not exist when the snapshot was taken",
					ErrPublicationChanged, a, t)
			}
		}
	}
	return nil
}

// describeTypes describes the types at or above FirstGenbkiObjectId that the columns use, as
// pgoutput's Type message does: the type's own OID with the namespace ("" for pg_catalog) and
// name of its base type (a domain's, recursively).
func describeTypes(ctx context.Context, conn *pgconn.PgConn, tables []*Table) error {
	var oids []string
	for _, t := range tables {
		for _, c := range t.Relation.Columns {
			if c.TypeOID >= firstGenbkiOID {
				oids = append(oids, strconv.FormatUint(uint64(c.TypeOID), 10))
			}
		}
	}
	if len(oids) == 0 {
		return nil
	}
	slices.Sort(oids)
	oids = slices.Compact(oids)
	rows, err := query(ctx, conn, "WITH RECURSIVE b(oid, base) AS ("+
		"SELECT t.oid, t.oid FROM pg_catalog.pg_type t WHERE t.oid IN ("+strings.Join(oids, ", ")+") "+
		"UNION ALL SELECT b.oid, t.typbasetype FROM b JOIN pg_catalog.pg_type t ON t.oid = b.base WHERE t.typtype = 'd') "+
		"SELECT b.oid, n.nspname, t.typname FROM b JOIN pg_catalog.pg_type t ON t.oid = b.base "+
		"JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE t.typtype <> 'd'")
	if err != nil {
		return fmt.Errorf("snapshot: reading types: %w", err)
	}
	types := map[uint32]*decoding.DataType{}
	for _, r := range rows {
		oid, err := parseOID(r[0])
		if err != nil {
			return err
		}
		ns := *r[1]
		if ns == "pg_catalog" {
			ns = ""
		}
		types[oid] = &decoding.DataType{TypeOID: oid, Namespace: ns, Name: *r[2]}
	}
	for _, t := range tables {
		for _, c := range t.Relation.Columns {
			if dt, ok := types[c.TypeOID]; ok {
				t.types[c.TypeOID] = dt
			}
		}
	}
	return nil
}

// query runs a simple-protocol statement and returns its rows as text (nil for NULL).
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]*string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows [][]*string
	for _, r := range results {
		for _, row := range r.Rows {
			vals := make([]*string, len(row))
			for i, v := range row {
				if v != nil {
					s := string(v)
					vals[i] = &s
				}
			}
			rows = append(rows, vals)
		}
	}
	return rows, nil
}

func queryInt(ctx context.Context, conn *pgconn.PgConn, sql string) (int64, error) {
	rows, err := query(ctx, conn, sql)
	if err != nil {
		return 0, fmt.Errorf("snapshot: %s: %w", sql, err)
	}
	if len(rows) != 1 || len(rows[0]) != 1 || rows[0][0] == nil {
		return 0, fmt.Errorf("snapshot: %s: no value", sql)
	}
	return strconv.ParseInt(*rows[0][0], 10, 64)
}

func parseOID(s *string) (uint32, error) {
	if s == nil {
		return 0, fmt.Errorf("snapshot: NULL OID")
	}
	v, err := strconv.ParseUint(*s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("snapshot: OID %q: %w", *s, err)
	}
	return uint32(v), nil
}

func literals(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = pgsession.QuoteLiteral(s)
	}
	return strings.Join(out, ", ")
}
