package target

import (
	"context"
	"errors"

	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// MissingColumnError is the cause of a ChangeError when the target table lacks a column of the
// source relation.
type MissingColumnError struct {
	Table  string // quoted, qualified
	Column string // as the source names it, not quoted
}

func (e *MissingColumnError) Error() string { return e.Named(configerr.Field.String) }

// Named returns the message with the field of apply.Config it names (SchemaChanges) named by
// name.
func (e *MissingColumnError) Named(name configerr.Namer) string {
	return "the target table has no column " + pgsession.QuoteIdent(e.Column) + ": add it to " + e.Table +
		" on the target, or let apply add the columns the source adds (" +
		name(configerr.Field{Config: "apply", Path: "SchemaChanges", Value: "SchemaAddColumns", Arg: "add-columns"}) + ")"
}

// AddColumnFunc adds column of the source relation ri to the target table (quoted, qualified)
// on t, inside the target transaction t has open (Options.AddColumn).
type AddColumnFunc func(ctx context.Context, t *Conn, ri *Relation, table, column string) error

// mapWithColumns is Mapping's path when Options.AddColumn is set: each column the target table
// lacks is added by it (inside the open transaction: what is pending is sent first, so the
// transaction has begun), and the mapping is made again.
func (t *Conn) mapWithColumns(ctx context.Context, ri *Relation, m *Table, err error) (*Table, error) {
	for range len(ri.Rel.Columns) {
		var mc *MissingColumnError
		if !errors.As(err, &mc) {
			return m, err
		}
		if !t.inTxn {
			return nil, err
		}
		// The error may be older than a commit of another connection that added the column:
		// read the catalog again first.
		ri.forget()
		if m, err = ri.mapping(ctx, t.pg, t.replicaRole, t.opts.Binary); !errors.As(err, &mc) {
			return m, err
		}
		if ferr := t.FlushPending(ctx); ferr != nil {
			return nil, ferr
		}
		if aerr := t.opts.AddColumn(ctx, t, ri, mc.Table, mc.Column); aerr != nil {
			return nil, aerr
		}
		ri.forget()
		m, err = ri.mapping(ctx, t.pg, t.replicaRole, t.opts.Binary)
	}
	return m, err
}

// forget drops the mapping of ri, or the error that kept it from being made, so that the next
// change reads the target's catalog again.
func (ri *Relation) forget() {
	ri.mu.Lock()
	ri.m, ri.err = nil, nil
	ri.mu.Unlock()
}

// Column returns the source column i's name, type OID and type modifier as the stream described
// them.
func (ri *Relation) Column(i int) (name string, typeOID uint32, typeMod int32) {
	c := ri.Rel.Columns[i]
	return c.Name, c.TypeOID, c.TypeMod
}
