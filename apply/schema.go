package apply

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/target"
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

// addColumn adds column (as the source names it) of ri to the target table (quoted, qualified)
// on tg, in its open transaction (target.Options.AddColumn).
//
// The column's type is the one the stream's relation description gives (type OID and modifier,
// as of the change), named through the source's catalog of types. The source's catalog of columns
// is not read: the transaction that added the column may not be visible there yet, as the source
// sends a transaction once its commit is flushed and shows it to other sessions after that (much
// later when its COMMIT waits for a synchronous standby, which may be this Applier).
func (a *Applier) addColumn(ctx context.Context, tg *target.Conn, ri *target.Relation, table, column string) error {
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
	rows, err := a.sourceQuery(ctx, target.SourceTypeQuery, strconv.FormatUint(uint64(oid), 10), strconv.FormatInt(int64(mod), 10))
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
	a.stats.columnsAdded.Add(1)
	a.cfg.Logger.Info("added a column the source added to the target table", "table", table, "column", column, "type", dstType,
		"source_type", srcType)
	return nil
}

// schemaWatch follows the descriptions of each source relation in a session, to report the
// columns the source dropped or renamed.
type schemaWatch struct {
	last   map[uint32]*target.Relation // by source relation OID
	recent *target.Relation            // the last one noted: most changes name the relation of the one before
}

// noteRelation compares ri with the previous description of its relation, and reports the
// columns it no longer has: they stay on the target (and take NULL or their default in new rows).
func (s *session) noteRelation(ri *target.Relation) {
	w := &s.schema
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
			s.stats.columnsGone.Add(1)
			s.log.Warn("a column is gone from the source relation (dropped or renamed): it stays on the target, and new rows leave it "+
				"NULL or its default", "table", pgsession.QuoteQualified(ri.Rel.Namespace, ri.Rel.Name), "column", c.Name)
		}
	}
}

// typeNote adds to a refused value's error (ErrData) the columns of its table whose types differ
// between the source and the target (a type changed on one side): the error then names the
// table, the column and both types. It reads both catalogs, on connections of its own (the
// target's transaction has failed), within a few seconds; on any failure err is returned as it is.
func (s *session) typeNote(table string, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, serr := s.a.sourceQuery(ctx, target.ColumnTypesQuery, table)
	if serr != nil {
		return err
	}
	var c target.Counters
	tg, terr := connectTarget(ctx, s.cfg.targetOptions(), "pgreorder apply "+s.cfg.Source.Slot+" catalog", &c)
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
