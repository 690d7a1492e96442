package target

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Tables missing on the target: finding them (MissingTables), and creating them from a
// definition the caller read from the source's catalog (TableDef, CreateStatement,
// CreateTable), in the schema of the source's name. A created table has the columns, their
// types (looked up on the target by schema and name, with the source's type modifier), NOT
// NULL and the primary key: no default, constraint, index, trigger or storage option besides.

// TableName is a table's schema and name, as the catalog spells them (not quoted).
type TableName struct{ Schema, Name string }

// Quoted returns the name quoted and qualified, as mappings name target tables.
func (n TableName) Quoted() string { return pgsession.QuoteQualified(n.Schema, n.Name) }

// MissingTable is a table that MissingTables did not find, and whether its schema exists.
type MissingTable struct {
	TableName
	SchemaExists bool
}

// missingTablesQuery returns, of the names given as two arrays (schemas, names), those that
// name no table the mappings would find (relkind r or p, see relationQuery), by their ordinal
// in the arrays, with whether the schema exists.
//
// The unnest of several arrays is FROM-clause syntax (ROWS FROM), not a function of pg_catalog:
// it cannot be schema-qualified.
const missingTablesQuery = `SELECT x.i, EXISTS (SELECT FROM pg_catalog.pg_namespace n WHERE n.nspname = x.s)
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(s, r, i)
WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = x.s AND c.relname = x.r AND c.relkind IN ('r', 'p'))
ORDER BY x.i`

// MissingTables returns those of names that have no table on the target, in their order, in
// one query.
func MissingTables(ctx context.Context, conn *pgconn.PgConn, names []TableName) ([]MissingTable, error) {
	if len(names) == 0 {
		return nil, nil
	}
	schemas, rels := make([]string, len(names)), make([]string, len(names))
	for i, n := range names {
		schemas[i], rels[i] = n.Schema, n.Name
	}
	rows, err := Query(ctx, conn, missingTablesQuery, pgsession.QuoteTextArray(schemas), pgsession.QuoteTextArray(rels))
	if err != nil {
		return nil, fmt.Errorf("looking for the published tables on the target: %w", err)
	}
	out := make([]MissingTable, 0, len(rows))
	for _, r := range rows {
		i, err := strconv.Atoi(string(r[0]))
		if err != nil || i < 1 || i > len(names) {
			return nil, fmt.Errorf("looking for the published tables on the target: ordinal %q", r[0])
		}
		out = append(out, MissingTable{TableName: names[i-1], SchemaExists: string(r[1]) == "t"})
	}
	return out, nil
}

// ColumnDef is a column of a table to create, as the source's catalog describes it.
type ColumnDef struct {
	Name string // as the catalog spells it
	// TypeSchema and TypeName name the column's type in pg_type (an array type by its own
	// name, "_int4"); the target's type of that schema and name is used, with TypeMod.
	TypeSchema, TypeName string
	TypeMod              int32
	SourceType           string // the type as the source's format_type writes it, for messages
	NotNull              bool
}

// TableDef is the definition of a table to create on the target.
type TableDef struct {
	TableName
	Columns []ColumnDef
	Key     []string // the key's columns, in its order (the primary key made on the target); nil for none
}

// CreateError says why a table cannot be created from the source's definition: its schema, or
// the type of one of its columns, does not exist on the target. Neither is created.
type CreateError struct {
	Table  string // quoted, qualified
	Schema string // the schema that does not exist on the target, or ""
	Column string // the column whose type does not exist on the target, or ""
	Type   string // that type, as the source names it
}

func (e *CreateError) Error() string {
	if e.Schema != "" {
		return fmt.Sprintf("%s cannot be created from the source's definition: schema %s does not exist on the target "+
			"(create the schema there: tables are created, schemas are not)", e.Table, pgsession.QuoteIdent(e.Schema))
	}
	return fmt.Sprintf("%s cannot be created from the source's definition: column %s has type %s, which does not exist "+
		"on the target (create the type there, as on the source)", e.Table, pgsession.QuoteIdent(e.Column), e.Type)
}

// createTypesQuery checks that the schema $1 exists (the row of ordinal 0: "t" or "f") and
// names, on the target, the types given as three arrays (schemas, names, type modifiers), in
// the format_type of each (NULL when the target has no such type), by ordinal.
const createTypesQuery = `SELECT 0::bigint, EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)::pg_catalog.text
UNION ALL
SELECT x.i, pg_catalog.format_type(t.oid, x.m)
FROM unnest($2::text[], $3::text[], $4::int[]) WITH ORDINALITY AS x(s, n, m, i)
	LEFT JOIN (pg_catalog.pg_type t JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace)
	ON tn.nspname = x.s AND t.typname = x.n
ORDER BY 1`

// CreateStatement returns the CREATE TABLE statement of def for the target on conn, its types
// as the target names them, in one query; a schema or type the target lacks is a *CreateError.
func CreateStatement(ctx context.Context, conn *pgconn.PgConn, def *TableDef) (string, error) {
	schemas, names, mods := make([]string, len(def.Columns)), make([]string, len(def.Columns)), make([]string, len(def.Columns))
	for i, c := range def.Columns {
		schemas[i], names[i], mods[i] = c.TypeSchema, c.TypeName, strconv.FormatInt(int64(c.TypeMod), 10)
	}
	rows, err := Query(ctx, conn, createTypesQuery, def.Schema, pgsession.QuoteTextArray(schemas),
		pgsession.QuoteTextArray(names), "{"+strings.Join(mods, ",")+"}")
	if err != nil {
		return "", fmt.Errorf("reading the types of %s on the target: %w", def.Quoted(), err)
	}
	if len(rows) != len(def.Columns)+1 {
		return "", fmt.Errorf("reading the types of %s on the target: %d rows for %d columns", def.Quoted(), len(rows), len(def.Columns))
	}
	if string(rows[0][1]) != "true" {
		return "", &CreateError{Table: def.Quoted(), Schema: def.Schema}
	}
	types := make([]string, len(def.Columns))
	for i, c := range def.Columns {
		if rows[i+1][1] == nil {
			return "", &CreateError{Table: def.Quoted(), Column: c.Name, Type: c.SourceType}
		}
		types[i] = string(rows[i+1][1])
	}
	return createTableSQL(def, types), nil
}

// createTableSQL writes the CREATE TABLE statement of def with the columns' types given as the
// target's format_type writes them. Every name is quoted; the statement is one command.
func createTableSQL(def *TableDef, types []string) string {
	var b strings.Builder
	b.WriteString("CREATE TABLE " + def.Quoted() + " (")
	for i, c := range def.Columns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pgsession.QuoteIdent(c.Name) + " " + types[i])
		if c.NotNull {
			b.WriteString(" NOT NULL")
		}
	}
	if len(def.Key) > 0 {
		if len(def.Columns) > 0 {
			b.WriteString(", ")
		}
		b.WriteString("PRIMARY KEY (")
		for i, k := range def.Key {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pgsession.QuoteIdent(k))
		}
		b.WriteString(")")
	}
	b.WriteString(")")
	return b.String()
}

// CreateTable runs the statement CreateStatement made, on conn outside any transaction (it
// commits on its own), through the extended protocol, which takes one command only. It reports
// false, and no error, when the table was created meanwhile (by another connection).
func CreateTable(ctx context.Context, conn *pgconn.PgConn, stmt string) (bool, error) {
	_, err := conn.ExecParams(ctx, stmt, nil, nil, nil, nil).Close()
	switch {
	case err == nil:
		return true, nil
	case pgsession.IsCode(err, pgsession.DuplicateTable):
		return false, nil
	case pgsession.IsCode(err, pgsession.UniqueViolation): // of the catalog: another one committed meanwhile
		return false, nil
	}
	return false, err
}

// NoTableError is the cause of a ChangeError of KindMissingTable found while applying a change:
// the target has no table of the relation's schema and name.
type NoTableError struct {
	Table string // quoted, qualified
}

func (e *NoTableError) Error() string { return e.Named(configerr.Field.String) }

// Named returns the message with the field of apply.Config it names (SchemaChanges) named by
// name.
func (e *NoTableError) Named(name configerr.Namer) string {
	return "no such table on the target (tables are matched by schema and name): create " + e.Table +
		" on the target, or let apply create the tables it lacks from the source's definition (" + name(schemaChangesField) + ")"
}

// schemaChangesField is the field of apply.Config, and its value, that lets apply create the
// tables and add the columns the target lacks.
var schemaChangesField = configerr.Field{Config: "apply", Path: "SchemaChanges", Value: "SchemaAddColumns", Arg: "add-columns"}

// CreateTableFunc creates the target table of the source relation ri, which the target lacks,
// from the source's definition, outside the transaction t may have open (Options.CreateTable).
// It returns a *ChangeError when the table cannot be created.
type CreateTableFunc func(ctx context.Context, ri *Relation) error

// mapWithTable is Mapping's path when Options.CreateTable is set and the target lacks ri's
// table: the table is created (unless another connection created it meanwhile), and the
// mapping made again.
func (t *Conn) mapWithTable(ctx context.Context, ri *Relation, m *Table, err error) (*Table, error) {
	var ce *ChangeError
	if !errors.As(err, &ce) || ce.Kind != KindMissingTable {
		return m, err
	}
	// The error may be older than a commit of another connection that created the table.
	ri.forget()
	if m, err = ri.mapping(ctx, t.pg, t.replicaRole, t.opts.Binary); !errors.As(err, &ce) || ce.Kind != KindMissingTable {
		return m, err
	}
	if cerr := t.opts.CreateTable(ctx, ri); cerr != nil {
		return nil, cerr
	}
	ri.forget()
	return ri.mapping(ctx, t.pg, t.replicaRole, t.opts.Binary)
}

// CreateForChange creates def, the target table (quoted, qualified) a change names and the
// target lacks (a table added to a publication after the session started), on a connection of
// its own that connect opens, committed before the change is applied; created is called when it
// made the table. A def of nil (the source's catalog does not show the table), a schema or type
// the target lacks, or a statement the target refuses is a *ChangeError of KindMissingTable.
func CreateForChange(ctx context.Context, connect func(context.Context) (*Conn, error), table string, def *TableDef,
	created func(*TableDef)) error {
	if def == nil {
		return &ChangeError{Kind: KindMissingTable, Relation: table, Err: errors.New("no such table on the target, " +
			"and the source's catalog does not show it (dropped since, or created by a transaction it does not show yet): " +
			"create it on the target by hand")}
	}
	tg, err := connect(ctx)
	if err != nil {
		return err
	}
	defer tg.Close(context.WithoutCancel(ctx))
	stmt, err := CreateStatement(ctx, tg.PG(), def)
	var ce *CreateError
	if errors.As(err, &ce) {
		return &ChangeError{Kind: KindMissingTable, Relation: table, Err: ce}
	}
	if err != nil {
		return err
	}
	made, err := CreateTable(ctx, tg.PG(), stmt)
	if err != nil && StatementError(OpNone, err) != err { // refused by the target, not a lost connection
		return &ChangeError{Kind: KindMissingTable, Relation: table, Err: fmt.Errorf("creating it from the source's definition: %w", err)}
	}
	if err == nil && made {
		created(def)
	}
	return err
}
