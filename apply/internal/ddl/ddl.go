// Package ddl makes the target's tables follow the source's where apply may change them
// (apply.Config.SchemaChanges): it finds the published tables the target lacks and creates them
// from the source's definitions, adds a column the source added, reports the columns the source
// dropped or renamed, and names the columns whose types differ on the two sides when the target
// refuses a value. It reads the source's catalog through Schema.Source and writes the target
// through the connections it is given or opens with Schema.Connect; the statements themselves are
// package target's.
//
// Contract: a Schema is shared by the sessions of one Applier; Ensure, Definitions,
// CreateForChange, AddColumn and TypeNote may run concurrently. A Watch belongs to one session's
// leader.
package ddl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Schema is the Applier's side of the source's and the target's schemas.
type Schema struct {
	// Source runs a query on the source's catalog, with text parameters.
	Source func(ctx context.Context, sql string, args ...string) ([][][]byte, error)
	// Connect opens a target connection of its own, named after the session with suffix.
	Connect func(ctx context.Context, suffix string) (*target.Conn, error)
	Log     *slog.Logger

	// Counted: tables created, columns added, columns the source dropped or renamed.
	TablesCreated, ColumnsAdded, ColumnsGone *atomic.Int64
}

// Refused is a table Ensure did not find on the target, or, when it was to create it, one it
// cannot create: Schema when the target lacks its schema too, Column and Type when it lacks the
// type of one of its columns (as the source names it).
type Refused struct {
	Name                 string // quoted and qualified
	Schema, Column, Type string
}

// GoneError is Ensure's when the source's catalog no longer has a table to create (dropped since
// it was listed).
type GoneError struct{ Table string }

func (e *GoneError) Error() string {
	return e.Table + ": the source's catalog does not have the table any more (dropped since?): create it on the target by hand"
}

// Ensure looks for tables on the target, in one query on leader, and returns those it lacks;
// with create, it creates them from the source's definition instead, or, if one of them cannot
// be (a schema or a type the target lacks), creates none and returns every one that cannot.
// Tables named in own (quoted, qualified: the Applier's own tables) are left out. The refused
// tables are sorted by name.
func (d *Schema) Ensure(ctx context.Context, leader *target.Conn, tables []target.Published, own map[string]bool, create bool) ([]Refused, error) {
	names := make([]target.TableName, 0, len(tables))
	byName := make(map[target.TableName]target.Published, len(tables))
	for _, t := range tables {
		if !own[t.Name.Quoted()] {
			names = append(names, t.Name)
			byName[t.Name] = t
		}
	}
	missing, err := target.MissingTables(ctx, leader.PG(), names)
	if err != nil || len(missing) == 0 {
		return nil, err
	}
	var refused []Refused
	defer func() {
		slices.SortFunc(refused, func(x, y Refused) int { return strings.Compare(x.Name, y.Name) })
	}()
	if !create {
		for _, m := range missing {
			r := Refused{Name: m.Quoted()}
			if !m.SchemaExists {
				r.Schema = m.Schema
			}
			refused = append(refused, r)
		}
		return refused, nil
	}
	want := make([]target.Published, len(missing))
	for i, m := range missing {
		want[i] = byName[m.TableName]
	}
	defs, err := d.Definitions(ctx, want)
	if err != nil {
		return nil, err
	}
	stmts := make([]string, len(defs))
	for i, def := range defs {
		if def == nil {
			return nil, &GoneError{Table: want[i].Name.Quoted()}
		}
		stmt, err := target.CreateStatement(ctx, leader.PG(), def)
		var ce *target.CreateError
		if errors.As(err, &ce) {
			refused = append(refused, Refused{Name: ce.Table, Schema: ce.Schema, Column: ce.Column, Type: ce.Type})
			continue
		}
		if err != nil {
			return nil, err
		}
		stmts[i] = stmt
	}
	if len(refused) > 0 {
		return refused, nil
	}
	for i, def := range defs {
		if err := d.create(ctx, leader, def, stmts[i]); err != nil {
			return nil, fmt.Errorf("creating the target table %s from the source's definition: %w", def.Quoted(), err)
		}
	}
	return nil, nil
}

// Definitions reads the definitions of tables from the source's catalog, in one query: the
// published columns, in the source's order, with their types and NOT NULL, and the primary key
// when every one of its columns is published. A table the catalog no longer has (dropped since)
// is nil.
func (d *Schema) Definitions(ctx context.Context, tables []target.Published) ([]*target.TableDef, error) {
	rows, err := d.Source(ctx, target.SourceColumnsQuery, target.SourceColumnsArg(tables))
	if err != nil {
		return nil, fmt.Errorf("apply: reading the definitions of the tables to create from the source's catalog: %w", err)
	}
	return target.Definitions(rows, tables), nil
}

// create runs stmt, the CREATE TABLE of def, on tg (outside a transaction), and logs the table
// created.
func (d *Schema) create(ctx context.Context, tg *target.Conn, def *target.TableDef, stmt string) error {
	created, err := target.CreateTable(ctx, tg.PG(), stmt)
	if err == nil && created { // else by another connection, meanwhile
		d.created(def)
	}
	return err
}

// created counts and logs a table created from the source's definition.
func (d *Schema) created(def *target.TableDef) {
	d.TablesCreated.Add(1)
	key := "none"
	if len(def.Key) > 0 {
		key = strings.Join(def.Key, ", ")
	}
	d.Log.Info("created a target table from the source's definition", "table", def.Quoted(), "columns", len(def.Columns),
		"primary_key", key)
}

// CreateForChange creates the target table of a relation that a change names and the target
// lacks (target.Options.CreateTable): a table that first appears in the stream. The definition
// is the source catalog's, for the columns the stream describes (see target.CreateForChange).
func (d *Schema) CreateForChange(ctx context.Context, ri *target.Relation) error {
	ns := ri.Rel.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	t := target.Published{OID: ri.Rel.RelationID, Name: target.TableName{Schema: ns, Name: ri.Rel.Name}}
	for i := range ri.Rel.Columns {
		name, _, _ := ri.Column(i)
		t.Cols = append(t.Cols, name)
	}
	defs, err := d.Definitions(ctx, []target.Published{t})
	if err != nil {
		return err
	}
	connect := func(ctx context.Context) (*target.Conn, error) { return d.Connect(ctx, "ddl") }
	return target.CreateForChange(ctx, connect, t.Name.Quoted(), defs[0], d.created)
}

// AddColumn adds column (as the source names it) of ri to the target table (quoted, qualified)
// on tg, in its open transaction (target.Options.AddColumn).
//
// The column's type is the one the stream's relation description gives (type OID and modifier,
// as of the change), named through the source's catalog of types. The source's catalog of columns
// is not read: the transaction that added the column may not be visible there yet, as the source
// sends a transaction once its commit is flushed and shows it to other sessions after that (much
// later when its COMMIT waits for a synchronous standby, which may be this Applier).
func (d *Schema) AddColumn(ctx context.Context, tg *target.Conn, ri *target.Relation, table, column string) error {
	fail := func(format string, args ...any) error {
		return &target.ChangeError{Kind: target.KindSchemaMismatch, Relation: table, Err: fmt.Errorf(format, args...)}
	}
	var oid uint32
	var mod int32
	for i := range ri.Rel.Columns {
		if n, o, m := ri.Column(i); n == column {
			oid, mod = o, m
		}
	}
	rows, err := d.Source(ctx, target.SourceTypeQuery, strconv.FormatUint(uint64(oid), 10), strconv.FormatInt(int64(mod), 10))
	if err != nil {
		return fmt.Errorf("apply: reading the type of column %q of %s on the source: %w", column, table, err)
	}
	if len(rows) != 1 {
		return fail("column %q has a type (OID %d) that is not in the source's catalog (created by the transaction that "+
			"added the column, or dropped since): add the column to the target table by hand", column, oid)
	}
	r := rows[0]
	srcType := string(r[0])
	dstType, added, err := tg.AddColumn(ctx, table, column, string(r[1]), string(r[2]), mod, string(r[3]))
	if err != nil || !added {
		return err
	}
	d.ColumnsAdded.Add(1)
	d.Log.Info("added a column the source added to the target table", "table", table, "column", column, "type", dstType,
		"source_type", srcType)
	return nil
}

// Watch follows the descriptions of each source relation in a session, to report the columns
// the source dropped or renamed.
type Watch struct {
	last   map[uint32]*target.Relation // by source relation OID
	recent *target.Relation            // the last one noted: most changes name the relation of the one before
}

// Note compares ri with the previous description of its relation, and reports the columns it no
// longer has: they stay on the target (and take NULL or their default in new rows).
func (d *Schema) Note(w *Watch, ri *target.Relation) {
	if ri == w.recent {
		return
	}
	w.recent = ri
	id := ri.Rel.RelationID
	prev := w.last[id]
	if prev == ri {
		return
	}
	if w.last == nil {
		w.last = map[uint32]*target.Relation{}
	}
	w.last[id] = ri
	if prev == nil {
		return
	}
	have := make(map[string]bool, len(ri.Rel.Columns))
	for _, c := range ri.Rel.Columns {
		have[c.Name] = true
	}
	for _, c := range prev.Rel.Columns {
		if !have[c.Name] {
			d.ColumnsGone.Add(1)
			d.Log.Warn("a column is gone from the source relation (dropped or renamed): it stays on the target, and new rows leave it "+
				"NULL or its default", "table", pgsession.QuoteQualified(ri.Rel.Namespace, ri.Rel.Name), "column", c.Name)
		}
	}
}

// TypeNote adds to a refused value's error (ErrData) the columns of its table whose types differ
// between the source and the target (a type changed on one side): the error then names the
// table, the column and both types. It reads both catalogs, on connections of its own (the
// target's transaction has failed), within a few seconds; on any failure err is returned as it is.
func (d *Schema) TypeNote(table string, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, serr := d.Source(ctx, target.ColumnTypesQuery, table)
	if serr != nil {
		return err
	}
	tg, terr := d.Connect(ctx, "catalog")
	if terr != nil {
		return err
	}
	defer tg.Close(ctx)
	dst, terr := target.Query(ctx, tg.PG(), target.ColumnTypesQuery, table)
	if terr != nil {
		return err
	}
	diff := target.TypeDiffs(src, dst)
	if len(diff) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s: change the target's column type, ALTER TABLE %s ALTER COLUMN ... TYPE, or skip the transaction)",
		err, strings.Join(diff, "; "), table)
}
