package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/snapshot"
)

// The published tables the target lacks. A session checks them all before it applies anything:
// the initial copy checks the tables it copies, a session that streams without a copy the
// tables the publications hold (one catalog query on each side). Missing tables stop Run with
// one *MissingTablesError naming all of them, or, with Config.SchemaChanges, are created from
// the source's definition first. A table that first appears in the stream later (added to a
// publication) is created by the connection that maps it (target.Options.CreateTable).

// MissingTablesError reports the published tables that do not exist on the target, all of them
// at once, or, with Config.SchemaChanges, those that cannot be created from the source's
// definition (then none was created). It wraps ErrMissingTable.
type MissingTablesError struct {
	Tables []MissingTable
	// Create is set when the tables were to be created (Config.SchemaChanges): each of Tables
	// names what keeps it from being created.
	Create bool
}

// MissingTable is a table of a MissingTablesError.
type MissingTable struct {
	Name string // the target table, quoted and qualified ("public"."t")
	// Schema is set when the table's schema does not exist on the target either: apply creates
	// tables, not schemas.
	Schema string
	// Column and Type are set when the type of the source's column Column does not exist on the
	// target (an enum, a domain, a type of an extension): Type as the source names it.
	Column, Type string
}

func (e *MissingTablesError) Error() string { return e.Named(configerr.Field.String) }

// Named returns the message with the field of its hint (SchemaChanges) named by name.
func (e *MissingTablesError) Named(name FieldNamer) string {
	var b strings.Builder
	b.WriteString("apply: target table does not exist: ")
	if e.Create {
		for i, t := range e.Tables {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString((&target.CreateError{Table: t.Name, Schema: t.Schema, Column: t.Column, Type: t.Type}).Error())
		}
		b.WriteString("; no table was created")
		return b.String()
	}
	var schemas []string
	for i, t := range e.Tables {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(t.Name)
		if t.Schema != "" && !slices.Contains(schemas, t.Schema) {
			schemas = append(schemas, t.Schema)
		}
	}
	them := "them"
	if len(e.Tables) == 1 {
		them = "it"
	}
	b.WriteString(" (tables are matched by schema and name: create " + them + " on the target, or let apply create " + them +
		" from the source's definition: " + name(schemaChangesField()) + ")")
	if len(schemas) > 0 {
		for i, s := range schemas {
			schemas[i] = pgsession.QuoteIdent(s)
		}
		b.WriteString("; the target has no schema " + strings.Join(schemas, ", ") + " either: create it first")
	}
	return b.String()
}

// sort orders the tables by name.
func (e *MissingTablesError) sort() {
	slices.SortFunc(e.Tables, func(x, y MissingTable) int { return strings.Compare(x.Name, y.Name) })
}

// Unwrap returns ErrMissingTable.
func (e *MissingTablesError) Unwrap() error { return ErrMissingTable }

// Retryable reports false: the target has to be put right.
func (e *MissingTablesError) Retryable() bool { return false }

// schemaChangesField is the field, and the value, that lets apply create missing tables.
func schemaChangesField() configerr.Field {
	return configerr.Field{Config: "apply", Path: "SchemaChanges", Value: "SchemaAddColumns", Arg: "add-columns"}
}

// publishedTable is a table the session applies: its OID on the source, its name (the target
// table's), and the columns published, which a table created for it has.
type publishedTable struct {
	oid  uint32
	name target.TableName
	cols []string
}

// publishedTablesQuery lists the tables the publications ($1) hold, as the stream publishes
// them (pg_publication_tables: partitions under their root with publish_via_partition_root),
// with their OIDs and the columns published: the publication's column list (every column
// without one), less generated columns before PostgreSQL 18, whose pgoutput never publishes
// them (18 lists them only when it does). A table two publications publish comes once per
// column list.
const publishedTablesQuery = `SELECT DISTINCT c.oid, t.schemaname::pg_catalog.text, t.tablename::pg_catalog.text,
	pg_catalog.array_to_json(ARRAY(SELECT a.attname FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY (t.attnames)
		AND (a.attgenerated = '' OR pg_catalog.current_setting('server_version_num')::int >= 180000)
		ORDER BY a.attnum))::pg_catalog.text
FROM pg_catalog.pg_publication_tables t
	JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname
	JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
WHERE t.pubname = ANY ($1::pg_catalog.text[])
ORDER BY 2, 3`

// tableCheckTimeout bounds the listing of the published tables when a session starts: on
// PostgreSQL 16 and later pg_publication_tables opens each table, and waits for a lock that a
// transaction holds on one (an ALTER TABLE still open, or prepared).
const tableCheckTimeout = 5 * time.Second

// checkTables checks, when a session streams without an initial copy, that the target has
// every table the publications hold (see ensureTables). When the source cannot list them within
// tableCheckTimeout, the check is left out, with a log line: a missing table then stops Run at
// its first change (or is created then, with Config.SchemaChanges).
func (s *session) checkTables(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, tableCheckTimeout)
	defer cancel()
	rows, err := s.a.sourceQuery(qctx, publishedTablesQuery, pgsession.QuoteTextArray(s.cfg.Source.Publications))
	if err != nil && ctx.Err() == nil && qctx.Err() != nil {
		s.a.abandonSource(ctx)
		s.log.Warn("the source did not list the published tables in time (a transaction holds a lock on one of them): "+
			"the target's tables are checked at their first change instead", "timeout", tableCheckTimeout)
		return nil
	}
	if err != nil {
		return fmt.Errorf("apply: listing the published tables on the source: %w", err)
	}
	var tables []publishedTable
	byOID := map[uint32]int{}
	for _, r := range rows {
		oid, err := strconv.ParseUint(string(r[0]), 10, 32)
		if err != nil {
			return fmt.Errorf("apply: listing the published tables on the source: OID %q", r[0])
		}
		var cols []string
		if err := json.Unmarshal(r[3], &cols); err != nil {
			return fmt.Errorf("apply: listing the published tables on the source: columns %q: %w", r[3], err)
		}
		i, ok := byOID[uint32(oid)]
		if !ok {
			i = len(tables)
			byOID[uint32(oid)] = i
			tables = append(tables, publishedTable{oid: uint32(oid), name: target.TableName{Schema: string(r[1]), Name: string(r[2])}})
		}
		for _, c := range cols { // publications with other column lists: the stream sends their union
			if !slices.Contains(tables[i].cols, c) {
				tables[i].cols = append(tables[i].cols, c)
			}
		}
	}
	return s.ensureTables(ctx, tables)
}

// abandonSource asks the source to cancel what its ordinary connection runs, and closes it: the
// next query opens another.
func (a *Applier) abandonSource(ctx context.Context) {
	a.source.mu.Lock()
	defer a.source.mu.Unlock()
	if a.source.conn == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tableCheckTimeout)
	defer cancel()
	a.source.conn.CancelRequest(cctx) // best effort: a backend waiting for a lock never reads the close
	a.source.conn.Close(cctx)
	a.source.conn = nil
}

// copyTables checks, before the initial copy, that the target has the tables it copies into
// (see ensureTables).
func (s *session) copyTables(ctx context.Context, tables []*snapshot.Table) error {
	pub := make([]publishedTable, len(tables))
	for i, t := range tables {
		cols := make([]string, len(t.Relation.Columns))
		for j, c := range t.Relation.Columns {
			cols[j] = c.Name
		}
		pub[i] = publishedTable{oid: t.OID, name: target.TableName{Schema: t.Schema, Name: t.Name}, cols: cols}
	}
	return s.ensureTables(ctx, pub)
}

// ensureTables looks for the tables on the target, in one query on the leader's connection, and
// stops with a *MissingTablesError naming every one it lacks; with Config.SchemaChanges it
// creates them from the source's definition instead, or, if one of them cannot be (a schema or
// a type the target lacks), creates none and names every one that cannot. Tables that have the
// name of one of the Applier's own tables on the target (progress, copy, ahead, conflict log,
// tombstones) are the records of another Applier, replicating the other way: they are left out.
func (s *session) ensureTables(ctx context.Context, tables []publishedTable) error {
	own := s.ownTables()
	names := make([]target.TableName, 0, len(tables))
	kept := make([]publishedTable, 0, len(tables))
	for _, t := range tables {
		if !own[t.name.Quoted()] {
			names = append(names, t.name)
			kept = append(kept, t)
		}
	}
	missing, err := target.MissingTables(ctx, s.leader.PG(), names)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	if len(missing) == 0 {
		return nil
	}
	if s.cfg.SchemaChanges == SchemaFixed {
		e := &MissingTablesError{}
		for _, m := range missing {
			mt := MissingTable{Name: m.Quoted()}
			if !m.SchemaExists {
				mt.Schema = m.Schema
			}
			e.Tables = append(e.Tables, mt)
		}
		e.sort()
		return e
	}
	byName := make(map[target.TableName]publishedTable, len(kept))
	for _, t := range kept {
		byName[t.name] = t
	}
	want := make([]publishedTable, len(missing))
	for i, m := range missing {
		want[i] = byName[m.TableName]
	}
	defs, err := s.a.sourceDefinitions(ctx, want)
	if err != nil {
		return err
	}
	stmts := make([]string, len(defs))
	e := &MissingTablesError{Create: true}
	for i, def := range defs {
		if def == nil {
			return fmt.Errorf("%w: %s: the source's catalog does not have the table any more (dropped since?): create it on "+
				"the target by hand", ErrMissingTable, want[i].name.Quoted())
		}
		stmt, err := target.CreateStatement(ctx, s.leader.PG(), def)
		var ce *target.CreateError
		if errors.As(err, &ce) {
			e.Tables = append(e.Tables, MissingTable{Name: ce.Table, Schema: ce.Schema, Column: ce.Column, Type: ce.Type})
			continue
		}
		if err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		stmts[i] = stmt
	}
	if len(e.Tables) > 0 {
		e.sort()
		return e
	}
	for i, def := range defs {
		if err := s.a.createTable(ctx, s.leader.PG(), def, stmts[i]); err != nil {
			return fmt.Errorf("apply: creating the target table %s from the source's definition: %w", def.Quoted(), err)
		}
	}
	return nil
}

// ownTables returns the quoted, qualified names of the tables the Applier keeps on the target.
func (s *session) ownTables() map[string]bool {
	progress := s.leader.Table(s.cfg.ProgressTable)
	own := map[string]bool{progress: true, target.CompanionTable(progress, "_copy"): true,
		target.CompanionTable(progress, "_ahead"): true}
	for _, n := range []string{s.cfg.Conflicts.LogTable, s.cfg.Conflicts.TombstoneTable, conflict.DefaultTombstoneTable} {
		if n != "" {
			own[s.leader.Table(n)] = true
		}
	}
	return own
}

// sourceColumnsQuery reads the columns of the tables whose OIDs are $1 from the source's
// catalog, in each table's order: name, type (schema and name in pg_type, modifier, and
// format_type without the modifier, for messages), NOT NULL, and the column's position in the
// primary key (NULL when it is not in it).
const sourceColumnsQuery = `SELECT a.attrelid, a.attname, tn.nspname, t.typname, a.atttypmod, pg_catalog.format_type(a.atttypid, NULL),
	a.attnotnull, pg_catalog.array_position(i.indkey::pg_catalog.int2[], a.attnum)
FROM pg_catalog.pg_attribute a
	JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
	JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
	LEFT JOIN pg_catalog.pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = ANY ($1::pg_catalog.oid[]) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum`

// sourceDefinitions reads the definitions of tables from the source's catalog, in one query:
// the published columns, in the source's order, with their types and NOT NULL, and the
// primary key when every one of its columns is published. A table the catalog no longer has
// (dropped since) is nil.
func (a *Applier) sourceDefinitions(ctx context.Context, tables []publishedTable) ([]*target.TableDef, error) {
	oids := make([]string, len(tables))
	for i, t := range tables {
		oids[i] = strconv.FormatUint(uint64(t.oid), 10)
	}
	rows, err := a.sourceQuery(ctx, sourceColumnsQuery, "{"+strings.Join(oids, ",")+"}")
	if err != nil {
		return nil, fmt.Errorf("apply: reading the definitions of the tables to create from the source's catalog: %w", err)
	}
	type column struct {
		def    target.ColumnDef
		keyPos int // -1: not in the primary key
	}
	byOID := map[string][]column{}
	for _, r := range rows {
		mod, _ := strconv.ParseInt(string(r[4]), 10, 32)
		c := column{def: target.ColumnDef{Name: string(r[1]), TypeSchema: string(r[2]), TypeName: string(r[3]), TypeMod: int32(mod),
			SourceType: string(r[5]), NotNull: string(r[6]) == "t"}, keyPos: -1}
		if r[7] != nil {
			c.keyPos, _ = strconv.Atoi(string(r[7]))
		}
		byOID[string(r[0])] = append(byOID[string(r[0])], c)
	}
	defs := make([]*target.TableDef, len(tables))
	for i, t := range tables {
		cols, ok := byOID[oids[i]]
		if !ok {
			continue
		}
		def := &target.TableDef{TableName: t.name}
		var key []column
		keyWhole := true
		for _, c := range cols {
			published := slices.Contains(t.cols, c.def.Name)
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
	return defs, nil
}

// createTable runs stmt, the CREATE TABLE of def, on conn (outside a transaction), and logs
// the table created.
func (a *Applier) createTable(ctx context.Context, conn *pgconn.PgConn, def *target.TableDef, stmt string) error {
	created, err := target.CreateTable(ctx, conn, stmt)
	if err != nil {
		return err
	}
	if !created {
		return nil // by another connection, meanwhile
	}
	a.stats.tablesCreated.Add(1)
	key := "none"
	if len(def.Key) > 0 {
		key = strings.Join(def.Key, ", ")
	}
	a.cfg.Logger.Info("created a target table from the source's definition", "table", def.Quoted(), "columns", len(def.Columns),
		"primary_key", key)
	return nil
}

// createStreamed creates the target table of a relation that a change names and the target
// lacks (target.Options.CreateTable): a table added to a publication after the session
// started. The definition is the source catalog's, for the columns the stream describes; the
// statement runs on a connection of its own, committed before the change is applied.
func (a *Applier) createStreamed(ctx context.Context, ri *target.Relation) error {
	ns := ri.Rel.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	t := publishedTable{oid: ri.Rel.RelationID, name: target.TableName{Schema: ns, Name: ri.Rel.Name}}
	for i := range ri.Rel.Columns {
		name, _, _ := ri.Column(i)
		t.cols = append(t.cols, name)
	}
	defs, err := a.sourceDefinitions(ctx, []publishedTable{t})
	if err != nil {
		return err
	}
	table := t.name.Quoted()
	if defs[0] == nil {
		return &target.ChangeError{Kind: target.KindMissingTable, Relation: table, Err: errors.New("no such table on the target, " +
			"and the source's catalog does not show it (dropped since, or created by a transaction it does not show yet): " +
			"create it on the target by hand")}
	}
	var c target.Counters
	tg, err := connectTarget(ctx, a.cfg.targetOptions(), "pgreorder apply "+a.cfg.Source.Slot+" ddl", &c)
	if err != nil {
		return err
	}
	defer tg.Close(context.WithoutCancel(ctx))
	stmt, err := target.CreateStatement(ctx, tg.PG(), defs[0])
	var ce *target.CreateError
	if errors.As(err, &ce) {
		return &target.ChangeError{Kind: target.KindMissingTable, Relation: table, Err: ce}
	}
	if err != nil {
		return err
	}
	err = a.createTable(ctx, tg.PG(), defs[0], stmt)
	if err != nil && target.StatementError(target.OpNone, err) != err { // refused by the target, not a lost connection
		return &target.ChangeError{Kind: target.KindMissingTable, Relation: table,
			Err: fmt.Errorf("creating it from the source's definition: %w", err)}
	}
	return err
}
