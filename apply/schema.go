package apply

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
)

// SchemaChanges says which changes of the source's schema the Applier makes on the target.
type SchemaChanges int

const (
	// SchemaFixed (the zero value) changes nothing: a published table the target lacks stops Run
	// (ErrMissingTable), and a column the source adds stops it with an *ApplyError wrapping
	// ErrSchemaMismatch, until the target has them.
	SchemaFixed SchemaChanges = iota
	// SchemaAddColumns creates the published tables the target lacks, from the source's
	// definition (the published columns with their types and NOT NULL, and the primary key;
	// nothing else), in the schema of the source's name, which must exist on the target, as
	// must the columns' types: before the initial copy, when a session starts streaming, and
	// before the first change of a table that first appears in the stream (see the package
	// documentation, Migrations).
	//
	// It also adds to the target table a column the source's relation has and the target's
	// lacks, when the first change that needs it is applied, in that change's target
	// transaction: with the type the stream's description of the relation gives it (type and
	// typmod, as of the change; the type's schema and name read from the source's catalog of
	// types, and looked up on the target by them: a user-defined type, enum or domain must exist
	// there), nullable, without default. Columns the source drops or renames are
	// reported and left on the target.
	SchemaAddColumns
)

var schemaChangesNames = [...]string{SchemaFixed: "none", SchemaAddColumns: "add-columns"}

func (s SchemaChanges) String() string {
	if s >= 0 && int(s) < len(schemaChangesNames) {
		return schemaChangesNames[s]
	}
	return "SchemaChanges(" + strconv.Itoa(int(s)) + ")"
}

// ParseSchemaChanges parses "none" (or "") and "add-columns".
func ParseSchemaChanges(s string) (SchemaChanges, error) {
	switch strings.ToLower(s) {
	case "", "none":
		return SchemaFixed, nil
	case "add-columns":
		return SchemaAddColumns, nil
	}
	return 0, fmt.Errorf("%w: schema changes %q (want none or add-columns)", ErrInvalidConfig, s)
}

// sourceSQL is the Applier's ordinary connection to the source, for its catalog and sequences,
// opened when first needed and shared by the connections that need it.
type sourceSQL = pgsession.Shared

// sourceQuery runs sql on the source with text parameters.
func (a *Applier) sourceQuery(ctx context.Context, sql string, args ...string) ([][][]byte, error) {
	return a.source.Query(ctx, func(ctx context.Context) (*pgconn.PgConn, error) {
		o, err := a.cfg.sourceSQL("pgreorder apply " + a.cfg.Source.Slot)
		if err != nil {
			return nil, err
		}
		conn, err := pgsession.Connect(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("apply: connecting to the source: %w", err)
		}
		return conn, nil
	}, retry.Lost, sql, args...)
}

// closeSource closes the source connection, if open.
func (a *Applier) closeSource(ctx context.Context) { a.source.Close(ctx) }
