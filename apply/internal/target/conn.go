package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Conn is one connection to the target database and the transaction it is applying. Changes
// are not sent one statement at a time: inserts into one table gather into a run that becomes a
// COPY (or INSERTs when short), other statements gather into a batch sent in one round trip
// with its results checked in order, and the commit goes in the last batch with the progress
// row. A Conn is used by one goroutine.
type Conn struct {
	pg          *pgconn.PgConn
	pid         uint32
	name        string            // application_name
	names       map[string]string // the configured table names, resolved (see Table)
	replicaRole bool              // session_replication_role = replica took effect
	opts        *Options
	log         *slog.Logger
	stats       *Counters

	stmts stmtCache // the statements prepared on the connection

	inTxn bool // a target transaction is open (see InTxn)
	batch *pgconn.Batch
	ops   []batchOp
	bytes int // encoded bytes in batch (approximate)

	ins insertRun // the run of inserts not yet sent

	// The parameters, their formats and the shape of the statement being queued, their room
	// kept for the next.
	params  [][]byte
	formats []int16
	shape   []byte

	indexes  map[*Relation]*detect.Indexes       // with conflict detection: the tables' unique indexes
	settle   func(context.Context) (bool, error) // see SetSettle
	wrote    bool                                // a resolution of the batch's conflicts wrote a row (see resolveAll)
	later    bool                                // a later statement of the batch changed the table of the one resolved (see resolveAll)
	stepwise bool                                // see Stepwise
	progress *stmt                               // the progress upsert (see PrepareProgress)
	ahead    *stmt                               // the worker's row upsert of relaxed commit order (see PrepareAhead)

	det    detect.Detector // conflict detection (see resolve.go and package detect)
	origin string          // the replication origin set up in the session, or ""

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
	// CreateTable, when set, creates a table the target lacks (see create.go).
	CreateTable CreateTableFunc

	// InitialCopy makes the connections of the initial copy: their rows count in
	// Counters.InitialCopyRows, not among the rows applied.
	InitialCopy bool
	// MaxStatements bounds the statements prepared on one connection (see stmtCache); 0 is
	// DefaultMaxStatements.
	MaxStatements int
}

// targetConfig returns the target's connection configuration: Config.TargetConfig, or
// Config.Target parsed.
func targetConfig(o *Options) (*pgconn.Config, error) {
	pc, err := pgsession.ConnConfig(o.ConnConfig, o.ConnString)
	if err != nil {
		return nil, &ConfigError{Err: &configerr.Error{Field: configerr.Field{Config: "apply", Path: "Target"},
			Reason: configerr.Words("cannot be used"), Cause: err}}
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
		return nil, &ConfigError{Err: configerr.New(nil, configerr.Field{Config: "apply", Path: "TargetConfig"}, "must be made by pgconn.ParseConfig")}
	case err != nil:
		return nil, fmt.Errorf("apply: connecting to the target: %w", err)
	}
	return &Conn{pg: conn, pid: conn.PID(), name: name, names: names, opts: o, log: o.Logger.With("conn", name),
		stmts: newStmtCache(o.MaxStatements),
		det:   detect.Detector{Now: o.Now}, srcOverride: -1}, nil
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
	conn := t.pg
	// As PostgreSQL's subscriber: replicated changes do not fire ordinary triggers or foreign
	// key checks. Setting it takes a superuser (or, 15+, a role granted SET on it).
	if !o.SynchronousCommit {
		if err := conn.Exec(ctx, "SET synchronous_commit = off").Close(); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("apply: setting up the target connection: %w", err)
		}
	}
	if err := conn.Exec(ctx, "SET session_replication_role = replica").Close(); err == nil {
		t.replicaRole = true
	} else if !pgsession.IsCode(err, pgsession.InsufficientPrivilege) {
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

// PG returns the connection itself, for the caller's own statements outside the target
// transaction the Conn applies (or, for schema changes, inside it).
func (t *Conn) PG() *pgconn.PgConn { return t.pg }

// PID returns the backend's process id on the target.
func (t *Conn) PID() uint32 { return t.pid }

// InTxn says whether a target transaction is open: begun and neither committed nor rolled back.
func (t *Conn) InTxn() bool { return t.inTxn }

// Origin returns the replication origin set up on the connection (SetupOrigin), or "".
func (t *Conn) Origin() string { return t.origin }

// ReplicaRole says whether session_replication_role = replica took effect on the connection
// (it takes a superuser, or on 15 and later a role granted SET on it).
func (t *Conn) ReplicaRole() bool { return t.replicaRole }

// Close closes the connection; an open transaction is rolled back by the server.
func (t *Conn) Close(ctx context.Context) {
	if t != nil && !t.pg.IsClosed() {
		t.pg.Close(ctx)
	}
}
