package replication

// This file prepares and opens the connections pgreorder makes to a server described by a
// *pgconn.Config: the walsender connections of this package, the ordinary connections of
// package snapshot and apply's connections to its target (ConnectSQL). They share a copy of the
// user's configuration per attempt, the user's hook applied to it, pinned session settings (the
// settings values are printed with and those that change how SQL is read or could end a
// session), a default application_name, server notices logged, and a Config that
// pgconn.ParseConfig did not make reported as an error instead of pgconn's panic.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotParsed is returned (wrapping ErrInvalidConfig) for a connection configuration that
// pgconn.ParseConfig did not make.
var ErrNotParsed = fmt.Errorf("%w: the connection configuration must be made by pgconn.ParseConfig", ErrInvalidConfig)

// valueSettings are the session settings PostgreSQL's own subscriber pins on its replication
// connection (libpqwalreceiver), because pgoutput formats text values with the walsender
// session's settings: DateStyle ISO (dates as 2024-03-04 whatever the server's day/month order),
// IntervalStyle postgres, extra_float_digits 3 (float4/float8 that read back exactly), and the
// client encoding (the subscriber asks for its database encoding; a Go consumer wants UTF8).
var valueSettings = [...]Setting{
	{Name: "datestyle", Value: "ISO"},
	{Name: "intervalstyle", Value: "postgres"},
	{Name: "extra_float_digits", Value: "3"},
	{Name: "client_encoding", Value: "UTF8"},
}

// sessionSettings are the other session settings every connection made here pins, whatever
// ALTER DATABASE, ALTER ROLE or the connection string say, as PostgreSQL's subscriber pins
// search_path on its connections to the publisher.
var sessionSettings = [...]Setting{
	// Backslashes in '...' literals are ordinary characters.
	{Name: "standard_conforming_strings", Value: "on"},
	// No function, operator or type of another schema stands in for a built-in one; the
	// published tables are named with their schema, and expressions read back from the catalog
	// (pg_get_expr) come with every schema they need.
	{Name: "search_path", Value: "pg_catalog, pg_temp"},
	// A copy's statements and transactions last as long as its tables take, and its workers
	// wait idle in their transaction for their turn: no server-side timeout may end them.
	// transaction_timeout (17+) is one of newerSettings: a server that does not know a
	// setting sent at startup refuses the connection.
	{Name: "statement_timeout", Value: "0"},
	{Name: "idle_in_transaction_session_timeout", Value: "0"},
	{Name: "idle_session_timeout", Value: "0"},
}

// attempt returns the configuration of one connection attempt: a copy of base, passed to before
// (when not nil: it may set a password or a dialer for this attempt), without a "replication"
// startup parameter, with the settings pinned that go in the startup packet (those with no
// Since), application_name appName unless one is set (or force), and server notices logged at
// Warn on log before base's own OnNotice sees them. base is not modified.
func attempt(ctx context.Context, base *pgconn.Config, before func(context.Context, *pgconn.Config) error,
	settings []Setting, appName string, force bool, log *slog.Logger) (*pgconn.Config, error) {
	pc := base.Copy()
	if pc.RuntimeParams == nil { // hooks may set parameters
		pc.RuntimeParams = map[string]string{}
	}
	if before != nil {
		if err := before(ctx, pc); err != nil {
			return nil, fmt.Errorf("BeforeConnect: %w", err)
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
		case strings.EqualFold(k, "application_name") && force:
			delete(pc.RuntimeParams, k)
		case strings.EqualFold(k, "application_name"):
			hasAppName = true
		}
	}
	pin(pc, settings)
	if !hasAppName {
		pc.RuntimeParams["application_name"] = appName
	}
	userNotice := pc.OnNotice
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
	return pc, nil
}

// replicationSettings are the settings pinned on a replication connection.
func replicationSettings() []Setting {
	return slices.Concat(valueSettings[:], sessionSettings[:])
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

// Setting is a session setting pinned on a connection: sent in the startup packet, where it
// takes precedence over postgresql.conf, ALTER ROLE/DATABASE SET and the "options" connection
// parameter, and replacing the connection configuration's own in any letter case.
type Setting struct {
	Name, Value string
	// Since is the first server major version that knows the setting, 0 for every supported
	// one. A server that does not know a setting sent at startup refuses the connection: such a
	// server is connected to again without the newer settings and given, with set_config, those
	// its version has.
	Since int
}

// DefaultSettings are the settings ConnectSQL pins when SQLConnConfig.Settings is nil: those
// values are printed with on a replication connection (see PinValueSettings),
// standard_conforming_strings on, search_path pg_catalog, pg_temp, and no statement,
// idle-in-transaction, idle-session or transaction timeout.
func DefaultSettings() []Setting {
	return slices.Concat(valueSettings[:], sessionSettings[:], newerSettings[:])
}

// PinValueSettings sets, in cfg's startup parameters, the session settings with which the
// server prints values on a replication connection: DateStyle ISO, IntervalStyle postgres,
// extra_float_digits 3 and client_encoding UTF8, replacing whatever cfg says (in any letter
// case). Startup parameters take precedence over postgresql.conf, ALTER ROLE/DATABASE SET and the
// "options" connection parameter. Every replication connection carries them; ordinary
// connections whose values must read like the stream's (an initial copy, rows read back to
// compare) should too (ConnectSQL pins them by default).
func PinValueSettings(cfg *pgconn.Config) { pin(cfg, valueSettings[:]) }

// SQLConnConfig describes an ordinary (not replication) connection that ConnectSQL opens.
type SQLConnConfig struct {
	// Config is the connection configuration, made by pgconn.ParseConfig (ParseConnString);
	// each attempt works on a copy of it.
	Config *pgconn.Config
	// BeforeConnect, if set, is called with the attempt's copy before it connects: it may set a
	// password (an IAM token) or a dialer (a tunnel). The pinned settings are set after it.
	BeforeConnect func(ctx context.Context, cfg *pgconn.Config) error
	// ApplicationName is the connection's application_name unless Config (or BeforeConnect)
	// sets one; with ForceApplicationName, whatever they set.
	ApplicationName      string
	ForceApplicationName bool
	// Settings are the session settings pinned on the connection; nil means DefaultSettings.
	Settings []Setting
	// Logger receives the server's notices (at Warn); nil logs nothing.
	Logger *slog.Logger
}

// ConnectSQL opens an ordinary connection as c describes. An error of BeforeConnect is returned
// wrapped, and a Config that pgconn.ParseConfig did not make is ErrNotParsed.
func ConnectSQL(ctx context.Context, c SQLConnConfig) (*pgconn.PgConn, error) {
	if c.Config == nil {
		return nil, fmt.Errorf("%w: no connection configuration", ErrInvalidConfig)
	}
	settings := c.Settings
	if settings == nil {
		settings = DefaultSettings()
	}
	pc, err := attempt(ctx, c.Config, c.BeforeConnect, settings, c.ApplicationName, c.ForceApplicationName, c.Logger)
	if err != nil {
		return nil, err
	}
	return connectNewer(ctx, pc, settings)
}

// notParsed is the panic pgconn raises for a Config that pgconn.ParseConfig did not make.
const notParsed = "config must be created by ParseConfig"

func connect(ctx context.Context, pc *pgconn.Config) (conn *pgconn.PgConn, err error) {
	defer func() {
		if r := recover(); r != nil {
			if r != notParsed {
				panic(r)
			}
			conn, err = nil, ErrNotParsed
		}
	}()
	return pgconn.ConnectConfig(ctx, pc)
}

// newerSettings are the newer settings pinned on ordinary connections by default: a copy's
// transaction lasts as long as its tables take.
var newerSettings = [...]Setting{{Name: "transaction_timeout", Value: "0", Since: 17}}

// tooOld holds the servers ("host:port/database") that refused a newer setting at startup.
var tooOld sync.Map

// connectNewer connects with pc, whose startup parameters carry the settings with a Since too,
// so that they hold from the first statement on. A server that does not know one refuses
// such a connection (SQLSTATE 42704): it is connected to again without them and given, through
// set_config, those its version has; it is remembered, and later connections to it go without
// them at once.
func connectNewer(ctx context.Context, pc *pgconn.Config, all []Setting) (*pgconn.PgConn, error) {
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
		conn, err := connect(ctx, with)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42704" {
			return conn, err
		}
		tooOld.Store(key, true)
	}
	conn, err := connect(ctx, pc)
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
