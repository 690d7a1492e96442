package target

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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

// AddColumn adds column (as the source names it) of type typeSchema.typeName with modifier mod
// (the source's, the same meaning on every version) to table (quoted, qualified) on t, in its
// open transaction, unless another connection added it meanwhile. It returns the type as the
// target writes it, and whether it added the column; a type the target lacks, or a column it
// refuses, is a *ChangeError of KindSchemaMismatch naming sourceType.
func (t *Conn) AddColumn(ctx context.Context, table, column, typeSchema, typeName string, mod int32, sourceType string) (string, bool, error) {
	fail := func(format string, args ...any) error {
		return &ChangeError{Kind: KindSchemaMismatch, Relation: table, Err: fmt.Errorf(format, args...)}
	}
	tr, err := Query(ctx, t.pg, `SELECT pg_catalog.format_type(t.oid, $3::int) FROM pg_catalog.pg_type t
		JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = $1 AND t.typname = $2`,
		typeSchema, typeName, strconv.FormatInt(int64(mod), 10))
	if err != nil {
		return "", false, StatementError(OpNone, err)
	}
	if len(tr) != 1 {
		return "", false, fail("column %q has type %s on the source, which does not exist on the target: create the type there "+
			"(as on the source) and start again", column, sourceType)
	}
	dstType := string(tr[0][0])
	// Another connection (a Parallel worker) may be adding the column in a transaction of its
	// own: once the table's lock is taken, that one committed (or rolled back), and the catalog
	// says whether the column is still missing.
	refused := func(what string, err error) error {
		if ce := StatementError(OpNone, err); ce != err {
			return fail("%s column %q (%s) of the target table: %w", what, column, dstType, err)
		}
		return err
	}
	if err := t.pg.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE").Close(); err != nil {
		return dstType, false, refused("locking the table to add", err)
	}
	have, err := Query(ctx, t.pg, `SELECT FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1)
		AND attname = $2 AND attnum > 0 AND NOT attisdropped`, table, column)
	if err != nil {
		return dstType, false, refused("looking for", err)
	}
	if len(have) > 0 {
		return dstType, false, nil // added meanwhile
	}
	if err := t.pg.Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN "+pgsession.QuoteIdent(column)+" "+dstType).Close(); err != nil {
		return dstType, false, refused("adding", err)
	}
	return dstType, true, nil
}

// SourceTypeQuery reads a type from the source's catalog by its OID ($1), with a type modifier
// ($2): its format_type, its schema and name (through which the target finds it), and its
// format_type without the modifier.
const SourceTypeQuery = `SELECT pg_catalog.format_type(t.oid, $2::int), n.nspname, t.typname, pg_catalog.format_type(t.oid, NULL)
FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = $1::oid`

// ColumnTypesQuery lists a table's columns with their types, by the table's quoted, qualified
// name ($1).
const ColumnTypesQuery = `SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// TypeDiffs compares the rows of ColumnTypesQuery on the source (src) and the target (dst), and
// says, for each column both have, with a type that differs, what each side has.
func TypeDiffs(src, dst [][][]byte) []string {
	types := make(map[string]string, len(dst))
	for _, r := range dst {
		types[string(r[0])] = string(r[1])
	}
	var diff []string
	for _, r := range src {
		if t, ok := types[string(r[0])]; ok && t != string(r[1]) {
			diff = append(diff, fmt.Sprintf("column %s is %s on the source and %s on the target", pgsession.QuoteIdent(string(r[0])), r[1], t))
		}
	}
	return diff
}
