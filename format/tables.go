package format

import (
	"context"

	"github.com/pgreorder/pgreorder/decoding"
)

// Tables tells the Debezium events what pgoutput leaves out of a relation's description: the
// table's key, which columns are NOT NULL, their defaults, the labels of enum types. Package
// catalog reads it from the source database. Events uses it when Config.Tables is set: the
// event key is then the primary key (or the first unique index of NOT NULL columns) whatever the
// replica identity, and Connect schemas say which fields are optional, their defaults and an
// enum's allowed values, as Debezium's do.
//
// Table is called from the goroutines that encode events at once (one per copy worker): an
// implementation must be safe for concurrent use. It is called for each relation description
// the events meet (again after a Relation message describes the table anew), and may cache.
type Tables interface {
	Table(ctx context.Context, r *decoding.Relation) (*Table, error)
}

// Table is what Tables says of one table. A column of the relation that Columns lacks (dropped
// since) is taken as nullable, with no default.
type Table struct {
	// Key lists the columns of the event key, in the key's order: the primary key's, else those
	// of a unique index (valid, not partial, no expression) whose columns are all NOT NULL — the
	// replica identity index if it is one, else the first by name —, else none: nil.
	Key []string
	// Columns describes the table's columns by name.
	Columns map[string]TableColumn
}

// TableColumn is what Table says of one column.
type TableColumn struct {
	// NotNull is the column's NOT NULL constraint.
	NotNull bool
	// Default is the column's default expression as pg_get_expr prints it ("'x'::text",
	// "nextval('public.t_id_seq'::regclass)": package catalog reads it with an empty search_path,
	// so names outside pg_catalog are schema-qualified), "" for none.
	Default string
	// TypeName is the name of the column's type in pg_type (typname: "int4", "varchar", "mood").
	TypeName string
	// EnumLabels are the labels of an enum type in their order, nil for other types.
	EnumLabels []string
}
