package pgsession

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// ErrNotParsed is returned for a connection configuration that pgconn.ParseConfig (or
// pgx.ParseConfig) did not make, which pgconn and pgx would panic on.
var ErrNotParsed = errors.New("the connection configuration must be made by pgconn.ParseConfig")

// Kind is a kind of connection: it says which of the Settings are pinned on it. As a Setting's
// Kinds, a set of them.
type Kind uint8

const (
	// Replication is a walsender connection (replication=database): pgoutput formats the text
	// values it streams with the session's settings (package replication).
	Replication Kind = 1 << iota
	// Source is an ordinary connection to the source whose values must read exactly as the
	// stream's: an initial copy (snapshot), the catalog (catalog), apply's reads of the source's
	// types and sequences.
	Source
	// Target is one of apply's connections to its target: the SQL and the values it sends must
	// read as meant, the rows it reads back (conflict reports) as the stream has them, and it
	// waits idle in transactions and for locks on purpose.
	Target
	// Store is a connection that the consumer's own SQL runs on: changefeed's TableStore, whose
	// transactions the handler writes in. Its search_path is the consumer's (the handler names
	// its tables as it writes them); values read as the stream's, and no timeout ends the
	// connection that holds the slot's lock or a transaction the handler is slow to finish.
	Store
)

// every is every kind.
const every = Replication | Source | Target | Store

// Setting is a session setting pinned on the connections of some kinds.
type Setting struct {
	Name, Value string
	// Since is the first server major version that knows the setting, 0 for every supported
	// one. A server that does not know a setting sent at startup refuses the connection: such a
	// server is connected to again without the newer settings and given, with set_config, those
	// its version has.
	Since int
	// Kinds are the kinds of connection the setting is pinned on.
	Kinds Kind
}

// settings are the pinned settings, each with the connections it is pinned on and why. The
// first four are those PostgreSQL's own subscriber pins on its replication connection
// (libpqwalreceiver), because pgoutput formats text values with the walsender session's
// settings; every other connection pins them too, so that a value copied, read from the catalog
// or read back from the target reads exactly as the same value streamed.
var settings = [...]Setting{
	// Dates as 2024-03-04, whatever the server's day/month order.
	{Name: "datestyle", Value: "ISO", Kinds: every},
	{Name: "intervalstyle", Value: "postgres", Kinds: every},
	// float4 and float8 that read back exactly.
	{Name: "extra_float_digits", Value: "3", Kinds: every},
	// The subscriber asks for its database's encoding; a Go program sends and reads UTF-8.
	{Name: "client_encoding", Value: "UTF8", Kinds: every},
	// bytea read back (conflict reports) in hex, as the stream has it.
	{Name: "bytea_output", Value: "hex", Kinds: Target},
	// Backslashes in '...' literals are ordinary characters, so that SQL reads as it was
	// written (QuoteLiteral reads the same either way; pgx's simple protocol needs it on).
	{Name: "standard_conforming_strings", Value: "on", Kinds: every},
	// NULL in the text of an array value is a null element, as the source meant it.
	{Name: "array_nulls", Value: "on", Kinds: Target},
	// xml values are documents or fragments, as the source accepted them.
	{Name: "xmloption", Value: "content", Kinds: Target},
	// Only the system catalog, then temporary objects, are found without a schema: no function,
	// operator or type of another schema stands in for a built-in one. The tables the library
	// names are qualified, and expressions read back from the catalog (pg_get_expr) come with
	// every schema they need, as PostgreSQL's subscriber pins it on its connections to the
	// publisher. Not on a Store: the consumer's SQL names its tables as the consumer writes
	// them. apply resolves the configured table names without a schema in the user's own
	// search_path first (Options.BeforeSearchPath).
	{Name: "search_path", Value: "pg_catalog, pg_temp", Kinds: Replication | Source | Target},
	// A copy's statements and transactions last as long as its tables take, and its workers wait
	// idle in their transaction for their turn; an apply worker waits idle in its transaction for
	// its turn to commit or for the next part of a streamed transaction, and a connection idle for
	// the next change; a Store's connection holds the slot's lock for its whole life, and the
	// handler takes its time inside the transaction: no server-side timeout may end a statement,
	// a transaction or a session.
	{Name: "statement_timeout", Value: "0", Kinds: every},
	{Name: "idle_in_transaction_session_timeout", Value: "0", Kinds: every},
	{Name: "idle_session_timeout", Value: "0", Kinds: every},
	// Not on a Replication connection: it is made in one attempt, never again without a setting
	// its server does not know.
	{Name: "transaction_timeout", Value: "0", Since: 17, Kinds: Source | Target | Store},
	// A statement waits for a lock as long as it is held: apply's statements for the rows and
	// locks other sessions hold, a Store's Load for the slot's lock an earlier consumer holds.
	{Name: "lock_timeout", Value: "0", Kinds: Target | Store},
	// The isolation apply's ordering assumes, in transactions that write.
	{Name: "default_transaction_isolation", Value: "read committed", Kinds: Target},
	{Name: "default_transaction_read_only", Value: "off", Kinds: Target},
}

// Settings returns the settings pinned on connections of kind k.
func Settings(k Kind) []Setting {
	var out []Setting
	for _, s := range settings {
		if s.Kinds&k != 0 {
			out = append(out, s)
		}
	}
	return out
}

// Options describes a connection.
type Options struct {
	// Kind says which settings are pinned (see Settings), and whether the connection is a
	// walsender's.
	Kind Kind
	// Config is the connection configuration, made by pgconn.ParseConfig (ParseConnString); each
	// attempt works on a copy of it.
	Config *pgconn.Config
	// BeforeConnect, if set, is called with the attempt's copy before it connects: it may set a
	// password (an IAM token) or a dialer (a tunnel). The pinned settings are set after it.
	BeforeConnect func(ctx context.Context, cfg *pgconn.Config) error
	// ApplicationName is the connection's application_name unless Config (or BeforeConnect)
	// sets one; with ForceApplicationName, whatever they set.
	ApplicationName      string
	ForceApplicationName bool
	// Logger receives the server's notices (at Warn); nil logs nothing.
	Logger *slog.Logger
	// BeforeSearchPath, if set, runs on the new connection while its search_path is still the
	// user's (the server's, the role's, the connection string's), and the pinned search_path is
	// set after it instead of in the startup packet: apply resolves there the configured table
	// names that have no schema. Its error closes the connection and is returned as it is.
	BeforeSearchPath func(ctx context.Context, conn *pgconn.PgConn) error
}

// startup returns the settings of o's kind that go in the startup packet or, newer, right after
// (connectNewer): all but a search_path set later (BeforeSearchPath).
func (o *Options) startup() []Setting {
	var out []Setting
	for _, s := range Settings(o.Kind) {
		if s.Name != "search_path" || o.BeforeSearchPath == nil {
			out = append(out, s)
		}
	}
	return out
}

// Prepare returns the configuration of one connection attempt: a copy of o.Config, passed to
// o.BeforeConnect (when not nil: it may set a password or a dialer for this attempt), without a
// "replication" startup parameter (with replication=database for a Replication connection, and a
// context watcher that never sends a cancel request: a deadline ends every wait for the next
// message, and a cancel request would reach the walsender), with the pinned settings that go in
// the startup packet, application_name o.ApplicationName unless one is set (or forced), and
// server notices logged at Warn on o.Logger before the configuration's own OnNotice sees them.
// o.Config is not modified. Open connects with it.
func Prepare(ctx context.Context, o Options) (*pgconn.Config, error) {
	if o.Config == nil {
		return nil, ErrNotParsed
	}
	if o.Kind == 0 || o.Kind&^every != 0 || o.Kind&(o.Kind-1) != 0 {
		return nil, fmt.Errorf("pgsession: connection kind %d", o.Kind)
	}
	pc := o.Config.Copy()
	if pc.RuntimeParams == nil { // hooks may set parameters
		pc.RuntimeParams = map[string]string{}
	}
	if o.BeforeConnect != nil {
		if err := o.BeforeConnect(ctx, pc); err != nil {
			return nil, &AttemptError{Err: fmt.Errorf("BeforeConnect: %w", err)}
		}
	}
	if pc.RuntimeParams == nil {
		pc.RuntimeParams = map[string]string{}
	}
	hasAppName := false
	for k := range pc.RuntimeParams {
		switch {
		case strings.EqualFold(k, "replication"):
			delete(pc.RuntimeParams, k)
		case strings.EqualFold(k, "application_name") && o.ForceApplicationName:
			delete(pc.RuntimeParams, k)
		case strings.EqualFold(k, "application_name"):
			hasAppName = true
		}
	}
	pin(pc, o.startup())
	if !hasAppName {
		pc.RuntimeParams["application_name"] = o.ApplicationName
	}
	userNotice := pc.OnNotice
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pc.OnNotice = func(conn *pgconn.PgConn, n *pgconn.Notice) {
		log.Warn("server notice", "severity", n.Severity, "code", n.Code, "message", n.Message,
			"detail", n.Detail, "hint", n.Hint, "where", n.Where)
		if userNotice != nil {
			userNotice(conn, n)
		}
	}
	if o.Kind == Replication {
		pc.RuntimeParams["replication"] = "database"
		pc.BuildContextWatcherHandler = func(conn *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: conn.Conn()}
		}
	}
	return pc, nil
}

// pin sets the settings with no Since in cfg's startup parameters, replacing whatever cfg says
// in any letter case. Those with a Since are removed from cfg in any letter case too: they are
// set once connected (connectNewer).
func pin(cfg *pgconn.Config, settings []Setting) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	for k := range cfg.RuntimeParams {
		for _, p := range settings {
			if strings.EqualFold(k, p.Name) {
				delete(cfg.RuntimeParams, k)
			}
		}
	}
	for _, p := range settings {
		if p.Since == 0 {
			cfg.RuntimeParams[p.Name] = p.Value
		}
	}
}

// Open connects with pc, a configuration Prepare made for o: with the newer settings of o's kind
// (see the package documentation), then BeforeSearchPath and the pinned search_path after it.
// A configuration that pgconn.ParseConfig did not make is ErrNotParsed.
func Open(ctx context.Context, pc *pgconn.Config, o Options) (*pgconn.PgConn, error) {
	return open(ctx, pc, o, pgconn.ConnectConfig)
}

// Connect opens a connection as o describes: Prepare, then Open. An error of BeforeConnect is
// returned wrapped, and a Config that pgconn.ParseConfig did not make is ErrNotParsed.
func Connect(ctx context.Context, o Options) (*pgconn.PgConn, error) {
	pc, err := Prepare(ctx, o)
	if err != nil {
		return nil, err
	}
	return Open(ctx, pc, o)
}

// ConnectPgx opens a pgx connection as o describes, from cfg (made by pgx.ParseConfig, never
// modified) instead of o.Config: its pgconn configuration is prepared as Prepare does, and the
// rest of cfg (statement cache, tracer, query mode) is kept.
func ConnectPgx(ctx context.Context, cfg *pgx.ConnConfig, o Options) (*pgx.Conn, error) {
	if cfg == nil {
		return nil, ErrNotParsed
	}
	o.Config = &cfg.Config
	pc, err := Prepare(ctx, o)
	if err != nil {
		return nil, err
	}
	var conn *pgx.Conn
	_, err = open(ctx, pc, o, func(ctx context.Context, pc *pgconn.Config) (*pgconn.PgConn, error) {
		cc := cfg.Copy()
		cc.Config = *pc
		c, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			return nil, err
		}
		conn = c
		return c.PgConn(), nil
	})
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// dialFunc makes one connection with a prepared configuration.
type dialFunc func(context.Context, *pgconn.Config) (*pgconn.PgConn, error)

func open(ctx context.Context, pc *pgconn.Config, o Options, dial dialFunc) (*pgconn.PgConn, error) {
	conn, err := connectNewer(ctx, pc, o.startup(), dial)
	if err != nil || o.BeforeSearchPath == nil {
		return conn, err
	}
	if err := o.BeforeSearchPath(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	for _, s := range Settings(o.Kind) {
		if s.Name != "search_path" {
			continue
		}
		_, err := conn.ExecParams(ctx, "SELECT pg_catalog.set_config('search_path', $1, false)", [][]byte{[]byte(s.Value)},
			nil, nil, nil).Close()
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("setting up the connection: %w", err)
		}
	}
	return conn, nil
}

// notParsed is the panic pgconn and pgx raise for a Config that their ParseConfig did not make.
const notParsed = "config must be created by ParseConfig"

func connect(ctx context.Context, pc *pgconn.Config, dial dialFunc) (conn *pgconn.PgConn, err error) {
	defer func() {
		if r := recover(); r != nil {
			if r != notParsed {
				panic(r)
			}
			conn, err = nil, ErrNotParsed
		}
	}()
	conn, err = dial(ctx, pc)
	if err != nil {
		return nil, &AttemptError{Err: err}
	}
	return conn, nil
}

// tooOld holds the servers ("host:port/database") that refused a newer setting at startup.
var tooOld sync.Map

// connectNewer connects with pc, whose startup parameters carry the settings with a Since too,
// so that they hold from the first statement on. A server that does not know one refuses
// such a connection (SQLSTATE 42704): it is connected to again without them and given, through
// set_config, those its version has; it is remembered, and later connections to it go without
// them at once.
func connectNewer(ctx context.Context, pc *pgconn.Config, all []Setting, dial dialFunc) (*pgconn.PgConn, error) {
	var settings []Setting
	for _, s := range all {
		if s.Since > 0 {
			settings = append(settings, s)
		}
	}
	key := fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
	if _, old := tooOld.Load(key); !old && len(settings) > 0 {
		with := pc.Copy()
		if with.RuntimeParams == nil { // a Config not made by ParseConfig: connect says so
			with.RuntimeParams = map[string]string{}
		}
		for _, s := range settings {
			with.RuntimeParams[s.Name] = s.Value
		}
		conn, err := connect(ctx, with, dial)
		if !IsCode(err, UndefinedObject) {
			return conn, err
		}
		tooOld.Store(key, true)
	}
	conn, err := connect(ctx, pc, dial)
	if err != nil {
		return nil, err
	}
	major := serverMajor(conn)
	var sql strings.Builder
	var params [][]byte
	for _, s := range settings {
		if major < s.Since {
			continue
		}
		if len(params) == 0 {
			sql.WriteString("SELECT ")
		} else {
			sql.WriteString(", ")
		}
		fmt.Fprintf(&sql, "pg_catalog.set_config($%d, $%d, false)", len(params)+1, len(params)+2)
		params = append(params, []byte(s.Name), []byte(s.Value))
	}
	if len(params) > 0 {
		if _, err := conn.ExecParams(ctx, sql.String(), params, nil, nil, nil).Close(); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("setting up the connection: %w", err)
		}
	}
	return conn, nil
}

// serverMajor is the major version the server reported (server_version), 0 if it did not.
func serverMajor(conn *pgconn.PgConn) int {
	v := conn.ParameterStatus("server_version")
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		v = v[:i]
	}
	n, _ := strconv.Atoi(v)
	return n
}

// ParseConnString is pgconn.ParseConfig with its error made safe to print: see RedactConnError.
func ParseConnString(dsn string) (*pgconn.Config, error) {
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, RedactConnError(err, dsn)
	}
	return pc, nil
}

// ParsePgxConnString is pgx.ParseConfig with its error made safe to print: see RedactConnError.
func ParsePgxConnString(dsn string) (*pgx.ConnConfig, error) {
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, RedactConnError(err, dsn)
	}
	return pc, nil
}

// ConnConfig returns the connection configuration given either way: cfg when not nil, else
// connString parsed (ParseConnString).
func ConnConfig(cfg *pgconn.Config, connString string) (*pgconn.Config, error) {
	if cfg != nil {
		return cfg, nil
	}
	return ParseConnString(connString)
}
