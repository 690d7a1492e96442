package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/ddl"
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

// Unwrap returns ErrMissingTable.
func (e *MissingTablesError) Unwrap() error { return ErrMissingTable }

// Retryable reports false: the target has to be put right.
func (e *MissingTablesError) Retryable() bool { return false }

// schemaChangesField is the field, and the value, that lets apply create missing tables.
func schemaChangesField() configerr.Field {
	return configerr.Field{Config: "apply", Path: "SchemaChanges", Value: "SchemaAddColumns", Arg: "add-columns"}
}

// tableCheckTimeout bounds the listing of the published tables when a session starts: on
// PostgreSQL 16 and later pg_publication_tables opens each table, and waits for a lock that a
// transaction holds on one (an ALTER TABLE still open, or prepared).
const tableCheckTimeout = 5 * time.Second

// checkTables checks, when a session streams without an initial copy, that the target has
// every table the publications hold (see ensureTables), and returns them. When the source cannot
// list them within tableCheckTimeout, the check is left out, with a log line, and the tables are
// nil: a missing table then stops Run at its first change (or is created then, with
// Config.SchemaChanges).
func (s *session) checkTables(ctx context.Context) ([]target.Published, error) {
	qctx, cancel := context.WithTimeout(ctx, tableCheckTimeout)
	defer cancel()
	rows, err := s.a.sourceQuery(qctx, target.PublishedTablesQuery, pgsession.QuoteTextArray(s.cfg.Source.Publications))
	if err != nil && ctx.Err() == nil && qctx.Err() != nil {
		s.a.abandonSource(ctx)
		s.log.Warn("the source did not list the published tables in time (a transaction holds a lock on one of them): "+
			"the target's tables are checked at their first change instead, and tables added to the publications are "+
			"copied by a later session", "timeout", tableCheckTimeout)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("apply: listing the published tables on the source: %w", err)
	}
	tables, err := target.ParsePublished(rows)
	if err != nil {
		return nil, fmt.Errorf("apply: listing the published tables on the source: %w", err)
	}
	if tables == nil {
		tables = []target.Published{}
	}
	return tables, s.ensureTables(ctx, tables)
}

// abandonSource asks the source to cancel what its ordinary connection runs, and closes it: the
// next query opens another.
func (a *Applier) abandonSource(ctx context.Context) { a.source.Abandon(ctx, tableCheckTimeout) }

// copyTables checks, before the initial copy, that the target has the tables it copies into
// (see ensureTables).
func (s *session) copyTables(ctx context.Context, tables []*snapshot.Table) error {
	pub := make([]target.Published, len(tables))
	for i, t := range tables {
		cols := make([]string, len(t.Relation.Columns))
		for j, c := range t.Relation.Columns {
			cols[j] = c.Name
		}
		pub[i] = target.Published{OID: t.OID, Name: target.TableName{Schema: t.Schema, Name: t.Name}, Cols: cols}
	}
	return s.ensureTables(ctx, pub)
}

// ensureTables looks for the tables on the target and stops with a *MissingTablesError naming
// every one it lacks; with Config.SchemaChanges it creates them from the source's definition
// instead, or, if one of them cannot be (a schema or a type the target lacks), creates none and
// names every one that cannot (ddl.Schema.Ensure). Tables that have the name of one of the
// Applier's own tables on the target (progress, copy, tables, ahead, conflict log, tombstones)
// are the records of another Applier, replicating the other way: they are left out.
func (s *session) ensureTables(ctx context.Context, tables []target.Published) error {
	create := s.cfg.SchemaChanges != SchemaFixed
	refused, err := s.a.ddl.Ensure(ctx, s.leader, tables, s.tables.Own, create)
	if ge, ok := errors.AsType[*ddl.GoneError](err); ok {
		return fmt.Errorf("%w: %s", ErrMissingTable, ge)
	}
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	if len(refused) == 0 {
		return nil
	}
	e := &MissingTablesError{Create: create}
	for _, r := range refused {
		e.Tables = append(e.Tables, MissingTable{Name: r.Name, Schema: r.Schema, Column: r.Column, Type: r.Type})
	}
	return e
}
