package apply

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
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
type sourceSQL struct {
	mu   sync.Mutex
	conn *pgconn.PgConn
}

// query runs sql on the source with text parameters.
func (a *Applier) sourceQuery(ctx context.Context, sql string, args ...string) ([][][]byte, error) {
	src := &a.source
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.conn == nil || src.conn.IsClosed() {
		o, err := a.cfg.sourceSQL("pgreorder apply " + a.cfg.Source.Slot)
		if err != nil {
			return nil, err
		}
		conn, err := pgsession.Connect(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("apply: connecting to the source: %w", err)
		}
		src.conn = conn
	}
	rows, err := target.Query(ctx, src.conn, sql, args...)
	if err != nil && retry.Lost(err) {
		src.conn.Close(context.WithoutCancel(ctx))
		src.conn = nil
	}
	return rows, err
}

// closeSource closes the source connection, if open.
func (a *Applier) closeSource(ctx context.Context) {
	a.source.mu.Lock()
	defer a.source.mu.Unlock()
	if a.source.conn != nil {
		a.source.conn.Close(ctx)
		a.source.conn = nil
	}
}

// sourceTypeQuery reads a type from the source's catalog by its OID ($1), with a type modifier
// ($2): its format_type, its schema and name (through which the target finds it), and its
// format_type without the modifier.
const sourceTypeQuery = `SELECT pg_catalog.format_type(t.oid, $2::int), n.nspname, t.typname, pg_catalog.format_type(t.oid, NULL)
FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = $1::oid`

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
	rows, err := a.sourceQuery(ctx, sourceTypeQuery, strconv.FormatUint(uint64(oid), 10), strconv.FormatInt(int64(mod), 10))
	if err != nil {
		return fmt.Errorf("apply: reading the type of column %q of %s on the source: %w", column, table, err)
	}
	if len(rows) != 1 {
		return fail("column %q has a type (OID %d) that is not in the source's catalog (created by the transaction that "+
			"added the column, or dropped since): add the column to the target table by hand", column, oid)
	}
	r := rows[0]
	srcType := string(r[0])
	// The type as the target knows it, found by schema and name, with the source's typmod (the
	// same meaning on every version); the target's format_type writes it as its SQL.
	tr, err := target.Query(ctx, tg.PG(), `SELECT pg_catalog.format_type(t.oid, $3::int) FROM pg_catalog.pg_type t
		JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = $1 AND t.typname = $2`,
		string(r[1]), string(r[2]), strconv.FormatInt(int64(mod), 10))
	if err != nil {
		return target.StatementError(target.OpNone, err)
	}
	if len(tr) != 1 {
		return fail("column %q has type %s on the source, which does not exist on the target: create the type there "+
			"(as on the source) and start again", column, string(r[3]))
	}
	dstType := string(tr[0][0])
	// Another connection (a Parallel worker) may be adding the column in a transaction of its
	// own: once the table's lock is taken, that one committed (or rolled back), and the catalog
	// says whether the column is still missing.
	refused := func(what string, err error) error {
		if ce := target.StatementError(target.OpNone, err); ce != err {
			return fail("%s column %q (%s) of the target table: %w", what, column, dstType, err)
		}
		return err
	}
	if err := tg.PG().Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE").Close(); err != nil {
		return refused("locking the table to add", err)
	}
	have, err := target.Query(ctx, tg.PG(), `SELECT FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1)
		AND attname = $2 AND attnum > 0 AND NOT attisdropped`, table, column)
	if err != nil {
		return refused("looking for", err)
	}
	if len(have) > 0 {
		return nil // added meanwhile
	}
	if err := tg.PG().Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN "+pgsession.QuoteIdent(column)+" "+dstType).Close(); err != nil {
		return refused("adding", err)
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

// columnTypesQuery lists a table's columns with their types, by the table's quoted, qualified
// name ($1).
const columnTypesQuery = `SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// typeNote adds to a refused value's error (ErrData) the columns of its table whose types differ
// between the source and the target (a type changed on one side): the error then names the
// table, the column and both types. It reads both catalogs, on connections of its own (the
// target's transaction has failed), within a few seconds; on any failure err is returned as it is.
func (s *session) typeNote(table string, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, serr := s.a.sourceQuery(ctx, columnTypesQuery, table)
	if serr != nil {
		return err
	}
	var c target.Counters
	tg, terr := connectTarget(ctx, s.cfg.targetOptions(), "pgreorder apply "+s.cfg.Source.Slot+" catalog", &c)
	if terr != nil {
		return err
	}
	defer tg.Close(ctx)
	dst, terr := target.Query(ctx, tg.PG(), columnTypesQuery, table)
	if terr != nil {
		return err
	}
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
	if len(diff) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s: change the target's column type, ALTER TABLE %s ALTER COLUMN ... TYPE, or skip the transaction)",
		err, strings.Join(diff, "; "), table)
}
