package target

import (
	"bytes"
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/copycodec"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Tuning of the statements sent to the target.
const (
	// copyMinRows is the shortest run of inserts into one table that goes through COPY; shorter
	// runs are INSERT statements in the batch, which cost no round trip of their own.
	copyMinRows = 4
	// insertBufMax bounds the bytes of a run of inserts held before it is sent.
	insertBufMax = 1 << 20
	// BatchMaxOps and batchMaxBytes bound a batch of statements before it is sent.
	BatchMaxOps   = 1000
	batchMaxBytes = 1 << 20
)

// Conn is one connection to the target database and the transaction it is applying. Changes
// are not sent one statement at a time: inserts into one table gather into a run that becomes a
// COPY (or INSERTs when short), other statements gather into a batch sent in one round trip
// with its results checked in order, and the commit goes in the last batch with the progress
// row. A Conn is used by one goroutine.
type Conn struct {
	PG          *pgconn.PgConn
	PID         uint32
	name        string            // application_name
	names       map[string]string // the configured table names, resolved (see Table)
	ReplicaRole bool              // session_replication_role = replica took effect
	opts        *Options
	log         *slog.Logger
	stats       *Counters
	InitialCopy bool // a connection of the initial copy: its rows count in InitialCopyRows

	// The statements prepared on the connection, by relation and shape, the most recently used
	// at the front of lru; gen counts the batches sent (a statement used since the last one is
	// in the batch being built and is not evicted), deallocate names evicted statements.
	stmts      map[stmtKey]*list.Element
	lru        list.List
	nextStmt   int
	gen        uint64
	deallocate []string

	InTxn bool
	batch *pgconn.Batch
	ops   []batchOp
	bytes int // encoded bytes in batch (approximate)

	// The run of inserts not yet sent: rows of ins, each field as in COPY binary (a 4-byte
	// length, -1 for NULL, then the bytes).
	ins       *Table
	insBinary bool // the run's values are binary ('b'), else text
	insBuf    []byte
	insRows   int
	copyBuf   []byte
	params    [][]byte
	formats   []int16
	shape     []byte

	pendingPrepare []prepare                           // statements to prepare before the next batch
	indexes        map[*Relation]*detect.Indexes       // with conflict detection: the tables' unique indexes
	settle         func(context.Context) (bool, error) // see SetSettle
	wrote          bool                                // a resolution of the batch's conflicts wrote a row (see resolveAll)
	later          bool                                // a later statement of the batch changed the table of the one resolved (see resolveAll)
	stepwise       bool                                // see Stepwise
	progress       *stmt                               // the progress upsert (see PrepareProgress)
	ahead          *stmt                               // the worker's row upsert of relaxed commit order (see PrepareAhead)

	det    detect.Detector // conflict detection (see resolve.go and package detect)
	Origin string          // the replication origin set up in the session, or ""

	// The rows the open target transaction applied, added to the stats once it commits (a
	// transaction rolled back and applied again counts its rows once). They are counted as the
	// results of the batch arrive, in its order; rowMarks are the counts at each savepoint whose
	// result arrived, which a rollback to it restores.
	rows     rowCounts
	rowMarks []rowMark

	// Set-based apply (see coalesce.go): whether changes are held, what is held, the tables whose
	// set statements are in flight, and the source transaction of the change sent again.
	coalesce    bool
	co          coalescer
	failed      []*netTable
	srcOverride int32
	// Set statements that succeeded, and that failed and went again row by row (for tests).
	setDone, setFallbacks int
}

// MaxStatements bounds the statements prepared on one target connection: past it, the least
// recently used are deallocated (and prepared again when needed). Each costs the server memory
// for its plan, and a target connection may write many tables. A variable for tests.
var MaxStatements = 256

type stmtKey struct {
	ri    *Relation
	shape string
}

// stmt is a prepared statement for one shape of change of one relation.
type stmt struct {
	name    string
	nparams int
	key     stmtKey
	gen     uint64 // the batch that last used it (target.gen)
	ready   bool   // prepared on the server
	cols    []int  // per parameter: the source column it carries

	// With conflict detection: the statement without its checks (plain: a plain INSERT, or an
	// UPDATE or DELETE whatever origin changed the row last), its parameter types, how its WHERE
	// identifies the row (where: the shape of the condition, full: REPLICA IDENTITY FULL), and
	// whether it may violate a unique constraint (risky: an UPDATE that sets a column of one).
	plain string
	oids  []uint32
	where []byte
	full  bool
	risky bool
}

// batchOp describes one statement of a batch, to check its result.
type batchOp struct {
	op   byte   // 'I', 'U', 'D', 'T', or 0 for transaction control
	rel  *Table // the table, for I, U and D
	name string // the tables, for T

	// With conflict detection (see detect.Detector.Keep): the statement, its parameters kept at
	// (arg, narg) (the identity's from keyAt on), and for an UPDATE the new row at (row, nrow).
	st        *stmt
	arg, narg int32
	keyAt     int32
	row, nrow int32
	guarded   bool  // sent after SAVEPOINT pgr_guard: a unique violation is an update_exists
	check     bool  // the commit's check (see commitCheck)
	set       bool  // a set statement, or the savepoint around them (see coalesce.go)
	setEnd    bool  // the release of that savepoint: the set statements succeeded
	src       int32 // the source transaction, in srcs

	// For a SAVEPOINT (markSave) or ROLLBACK TO SAVEPOINT (markRollback) of subtransaction
	// sub: the row counts to keep or restore once its result arrives.
	mark int8
	sub  uint32
}

const (
	markSave     = 1
	markRollback = 2
)

// rowMark is the row count of the target transaction at the savepoint of subtransaction sub.
type rowMark struct {
	sub  uint32
	rows rowCounts
}

// Options are what a target connection takes of the applier's configuration.
type Options struct {
	ConnConfig    *pgconn.Config // made by pgconn.ParseConfig; or nil, and ConnString
	ConnString    string
	BeforeConnect func(ctx context.Context, cfg *pgconn.Config) error
	Logger        *slog.Logger
	// Tables are the configured table names resolved when a connection opens (see Table).
	Tables []string
	Slot   string // the slot applied: it names the conflict log rows and the tombstone connection
	// SynchronousCommit: commits wait for the target's WAL flush (else synchronous_commit is off
	// on the connection, but for a commit asked to be synchronous).
	SynchronousCommit bool
	Binary            bool // values come in binary: the target's column types must be the source's
	Now               func() time.Time

	// AddColumn, when set, adds a column the target table lacks (see schema.go).
	AddColumn AddColumnFunc
}

// targetConfig returns the target's connection configuration: Config.TargetConfig, or
// Config.Target parsed.
func targetConfig(o *Options) (*pgconn.Config, error) {
	pc, err := pgsession.ConnConfig(o.ConnConfig, o.ConnString)
	if err != nil {
		return nil, configError("Target: %w", err)
	}
	return pc, nil
}

// Dial opens a connection to the target, named name (its application_name), with the settings
// pinned on a pgsession.Target connection, whatever ALTER DATABASE, ALTER ROLE, the server's
// configuration or the connection string say: they change how the SQL and the values apply
// sends are read, or could end a session apply keeps open. Before search_path is pinned, the
// configured table names that are not qualified are resolved in the user's own search_path
// (resolveNames; see Table). The connection is not set up to apply changes: Connect does that.
func Dial(ctx context.Context, o *Options, name string) (*Conn, error) {
	pc, err := targetConfig(o)
	if err != nil {
		return nil, err
	}
	var names map[string]string
	var resolveErr error
	conn, err := pgsession.Connect(ctx, pgsession.Options{Kind: pgsession.Target, Config: pc, BeforeConnect: o.BeforeConnect,
		ApplicationName: name, ForceApplicationName: true, Logger: o.Logger,
		BeforeSearchPath: func(ctx context.Context, conn *pgconn.PgConn) error {
			names, resolveErr = resolveNames(ctx, conn, o.Tables)
			return resolveErr
		}})
	switch {
	case resolveErr != nil:
		return nil, resolveErr
	case errors.Is(err, pgsession.ErrNotParsed):
		return nil, configError("TargetConfig must be made by pgconn.ParseConfig")
	case err != nil:
		return nil, fmt.Errorf("apply: connecting to the target: %w", err)
	}
	return &Conn{PG: conn, PID: conn.PID(), name: name, names: names, opts: o, log: o.Logger.With("conn", name),
		det: detect.Detector{Now: o.Now}, srcOverride: -1}, nil
}

// resolveNames qualifies the configured table names that have no schema, as the server would
// in the user's search_path: the schema of an existing table of that name, or else the one a
// CREATE TABLE would use. The query (one round trip) names its operators and functions with
// their schema: the search_path is the user's here.
func resolveNames(ctx context.Context, conn *pgconn.PgConn, tables []string) (map[string]string, error) {
	names := map[string]string{}
	var bare []string // the names without a schema, quoted
	var keys []string
	for _, n := range tables {
		if _, done := names[n]; done || n == "" {
			continue
		}
		parts, err := ParseQualified(n)
		if err != nil {
			return nil, configError("table name %q: %v", n, err)
		}
		names[n] = pgsession.QuoteQualified(parts...)
		if len(parts) == 1 {
			bare, keys = append(bare, pgsession.QuoteIdent(parts[0])), append(keys, n)
		}
	}
	if len(bare) == 0 {
		return names, nil
	}
	var sql strings.Builder
	sql.WriteString("SELECT pg_catalog.current_schema()")
	for i := range bare {
		fmt.Fprintf(&sql, `, (SELECT n.nspname FROM pg_catalog.pg_class c, pg_catalog.pg_namespace n
			WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($%d) AND n.oid OPERATOR(pg_catalog.=) c.relnamespace)`, i+1)
	}
	rows, err := Query(ctx, conn, sql.String(), bare...)
	if err != nil {
		return nil, fmt.Errorf("apply: looking up the tables %s on the target: %w", strings.Join(bare, ", "), err)
	}
	for i, n := range keys {
		schema := rows[0][i+1]
		if schema == nil {
			schema = rows[0][0]
		}
		if schema == nil {
			return nil, configError("table %s: the target's search_path names no schema that exists: qualify the table "+
				"name with its schema", bare[i])
		}
		names[n] = pgsession.QuoteIdent(string(schema)) + "." + bare[i]
	}
	return names, nil
}

// Connect opens a connection to the target with the session settings apply relies on.
func Connect(ctx context.Context, o *Options, name string, stats *Counters) (*Conn, error) {
	t, err := Dial(ctx, o, name)
	if err != nil {
		return nil, err
	}
	t.stats = stats
	conn := t.PG
	// As PostgreSQL's subscriber: replicated changes do not fire ordinary triggers or foreign
	// key checks. Setting it takes a superuser (or, 15+, a role granted SET on it).
	if !o.SynchronousCommit {
		if err := conn.Exec(ctx, "SET synchronous_commit = off").Close(); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("apply: setting up the target connection: %w", err)
		}
	}
	if err := conn.Exec(ctx, "SET session_replication_role = replica").Close(); err == nil {
		t.ReplicaRole = true
	} else if !pgsession.IsCode(err, "42501") {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("apply: setting up the target connection: %w", err)
	}
	return t, nil
}

// Table returns a configured table name (Config.ProgressTable, conflict.Config.LogTable or
// TombstoneTable, or conflict.DefaultTombstoneTable) quoted and qualified, as resolved when the
// connection was opened.
func (t *Conn) Table(name string) string {
	if q, ok := t.names[name]; ok {
		return q
	}
	parts, _ := ParseQualified(name) // checked by the caller (see ParseQualified)
	return pgsession.QuoteQualified(parts...)
}

// Close closes the connection; an open transaction is rolled back by the server.
func (t *Conn) Close(ctx context.Context) {
	if t != nil && !t.PG.IsClosed() {
		t.PG.Close(ctx)
	}
}

// Begin starts a transaction applying source transaction xid (see Source); BEGIN goes out
// with the first batch.
func (t *Conn) Begin(xid uint32, c *detect.SourceCommit) {
	t.InTxn = true
	t.Control("BEGIN")
	t.Source(xid, c)
}

// Control appends a statement without parameters or result to check.
func (t *Conn) Control(sql string) {
	t.newBatch()
	t.batch.ExecParams(sql, nil, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
	t.bytes += len(sql) + 32
}

func (t *Conn) newBatch() {
	if t.batch == nil {
		t.batch = &pgconn.Batch{}
	}
}

// Savepoint takes a savepoint before the first change of subtransaction sub.
func (t *Conn) Savepoint(ctx context.Context, sub uint32) error {
	if err := t.unhold(ctx); err != nil {
		return err
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	if err := t.settleChecks(ctx); err != nil {
		return err
	}
	t.Control("SAVEPOINT s" + strconv.FormatUint(uint64(sub), 10))
	t.ops[len(t.ops)-1].mark, t.ops[len(t.ops)-1].sub = markSave, sub
	t.det.Savepoint(sub)
	return nil
}

// RollbackTo undoes everything since the savepoint of sub.
func (t *Conn) RollbackTo(ctx context.Context, sub uint32) error {
	if err := t.unhold(ctx); err != nil {
		return err
	}
	t.dropInserts() // not sent yet: nothing to undo on the server
	if err := t.settleChecks(ctx); err != nil {
		return err
	}
	t.Control("ROLLBACK TO SAVEPOINT s" + strconv.FormatUint(uint64(sub), 10))
	t.ops[len(t.ops)-1].mark, t.ops[len(t.ops)-1].sub = markRollback, sub
	t.det.RollbackTo(sub)
	return t.maybeFlush(ctx)
}

// Rollback ends the transaction without applying it. Statements not sent are dropped.
func (t *Conn) Rollback(ctx context.Context) error {
	t.co, t.failed = t.co.next(), nil
	t.dropInserts()
	t.batch, t.ops, t.bytes = nil, t.ops[:0], 0
	t.det.Rollback()
	t.DropRows()
	if !t.InTxn {
		return nil
	}
	t.InTxn = false
	return t.PG.Exec(ctx, "ROLLBACK").Close()
}

// FlushPending sends every statement and insert not sent yet.
func (t *Conn) FlushPending(ctx context.Context) error {
	if err := t.flushSets(ctx); err != nil {
		return err
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	return t.FlushBatch(ctx)
}

// Commit sends what is pending, the progress row for end, and COMMIT, in one round trip when
// no COPY is pending. Without Config.SynchronousCommit, sync makes this commit wait for the WAL flush.
func (t *Conn) Commit(ctx context.Context, key ProgressKey, end decoding.LSN, sync bool) error {
	if t.progress == nil {
		return errors.New("apply: the progress statement is not prepared on the target connection")
	}
	return t.commit(ctx, t.progress, key.Args(end), end, sync)
}

// commit is Commit, with the progress statement and its parameters given; end is the source
// transaction's end LSN, for the origin and the stats.
func (t *Conn) commit(ctx context.Context, progress *stmt, args [][]byte, end decoding.LSN, sync bool) error {
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	if err := t.queueSets(ctx); err != nil {
		return err
	}
	check := t.hasChecked()
	for {
		t.newBatch()
		if check {
			t.commitCheck()
		}
		if t.Origin != "" {
			t.originXact(end)
		}
		t.det.CompleteReports()
		t.queueLogRows()
		t.batch.ExecPrepared(progress.name, args, nil, nil)
		t.ops = append(t.ops, batchOp{})
		if sync && !t.opts.SynchronousCommit {
			t.Control("SET LOCAL synchronous_commit = on")
		}
		t.Control("COMMIT")
		t.InTxn = false
		err := t.FlushBatch(ctx)
		if err == errSetFailed {
			// A set statement failed: its changes go again, row by row, and then the commit.
			t.InTxn = true
			if err = t.replayFailed(ctx); err == nil {
				err = t.FlushInserts(ctx)
			}
			if err == nil {
				check = t.hasChecked()
				continue
			}
		}
		if err == errRecommit {
			// A checked statement of the batch met a conflict: the commit was held back and the
			// conflict resolved; commit now.
			t.InTxn, check = true, false
			continue
		}
		if err == nil {
			break
		}
		var ce *ChangeError
		if errors.As(err, &ce) && ce.Op == OpNone {
			ce.Op = OpCommit // a deferred constraint
		}
		t.det.DropReports()
		// The commit may not have been sent (a conflict held it back and its resolution
		// failed): a rollback must end the transaction.
		t.InTxn = true
		return err
	}
	t.det.Committed(&t.stats.Conflicts, t.log)
	t.CountRows()
	t.stats.Applied(end) // last: a reader that sees end sees the commit's conflicts counted
	return nil
}

// Source names the source transaction the target applies, for conflict reports and the
// origin's commit time: its xid, and once its commit arrived, c.
func (t *Conn) Source(xid uint32, c *detect.SourceCommit) {
	t.det.Source(xid, c)
}

// FlushWAL makes every commit that returned on the target before it durable, and writes the
// progress row at args' position (never moving it back), with one synchronous transaction.
//
// Why it is durable: PostgreSQL waits for the WAL flush at COMMIT (RecordTransactionCommit) only
// when the transaction wrote WAL before its commit record and synchronous_commit is not off; a
// transaction that only takes an xid commits asynchronously whatever synchronous_commit says, and
// flushes nothing. This one writes the progress row (an INSERT or an UPDATE, which always writes
// a heap record, even when the value does not change) with synchronous_commit on, so its COMMIT
// returns only once the WAL is flushed up to its commit record, past every record inserted before
// it: the commits that returned before it. The upsert returns pg_current_wal_insert_lsn() as it
// stood after those commits; after COMMIT, pg_current_wal_flush_lsn() must be at or past it, and
// is checked, so that a server that commits this transaction without flushing is found out
// rather than trusted.
func (t *Conn) FlushWAL(ctx context.Context, sql string, args [][]byte) error {
	t.stats.RoundTrips.Add(1)
	b := &pgconn.Batch{}
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	b.ExecParams("SET LOCAL synchronous_commit = on", nil, nil, nil, nil)
	b.ExecParams(sql, args, nil, nil, nil)
	b.ExecParams("COMMIT", nil, nil, nil, nil)
	b.ExecParams("SELECT pg_catalog.pg_current_wal_flush_lsn()::text", nil, nil, nil, nil)
	res, err := t.PG.ExecBatch(ctx, b).ReadAll()
	if err != nil {
		return fmt.Errorf("apply: flushing the target's WAL: %w", err)
	}
	if len(res) != 5 || len(res[2].Rows) != 1 || len(res[4].Rows) != 1 {
		return fmt.Errorf("apply: flushing the target's WAL: the progress row of slot %q was not written "+
			"(it names another source system)", args[0])
	}
	var ins, flushed decoding.LSN
	if err := ins.UnmarshalText(res[2].Rows[0][0]); err != nil {
		return fmt.Errorf("apply: flushing the target's WAL: %w", err)
	}
	if err := flushed.UnmarshalText(res[4].Rows[0][0]); err != nil {
		return fmt.Errorf("apply: flushing the target's WAL: %w", err)
	}
	if flushed < ins {
		return fmt.Errorf("apply: the target's WAL is flushed to %s after a synchronous commit, short of %s "+
			"(is synchronous_commit forced off for the target role?)", flushed, ins)
	}
	return nil
}

// Change applies one Insert, Update, Delete or Truncate; rels are the relations it names (one,
// or those of a Truncate).
func (t *Conn) Change(ctx context.Context, m decoding.Message, rels []*Relation) error {
	switch m := m.(type) {
	case *decoding.Insert:
		rm, err := t.Mapping(ctx, rels[0], OpInsert)
		if err != nil {
			return err
		}
		if t.coalesce && !t.stepwise {
			if held, err := t.absorb(ctx, rm, 'I', m.New, nil, 0); held || err != nil {
				return err
			}
		}
		return t.Insert(ctx, rm, m.New)
	case *decoding.Update:
		rm, err := t.Mapping(ctx, rels[0], OpUpdate)
		if err != nil {
			return err
		}
		if t.coalesce && !t.stepwise {
			if held, err := t.absorb(ctx, rm, 'U', m.New, m.Old, m.OldKind); held || err != nil {
				return err
			}
		}
		return t.update(ctx, rm, m)
	case *decoding.Delete:
		rm, err := t.Mapping(ctx, rels[0], OpDelete)
		if err != nil {
			return err
		}
		if t.coalesce && !t.stepwise {
			if held, err := t.absorb(ctx, rm, 'D', nil, m.Old, m.OldKind); held || err != nil {
				return err
			}
		}
		return t.delete(ctx, rm, m)
	case *decoding.Truncate:
		return t.truncate(ctx, m, rels)
	}
	return nil
}

func (t *Conn) Mapping(ctx context.Context, ri *Relation, op Op) (*Table, error) {
	m, err := ri.mapping(ctx, t.PG, t.ReplicaRole, t.opts.Binary)
	if err != nil && t.opts.AddColumn != nil {
		m, err = t.mapWithColumns(ctx, ri, m, err) // schema.go
	}
	if err != nil {
		var ce *ChangeError
		if errors.As(err, &ce) {
			c := *ce
			c.Op = op
			return nil, &c
		}
		return nil, err
	}
	return m, nil
}

// rowClass says how a tuple's values can be sent: all text (or NULL), all binary, or mixed.
func rowClass(tup decoding.Tuple) (binary, mixed bool) {
	var text, bin bool
	for _, c := range tup {
		switch c.Kind {
		case decoding.ColumnText:
			text = true
		case decoding.ColumnBinary:
			bin = true
		}
	}
	return bin, text && bin
}

func (t *Conn) Insert(ctx context.Context, m *Table, tup decoding.Tuple) error {
	if len(tup) != len(m.cols) {
		return &ChangeError{Op: OpInsert, Relation: m.Name, Err: fmt.Errorf("row has %d columns, the relation %d", len(tup), len(m.cols))}
	}
	bin, mixed := rowClass(tup)
	if mixed {
		if err := t.FlushInserts(ctx); err != nil {
			return err
		}
		return t.insertStatement(ctx, m, tup)
	}
	if t.insRows > 0 && (t.ins != m || (t.insBinary != bin && !allNull(tup))) {
		if err := t.FlushInserts(ctx); err != nil {
			return err
		}
	}
	if t.insRows == 0 {
		t.ins, t.insBinary = m, bin
	}
	for _, c := range tup {
		if c.Kind == decoding.ColumnNull {
			t.insBuf = binary.BigEndian.AppendUint32(t.insBuf, 0xffffffff)
			continue
		}
		t.insBuf = binary.BigEndian.AppendUint32(t.insBuf, uint32(len(c.Data)))
		t.insBuf = append(t.insBuf, c.Data...)
	}
	t.insRows++
	if t.det.On() {
		t.det.InsSrcs = append(t.det.InsSrcs, t.curSrc())
	}
	if len(t.insBuf) >= insertBufMax || t.stepwise {
		return t.FlushInserts(ctx)
	}
	return nil
}

func allNull(tup decoding.Tuple) bool {
	for _, c := range tup {
		if c.Kind != decoding.ColumnNull {
			return false
		}
	}
	return true
}

// insRow reads the next row of the insert run from buf into fields.
func insRow(buf []byte, fields []copycodec.Field) []byte {
	for i := range fields {
		n := binary.BigEndian.Uint32(buf)
		buf = buf[4:]
		if n == 0xffffffff {
			fields[i] = copycodec.Field{Null: true}
			continue
		}
		fields[i] = copycodec.Field{Data: buf[:n:n]}
		buf = buf[n:]
	}
	return buf
}

// FlushInserts sends the pending run of inserts: through COPY when it is long enough (after the
// batch before it), else as INSERT statements in the batch.
func (t *Conn) FlushInserts(ctx context.Context) error {
	if t.insRows == 0 {
		return nil
	}
	if t.insRows < copyMinRows {
		t.flushInsertsToBatch()
		return t.maybeFlush(ctx)
	}
	m, n := t.ins, t.insRows
	guard := false
	if t.det.On() {
		rc, err := t.conflictInfo(ctx, m)
		if err != nil {
			return err
		}
		// A unique violation must not abort the transaction: the COPY goes after a savepoint,
		// and on a violation the run is sent again as INSERT ... ON CONFLICT DO NOTHING.
		guard = rc.OnConflict
	}
	resolved := t.det.Resolved
	if guard {
		t.Control("SAVEPOINT pgr_copy")
	}
	if err := t.FlushBatch(ctx); err != nil {
		return err
	}
	if guard && t.det.Resolved != resolved {
		// The batch's conflicts were resolved after the savepoint (their statements ran before
		// it): a rollback to it would undo the resolutions. Take it again after them.
		t.stats.RoundTrips.Add(1)
		if err := t.PG.Exec(ctx, "RELEASE SAVEPOINT pgr_copy; SAVEPOINT pgr_copy").Close(); err != nil {
			t.dropInserts()
			return err
		}
	}
	fields := make([]copycodec.Field, len(m.cols))
	buf := t.copyBuf[:0]
	var sql string
	if t.insBinary {
		buf = append(buf, copycodec.BinaryHeader...)
		for rest := t.insBuf; len(rest) > 0; {
			buf = binary.BigEndian.AppendUint16(buf, uint16(len(fields)))
			start := rest
			rest = insRow(rest, fields)
			buf = append(buf, start[:len(start)-len(rest)]...)
		}
		buf = append(buf, copycodec.BinaryTrailer...)
		sql = "COPY " + m.Name + " " + m.copyCols + " FROM STDIN (FORMAT binary)"
	} else {
		for rest := t.insBuf; len(rest) > 0; {
			rest = insRow(rest, fields)
			buf = copycodec.AppendTextRow(buf, fields)
		}
		sql = "COPY " + m.Name + " " + m.copyCols + " FROM STDIN"
	}
	t.copyBuf = buf
	if cap(t.copyBuf) > 4*insertBufMax {
		t.copyBuf = nil
	}
	t.stats.RoundTrips.Add(1)
	t.stats.Statements.Add(1)
	tag, err := t.PG.CopyFrom(ctx, bytes.NewReader(buf), sql)
	if err != nil && guard && isViolation(err) {
		t.stats.RoundTrips.Add(1)
		if err := t.PG.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_copy; RELEASE SAVEPOINT pgr_copy").Close(); err != nil {
			t.dropInserts()
			return err
		}
		t.flushInsertsToBatch()
		return t.FlushBatch(ctx)
	}
	t.dropInserts()
	if err != nil {
		return t.statementError(batchOp{op: 'I', rel: m}, err)
	}
	if guard {
		t.Control("RELEASE SAVEPOINT pgr_copy")
	}
	if tag.RowsAffected() != int64(n) {
		return &ChangeError{Op: OpInsert, Relation: m.Name, Err: fmt.Errorf("COPY inserted %d rows, want %d", tag.RowsAffected(), n)}
	}
	if t.InitialCopy {
		t.stats.InitialCopyRows.Add(int64(n))
	} else {
		t.rows.inserts += int64(n)
		t.rows.insertsViaCopy += int64(n)
	}
	return nil
}

// flushInsertsToBatch turns the pending run of inserts into INSERT statements in the batch.
func (t *Conn) flushInsertsToBatch() {
	if t.insRows == 0 {
		return
	}
	m := t.ins
	fields := make([]copycodec.Field, len(m.cols))
	formats := t.formats[:0]
	for range fields {
		if t.insBinary {
			formats = append(formats, 1)
		} else {
			formats = append(formats, 0)
		}
	}
	t.formats = formats
	st := t.insertStmt(m)
	for row, rest := 0, t.insBuf; len(rest) > 0; row++ {
		rest = insRow(rest, fields)
		params := t.params[:0]
		for _, f := range fields {
			if f.Null {
				params = append(params, nil)
			} else {
				params = append(params, nonNil(f.Data))
			}
		}
		t.params = params
		t.queue(st, params, formats, batchOp{op: 'I', rel: m})
		if row < len(t.det.InsSrcs) {
			t.ops[len(t.ops)-1].src = t.det.InsSrcs[row] // the run may span source transactions
		}
	}
	t.dropInserts()
}

func (t *Conn) dropInserts() {
	t.det.InsSrcs = t.det.InsSrcs[:0]
	t.ins, t.insRows = nil, 0
	t.insBuf = t.insBuf[:0]
	if cap(t.insBuf) > 4*insertBufMax {
		t.insBuf = nil
	}
}

// insertStatement queues one INSERT of tup, whose values may mix text and binary.
func (t *Conn) insertStatement(ctx context.Context, m *Table, tup decoding.Tuple) error {
	params, formats := t.params[:0], t.formats[:0]
	for _, c := range tup {
		params, formats = appendParam(params, formats, c)
	}
	t.params, t.formats = params, formats
	t.queue(t.insertStmt(m), params, formats, batchOp{op: 'I', rel: m})
	return t.maybeFlush(ctx)
}

// appendParam appends a column's value and format.
func appendParam(params [][]byte, formats []int16, c decoding.Column) ([][]byte, []int16) {
	switch c.Kind {
	case decoding.ColumnNull:
		return append(params, nil), append(formats, 0)
	case decoding.ColumnBinary:
		return append(params, nonNil(c.Data)), append(formats, 1)
	default:
		return append(params, nonNil(c.Data)), append(formats, 0)
	}
}

// nonNil keeps an empty value from being sent as NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (t *Conn) insertStmt(m *Table) *stmt {
	return t.prepared(m, "I", func() (string, []uint32) {
		var b []byte
		b = append(b, "INSERT INTO "+m.Name+" "+m.insertCols+" VALUES ("...)
		oids := make([]uint32, len(m.cols))
		for i, c := range m.cols {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, '$')
			b = strconv.AppendInt(b, int64(i+1), 10)
			oids[i] = c.typeOID
		}
		return string(append(b, ')')), oids
	})
}

// prepared returns the statement of the given shape for ri, preparing it (lazily, with the
// next batch) the first time.
func (t *Conn) prepared(m *Table, shape string, build func() (string, []uint32)) *stmt {
	ri := m.info
	if e := t.stmts[stmtKey{ri, shape}]; e != nil {
		s := e.Value.(*stmt)
		s.gen = t.gen
		t.lru.MoveToFront(e)
		return s
	}
	sql, oids := build()
	t.nextStmt++
	s := &stmt{name: "pgr_" + strconv.Itoa(t.nextStmt), nparams: len(oids), key: stmtKey{ri, shape}, gen: t.gen,
		cols: paramCols(m, shape)}
	if t.det.On() {
		s.plain, s.oids = sql, oids
		sql = t.checkedSQL(m, s, shape)
	}
	if t.stmts == nil {
		t.stmts = map[stmtKey]*list.Element{}
	}
	t.stmts[s.key] = t.lru.PushFront(s)
	t.evict()
	// Shapes begin with the statement's kind: 'I', 'U' or 'D'.
	t.pendingPrepare = append(t.pendingPrepare, prepare{s: s, sql: sql, oids: oids, op: shape[0], rel: m})
	return s
}

// paramCols returns, for a statement of the given shape, the source column each parameter
// carries (see insertStmt, update and delete).
func paramCols(m *Table, shape string) []int {
	var cols []int
	where := func(w string) {
		if m.Full {
			for i := 0; i < len(w) && i < len(m.cols); i++ {
				if w[i] == 1 {
					cols = append(cols, i)
				}
			}
			return
		}
		for j, i := range m.Key {
			if j < len(w) && w[j] == 1 {
				cols = append(cols, i)
			}
		}
	}
	switch shape[0] {
	case 'I':
		for i := range m.cols {
			cols = append(cols, i)
		}
	case 'U':
		set := shape[1:min(len(shape), 1+len(m.cols))]
		for i := 0; i < len(set); i++ {
			if set[i] != 0 {
				cols = append(cols, i)
			}
		}
		where(shape[1+len(set):])
	case 'D':
		where(shape[1:])
	}
	return cols
}

// evict drops the least recently used statements past maxStatements, but none the batch being
// built uses: their DEALLOCATE goes before the next statements are prepared.
func (t *Conn) evict() {
	for t.lru.Len() > MaxStatements {
		e := t.lru.Back()
		s := e.Value.(*stmt)
		if s.gen == t.gen {
			return // the batch being built uses every statement left: they stay until it is sent
		}
		t.lru.Remove(e)
		delete(t.stmts, s.key)
		if s.ready {
			t.deallocate = append(t.deallocate, s.name)
			continue
		}
		for i, p := range t.pendingPrepare {
			if p.s == s {
				t.pendingPrepare = append(t.pendingPrepare[:i], t.pendingPrepare[i+1:]...)
				break
			}
		}
	}
}

type prepare struct {
	s    *stmt
	sql  string
	oids []uint32
	op   byte   // 'I', 'U' or 'D'
	rel  *Table // the table, for errors
}

// queue appends an execution of s to the batch.
func (t *Conn) queue(s *stmt, params [][]byte, formats []int16, op batchOp) {
	op.st = s
	if t.det.On() {
		op.arg, op.narg = t.det.Keep(params, formats)
		op.src = t.curSrc()
	}
	t.newBatch()
	if allZero(formats) {
		formats = nil
	}
	t.batch.ExecPrepared(s.name, params, formats, nil)
	t.ops = append(t.ops, op)
	t.bytes += 32
	for _, p := range params {
		t.bytes += len(p) + 4
	}
}

func allZero(f []int16) bool {
	for _, v := range f {
		if v != 0 {
			return false
		}
	}
	return true
}

// maybeFlush sends the batch once it is large, or once it uses more statements than the
// connection may keep prepared (sent, they can be evicted).
func (t *Conn) maybeFlush(ctx context.Context) error {
	if len(t.ops) >= BatchMaxOps || t.bytes >= batchMaxBytes || t.lru.Len() > MaxStatements || t.stepwise {
		return t.FlushBatch(ctx)
	}
	return nil
}

// FlushBatch sends the batch (after preparing the statements it uses) and checks each result.
func (t *Conn) FlushBatch(ctx context.Context) error {
	if err := t.prepareStatements(ctx); err != nil {
		return err
	}
	if t.batch == nil {
		return nil
	}
	b, ops := t.batch, t.ops
	t.batch, t.ops, t.bytes = nil, t.ops[:0], 0
	t.gen++ // the statements of the batch may be evicted once it is sent
	t.evict()
	t.stats.RoundTrips.Add(1)
	t.stats.Statements.Add(int64(len(ops)))
	mrr := t.PG.ExecBatch(ctx, b)
	i := 0
	var first, failed error
	var missed []int // ops that met no row or a conflict: resolved once the batch is done
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		if i >= len(ops) {
			rr.Close()
			break
		}
		op := ops[i]
		i++
		affected := int64(-1)
		if t.det.On() && op.st != nil {
			// A checked statement returns the rows it changed (see checkedSQL).
			for rr.NextRow() {
				if v := rr.Values(); len(v) > 0 {
					affected, _ = strconv.ParseInt(string(v[0]), 10, 64)
				}
			}
		}
		tag, err := rr.Close()
		if err != nil {
			first, failed = t.statementError(op, err), err
			break
		}
		if affected < 0 {
			affected = tag.RowsAffected()
		}
		if op.set {
			if op.setEnd {
				t.rows.add(t.co.rows)
				for _, nt := range t.failed {
					t.co.recycle(nt)
				}
				clear(t.failed)
				t.co.rows, t.failed = rowCounts{}, t.failed[:0]
				t.setDone++
			}
			continue
		}
		if t.det.On() && op.st != nil && affected == 0 {
			missed = append(missed, i-1)
			continue
		}
		if op.mark != 0 {
			t.markRows(op)
			continue
		}
		t.checkResult(op, tag)
	}
	if err := mrr.Close(); err != nil && first == nil {
		// A statement without rows that fails yields no result of its own: the results so far
		// say which one it was.
		op := batchOp{}
		if i < len(ops) {
			op = ops[i]
			i++
		}
		first, failed = t.statementError(op, err), err
	}
	defer t.det.ResetArgs()
	if first != nil {
		if i > 0 && ops[i-1].set {
			return t.setFailed(ctx, first, failed, ops[:i-1], missed)
		}
		if i > 0 && ops[i-1].guarded && isViolation(failed) {
			return t.updateExists(ctx, ops[i-1], first, ops[:i-1], missed)
		}
		if i > 0 && ops[i-1].check {
			return t.heldBack(ctx, ops[:i-1], missed)
		}
		return first
	}
	if err := t.resolveAll(ctx, ops, missed); err != nil {
		return err
	}
	return nil
}

// statementError describes the failure of a statement of a batch.
func (t *Conn) statementError(op batchOp, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err // the connection: retried as a whole
	}
	param := paramOf(pgErr)
	kind := kindOf(err)
	switch {
	case pgErr.Code == "08P01" && param > 0:
		kind = KindData // a binary value the column's type cannot read: trying again fails the same way
	case pgsession.TransientSQLState(pgErr.Code):
		return err // a transient error: retried as a whole
	}
	ce := &ChangeError{Kind: kind, Op: opName(op.op), Err: err}
	switch {
	case op.rel != nil:
		ce.Relation = op.rel.Name
	case op.name != "":
		ce.Relation = op.name
	case pgErr.TableName != "":
		ce.Relation = pgsession.QuoteQualified(pgErr.SchemaName, pgErr.TableName)
	}
	if pgErr.Code == "428C9" && ce.Op == OpUpdate { // generated_always
		ce.Err = fmt.Errorf("%w (no UPDATE may write a column that is GENERATED ALWAYS AS IDENTITY on the target, and this one "+
			"writes it: the source changed the key, or the column is not the replica identity key; make it GENERATED BY DEFAULT "+
			"there, ALTER TABLE %s ALTER COLUMN ... SET GENERATED BY DEFAULT)", err, ce.Relation)
	}
	if m := op.rel; m != nil {
		col := -1
		switch {
		case param > 0 && op.st != nil && param <= len(op.st.cols):
			col = op.st.cols[param-1]
		case param > 0 && op.st == nil && op.op == 'I' && param <= len(m.cols):
			col = param - 1 // an INSERT of every column (see insertSQL)
		case param == 0 && strings.HasPrefix(pgErr.Where, "COPY "):
			col = copyColumn(m, pgErr.Where)
		case param == 0 && pgErr.Code == "22001" && t.det.On() && op.st != nil && op.narg > 0:
			col = t.tooLong(m, op)
		}
		if col >= 0 && col < len(m.cols) {
			var already *columnError
			if !errors.As(err, &already) {
				ce.Err = &columnError{column: m.cols[col].name, typ: m.cols[col].typ, err: err}
			}
		}
	}
	return ce
}

// tooLong returns the column of a character varying(n) or character(n) whose value in op's
// kept parameters is longer than n, or -1 (the server names no column for such a value).
func (t *Conn) tooLong(m *Table, op batchOp) int {
	params, _ := t.det.Kept(op.arg, op.narg)
	for k, v := range params {
		if k >= len(op.st.cols) || v == nil {
			continue
		}
		c := m.cols[op.st.cols[k]]
		if c.chars > 0 && utf8.RuneCount(bytes.TrimRight(v, " ")) > c.chars {
			return op.st.cols[k]
		}
	}
	return -1
}

// paramOf returns the parameter (from 1) whose value the server refused, or 0: its error
// context says "unnamed portal parameter $N", or its message "... in bind parameter N".
func paramOf(e *pgconn.PgError) int {
	for _, s := range []struct{ text, mark string }{{e.Where, "parameter $"}, {e.Message, "bind parameter "}} {
		i := strings.LastIndex(s.text, s.mark)
		if i < 0 {
			continue
		}
		rest := s.text[i+len(s.mark):]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if p, err := strconv.Atoi(rest[:n]); err == nil && p > 0 {
			return p
		}
	}
	return 0
}

// copyColumn returns the column a COPY's error context names ("COPY t, line 3, column v: ..."),
// or -1.
func copyColumn(m *Table, where string) int {
	if !strings.HasPrefix(where, "COPY ") {
		return -1
	}
	best, bestLen := -1, 0
	for i, c := range m.info.Rel.Columns {
		mark := ", column " + c.Name
		j := strings.Index(where, mark)
		if j < 0 || len(c.Name) <= bestLen {
			continue
		}
		if rest := where[j+len(mark):]; rest == "" || strings.HasPrefix(rest, ":") {
			best, bestLen = i, len(c.Name)
		}
	}
	return best
}

// columnAt returns the column the character position pos (from 1, as the server reports it)
// of sql points at: the column's name, or the operator or cast just after it; else -1.
func columnAt(m *Table, sql string, pos int) int {
	off := len(sql)
	for i := range sql {
		if pos--; pos == 0 {
			off = i
			break
		}
	}
	best, at := -1, -1
	for i, c := range m.cols {
		j := strings.LastIndex(sql[:min(len(sql), off+len(c.name))], c.name)
		if j < 0 || j <= at {
			continue
		}
		if end := j + len(c.name); end < off && (off-end > 16 || strings.ContainsAny(sql[end:off], ",()$")) {
			continue // the position is past what follows the name
		}
		best, at = i, j
	}
	return best
}

func opName(op byte) Op {
	switch op {
	case 'I':
		return OpInsert
	case 'U':
		return OpUpdate
	case 'D':
		return OpDelete
	case 'T':
		return OpTruncate
	}
	return OpNone
}

// checkResult counts a statement's rows, and the conflicts of an UPDATE or DELETE that found no
// row: skipped, as PostgreSQL's subscriber does.
func (t *Conn) checkResult(op batchOp, tag pgconn.CommandTag) {
	switch op.op {
	case 'I':
		if t.InitialCopy {
			t.stats.InitialCopyRows.Add(1)
		} else {
			t.rows.inserts++
		}
	case 'U':
		if tag.RowsAffected() == 0 {
			t.stats.Conflicts[conflict.UpdateMissing].Add(1)
			t.log.Warn("conflict detected: the row to update does not exist on the target; skipped",
				"relation", op.rel.Name, "conflict", "update_missing")
			return
		}
		t.rows.updates++
	case 'D':
		if tag.RowsAffected() == 0 {
			t.stats.Conflicts[conflict.DeleteMissing].Add(1)
			t.log.Warn("conflict detected: the row to delete does not exist on the target; skipped",
				"relation", op.rel.Name, "conflict", "delete_missing")
			return
		}
		t.rows.deletes++
	case 'T':
		t.rows.truncates++
	}
}

// markRows keeps the row counts at a savepoint, or restores them at a rollback to it.
func (t *Conn) markRows(op batchOp) {
	if op.mark == markSave {
		t.rowMarks = append(t.rowMarks, rowMark{sub: op.sub, rows: t.rows})
		return
	}
	for i, m := range t.rowMarks {
		if m.sub == op.sub { // the savepoint stays, the rows since it are undone
			t.rows, t.rowMarks = m.rows, t.rowMarks[:i+1]
			return
		}
	}
}

// CountRows adds the rows of the transaction that committed to the stats.
func (t *Conn) CountRows() {
	t.stats.count(t.rows)
	t.DropRows()
}

// DropRows forgets the rows of a transaction that did not commit.
func (t *Conn) DropRows() {
	t.rows, t.rowMarks = rowCounts{}, t.rowMarks[:0]
}

// prepareStatements prepares the statements the batch is about to use.
func (t *Conn) prepareStatements(ctx context.Context) error {
	if len(t.deallocate) > 0 && len(t.pendingPrepare) > 0 {
		var b strings.Builder
		for _, name := range t.deallocate {
			b.WriteString("DEALLOCATE " + name + ";") // names of our making: pgr_N
		}
		t.stats.RoundTrips.Add(1)
		if err := t.PG.Exec(ctx, b.String()).Close(); err != nil {
			return err
		}
		t.deallocate = t.deallocate[:0]
	}
	for len(t.pendingPrepare) > 0 {
		p := t.pendingPrepare[0]
		if _, err := t.PG.Prepare(ctx, p.s.name, p.sql, p.oids); err != nil {
			// The statement is ours, not the user's: the error names the table and, when the
			// server points into the statement, the column there.
			t.log.Debug("preparing a statement failed", "sql", p.sql, "err", err)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Position > 0 {
				if i := columnAt(p.rel, p.sql, int(pgErr.Position)); i >= 0 {
					err = &columnError{column: p.rel.cols[i].name, typ: p.rel.cols[i].typ, err: err}
				}
			}
			return t.statementError(batchOp{op: p.op, rel: p.rel}, err)
		}
		p.s.ready = true
		t.stats.Prepares.Add(1)
		t.stats.preparedPeak(int64(t.lru.Len()))
		t.pendingPrepare = t.pendingPrepare[1:]
	}
	t.pendingPrepare = nil
	return nil
}

// where appends the row-identifying condition of an UPDATE or DELETE to the statement's shape
// and parameters: the replica identity key, or with REPLICA IDENTITY FULL every column of the
// old row, which picks one of identical rows (the caller wraps it in a ctid subquery).
//
// A FULL identity's condition does not depend on which values are NULL (see whereSQL), so that
// a relation has one statement per shape of its SET list, not one per pattern of NULLs.
func (t *Conn) where(m *Table, key decoding.Tuple, full bool, params [][]byte, formats []int16) ([][]byte, []int16, error) {
	if full {
		if len(key) != len(m.cols) {
			return nil, nil, fmt.Errorf("the old row has %d columns, the relation %d", len(key), len(m.cols))
		}
		for i, c := range key {
			if c.Kind == decoding.ColumnUnchanged {
				return nil, nil, fmt.Errorf("column %s of the old row was not sent (unchanged TOASTed value): "+
					"the row cannot be identified", m.cols[i].name)
			}
			t.shape = append(t.shape, 1)
			params, formats = appendParam(params, formats, c)
		}
		return params, formats, nil
	}
	for _, i := range m.Key {
		if i >= len(key) {
			return nil, nil, fmt.Errorf("the row has no value for key column %s", m.cols[i].name)
		}
		switch c := key[i]; c.Kind {
		case decoding.ColumnNull:
			t.shape = append(t.shape, 2)
		case decoding.ColumnUnchanged:
			return nil, nil, fmt.Errorf("key column %s was not sent (unchanged TOASTed value)", m.cols[i].name)
		default:
			t.shape = append(t.shape, 1)
			params, formats = appendParam(params, formats, c)
		}
	}
	return params, formats, nil
}

// whereSQL writes the condition whose shape where recorded (from shape[0]) using parameters
// from $n on, and returns the parameter OIDs.
//
// A FULL identity compares every column with "(c = $n OR (c IS NULL AND $n IS NULL))": NULL
// matches NULL, as in PostgreSQL's subscriber, in one statement whatever the NULLs, and the
// planner can still use an index of any column (a BitmapOr of "c = $n" and "c IS NULL", in
// generic plans too; IS NOT DISTINCT FROM would scan the table). A column whose type has no
// default equality operator (json, xml, point, box, ...) compares its text output, with the
// parameter of the column's type (so text and binary values alike) cast to text. A column that is
// NOT NULL on the target is compared with "=" alone: no row of it can match a NULL, and the
// condition stays one the planner gives the same plan for whatever the values, so that the
// prepared statement's generic plan is a plain index scan (with the OR, each execution was
// planned again: the custom plan, with the parameter's IS NULL folded away, costs less).
func whereSQL(b []byte, m *Table, shape []byte, full bool, n int, oids []uint32) ([]byte, []uint32) {
	first := true
	cond := func(i int, s byte) {
		if !first {
			b = append(b, " AND "...)
		}
		first = false
		c := m.cols[i]
		p := "$" + strconv.Itoa(n)
		switch {
		case s == 2:
			b = append(b, c.name+" IS NULL"...)
			return
		case full && c.textEq && c.notNull:
			b = append(b, c.name+"::text = "+p+"::text"...)
		case full && c.textEq:
			b = append(b, "("+c.name+"::text = "+p+"::text OR ("+c.name+" IS NULL AND "+p+" IS NULL))"...)
		case full && c.notNull:
			b = append(b, c.name+" = "+p...)
		case full:
			b = append(b, "("+c.name+" = "+p+" OR ("+c.name+" IS NULL AND "+p+" IS NULL))"...)
		default:
			b = append(b, c.name+" = "+p...)
		}
		n++
		oids = append(oids, c.typeOID)
	}
	if full {
		for i, s := range shape {
			if s != 0 {
				cond(i, s)
			}
		}
	} else {
		for j, i := range m.Key {
			cond(i, shape[j])
		}
	}
	if first {
		b = append(b, "true"...) // a relation without columns
	}
	return b, oids
}

// rowTarget wraps a FULL identity condition so that it names one row: the first that matches,
// as PostgreSQL's subscriber does with identical rows.
func rowTarget(m *Table, cond []byte) []byte {
	id := "ctid" // a TID scan
	if m.Partitioned {
		id = "(tableoid, ctid)" // ctid alone repeats across partitions
	}
	b := []byte("WHERE " + id + " = (SELECT " + strings.Trim(id, "()") + " FROM " + m.Name + " WHERE ")
	b = append(b, cond...)
	return append(b, " LIMIT 1)"...)
}

func (t *Conn) update(ctx context.Context, m *Table, u *decoding.Update) error {
	key, full := u.New, m.Full
	switch {
	case m.fullSource && u.OldKind != 'O':
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpUpdate, Relation: m.Name,
			Err: errors.New("REPLICA IDENTITY FULL without the old row")}
	case full:
		key = u.Old
	case m.idErr != nil:
		return t.identityError(m, OpUpdate)
	case u.OldKind == 'K' || u.OldKind == 'O':
		key = u.Old
	}
	if len(u.New) != len(m.cols) {
		return &ChangeError{Op: OpUpdate, Relation: m.Name, Err: fmt.Errorf("row has %d columns, the relation %d", len(u.New), len(m.cols))}
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	t.shape = append(t.shape[:0], 'U')
	params, formats := t.params[:0], t.formats[:0]
	sets := 0
	// The key's columns are not written when they keep their values: no old key was sent, or
	// (a FULL table found by the target's key) the old row holds the same values; a GENERATED
	// ALWAYS key column can take no UPDATE. Unless nothing else would be written: the statement
	// must still find (or miss) its row, as the source's update did.
	keyKept := m.fullSource && !m.Full && len(u.Old) == len(u.New)
	keySame := func(i int, c decoding.Column) bool {
		if u.OldKind == 0 {
			return m.info.Rel.Columns[i].IsKey()
		}
		return keyKept && slices.Contains(m.Key, i) && u.Old[i].Kind == c.Kind && bytes.Equal(u.Old[i].Data, c.Data)
	}
	others := !allKeySame(u.New, keySame)
	for i, c := range u.New {
		// A TOASTed value not sent is left as it is.
		if c.Kind == decoding.ColumnUnchanged || (others && keySame(i, c)) {
			t.shape = append(t.shape, 0)
			continue
		}
		t.shape = append(t.shape, 1)
		params, formats = appendParam(params, formats, c)
		sets++
	}
	if sets == 0 {
		return nil // nothing sent but unchanged values
	}
	whereAt := len(t.shape)
	params, formats, err := t.where(m, key, full, params, formats)
	if err != nil {
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpUpdate, Relation: m.Name, Err: err}
	}
	t.params, t.formats = params, formats
	shape := t.shape
	st := t.prepared(m, string(shape), func() (string, []uint32) {
		b := []byte("UPDATE " + m.Name + " SET ")
		var oids []uint32
		n := 1
		for i, s := range shape[1:whereAt] {
			if s == 0 {
				continue
			}
			if n > 1 {
				b = append(b, ", "...)
			}
			b = append(b, m.cols[i].name+" = $"...)
			b = strconv.AppendInt(b, int64(n), 10)
			n++
			oids = append(oids, m.cols[i].typeOID)
		}
		b = append(b, ' ')
		cond, oids := whereSQL(nil, m, shape[whereAt:], full, n, oids)
		if full {
			b = append(b, rowTarget(m, cond)...)
		} else {
			b = append(b, "WHERE "...)
			b = append(b, cond...)
		}
		return string(b), oids
	})
	if !t.det.On() {
		t.queue(st, params, formats, batchOp{op: 'U', rel: m})
		return t.maybeFlush(ctx)
	}
	return t.queueUpdate(ctx, m, st, u, whereAt, full, params, formats, sets)
}

// allKeySame reports whether every value of row sent (not an unchanged TOASTed one) is a key
// value that keeps its value (keySame).
func allKeySame(row decoding.Tuple, keySame func(int, decoding.Column) bool) bool {
	for i, c := range row {
		if c.Kind != decoding.ColumnUnchanged && !keySame(i, c) {
			return false
		}
	}
	return true
}

func (t *Conn) identityError(m *Table, op Op) error {
	var ce *ChangeError
	if errors.As(m.idErr, &ce) {
		c := *ce
		c.Op = op
		return &c
	}
	return m.idErr
}

func (t *Conn) delete(ctx context.Context, m *Table, d *decoding.Delete) error {
	full := m.Full
	switch {
	case m.fullSource && d.OldKind != 'O':
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpDelete, Relation: m.Name,
			Err: errors.New("REPLICA IDENTITY FULL without the old row")}
	case !full && m.idErr != nil:
		return t.identityError(m, OpDelete)
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	t.shape = append(t.shape[:0], 'D')
	params, formats, err := t.where(m, d.Old, full, t.params[:0], t.formats[:0])
	if err != nil {
		return &ChangeError{Kind: KindNoReplicaIdentity, Op: OpDelete, Relation: m.Name, Err: err}
	}
	t.params, t.formats = params, formats
	shape := t.shape
	st := t.prepared(m, string(shape), func() (string, []uint32) {
		b := []byte("DELETE FROM " + m.Name + " ")
		cond, oids := whereSQL(nil, m, shape[1:], full, 1, nil)
		if full {
			b = append(b, rowTarget(m, cond)...)
		} else {
			b = append(b, "WHERE "...)
			b = append(b, cond...)
		}
		return string(b), oids
	})
	t.queue(st, params, formats, batchOp{op: 'D', rel: m})
	return t.maybeFlush(ctx)
}

// truncate truncates the relations a TRUNCATE named, without CASCADE whatever the source used
// (as PostgreSQL's subscriber does: the target may hold tables the source does not publish).
func (t *Conn) truncate(ctx context.Context, m *decoding.Truncate, rels []*Relation) error {
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	b := []byte("TRUNCATE ")
	var names []byte
	for i, ri := range rels {
		rm, err := t.Mapping(ctx, ri, OpTruncate)
		if err != nil {
			return err
		}
		if err := t.unholdTables(ctx, []*Table{rm}); err != nil {
			return err
		}
		if i > 0 {
			b = append(b, ", "...)
			names = append(names, ", "...)
		}
		if !rm.Partitioned {
			b = append(b, "ONLY "...) // partitions of a partitioned table go with it
		}
		b = append(b, rm.Name...)
		names = append(names, rm.Name...)
	}
	if err := t.FlushInserts(ctx); err != nil { // inserts held before, sent again
		return err
	}
	if m.Options&decoding.TruncateRestartIdentity != 0 {
		b = append(b, " RESTART IDENTITY"...)
	}
	t.newBatch()
	t.batch.ExecParams(string(b), nil, nil, nil, nil)
	t.ops = append(t.ops, batchOp{op: 'T', name: string(names)})
	t.bytes += len(b)
	return t.maybeFlush(ctx)
}

// CommitCopy sends the pending rows and commits, without a progress row.
func (t *Conn) CommitCopy(ctx context.Context) error {
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	t.Control("COMMIT")
	t.InTxn = false
	if err := t.FlushBatch(ctx); err != nil {
		return err
	}
	t.CountRows()
	return nil
}
