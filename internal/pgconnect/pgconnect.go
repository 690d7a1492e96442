// Package pgconnect redacts connection strings for messages (Redact, ParseConfig, RedactError),
// and prepares and opens the connections pgreorder's packages make to a server
// described by a *pgconn.Config: the walsender connection of package replication and the
// ordinary connections of package snapshot. It is one place for what they share: a copy of the
// user's configuration per attempt, the user's hook applied to it, the session settings values
// are printed with and those that change how SQL is read or could end a session, a default
// application_name, server notices logged, and a Config that
// pgconn.ParseConfig did not make reported as an error instead of pgconn's panic.
package pgconnect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotParsed is returned by Connect for a Config that pgconn.ParseConfig did not make.
var ErrNotParsed = errors.New("the connection configuration must be made by pgconn.ParseConfig")

// valueSettings are the session settings PostgreSQL's own subscriber pins on its replication
// connection (libpqwalreceiver), because pgoutput formats text values with the walsender
// session's settings: DateStyle ISO (dates as 2024-03-04 whatever the server's day/month order),
// IntervalStyle postgres, extra_float_digits 3 (float4/float8 that read back exactly), and the
// client encoding (the subscriber asks for its database encoding; a Go consumer wants UTF8).
var valueSettings = [...][2]string{
	{"datestyle", "ISO"},
	{"intervalstyle", "postgres"},
	{"extra_float_digits", "3"},
	{"client_encoding", "UTF8"},
}

// sessionSettings are the other session settings every connection made here pins, whatever
// ALTER DATABASE, ALTER ROLE or the connection string say, as PostgreSQL's subscriber pins
// search_path on its connections to the publisher.
var sessionSettings = [...][2]string{
	// Backslashes in '...' literals are ordinary characters.
	{"standard_conforming_strings", "on"},
	// No function, operator or type of another schema stands in for a built-in one; the
	// published tables are named with their schema, and expressions read back from the catalog
	// (pg_get_expr) come with every schema they need.
	{"search_path", "pg_catalog, pg_temp"},
	// A copy's statements and transactions last as long as its tables take, and its workers
	// wait idle in their transaction for their turn: no server-side timeout may end them.
	// transaction_timeout (17+) is one of newerSettings: a server that does not know a
	// setting sent at startup refuses the connection.
	{"statement_timeout", "0"},
	{"idle_in_transaction_session_timeout", "0"},
	{"idle_session_timeout", "0"},
}

// PinValueSettings sets valueSettings in cfg's startup parameters, replacing whatever cfg says
// (in any letter case).
func PinValueSettings(cfg *pgconn.Config) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	for k := range cfg.RuntimeParams {
		for _, p := range valueSettings {
			if strings.EqualFold(k, p[0]) {
				delete(cfg.RuntimeParams, k)
			}
		}
	}
	for _, p := range valueSettings {
		cfg.RuntimeParams[p[0]] = p[1]
	}
}

// Attempt returns the configuration of one connection attempt: a copy of base, passed to before
// (when not nil: it may set a password or a dialer for this attempt), without a "replication"
// startup parameter, with the pinned value and session settings, application_name appName unless one is set,
// and server notices logged at Warn on log before base's own OnNotice sees them. base is not
// modified.
func Attempt(ctx context.Context, base *pgconn.Config, before func(context.Context, *pgconn.Config) error,
	appName string, log *slog.Logger) (*pgconn.Config, error) {
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
		if strings.EqualFold(k, "replication") {
			delete(pc.RuntimeParams, k)
		}
		if strings.EqualFold(k, "application_name") {
			hasAppName = true
		}
	}
	PinValueSettings(pc)
	pin(pc, sessionSettings[:])
	if !hasAppName {
		pc.RuntimeParams["application_name"] = appName
	}
	userNotice := pc.OnNotice
	pc.OnNotice = func(conn *pgconn.PgConn, n *pgconn.Notice) {
		log.Warn("server notice", "severity", n.Severity, "code", n.Code, "message", n.Message,
			"detail", n.Detail, "hint", n.Hint, "where", n.Where)
		if userNotice != nil {
			userNotice(conn, n)
		}
	}
	return pc, nil
}

// pin sets settings in cfg's startup parameters, replacing whatever cfg says in any letter case.
func pin(cfg *pgconn.Config, settings [][2]string) {
	for k := range cfg.RuntimeParams {
		for _, p := range settings {
			if strings.EqualFold(k, p[0]) {
				delete(cfg.RuntimeParams, k)
			}
		}
	}
	for _, p := range settings {
		cfg.RuntimeParams[p[0]] = p[1]
	}
}

// notParsed is the panic pgconn raises for a Config that pgconn.ParseConfig did not make.
const notParsed = "config must be created by ParseConfig"

// Connect is pgconn.ConnectConfig, returning ErrNotParsed where pgconn panics for a Config that
// pgconn.ParseConfig did not make. An ordinary connection (no "replication" startup parameter)
// also gets the newer pinned settings (see ConnectNewer): transaction_timeout 0 where the server
// has it (17+).
func Connect(ctx context.Context, pc *pgconn.Config) (conn *pgconn.PgConn, err error) {
	if pc.RuntimeParams["replication"] != "" {
		return connect(ctx, pc)
	}
	return ConnectNewer(ctx, pc, newerSettings[:])
}

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

// Newer is a setting to pin that not every supported server knows: Since is the first major
// version that does.
type Newer struct {
	Name, Value string
	Since       int
}

// newerSettings are the newer settings Connect pins on ordinary connections: a copy's
// transaction lasts as long as its tables take.
var newerSettings = [...]Newer{{Name: "transaction_timeout", Value: "0", Since: 17}}

// tooOld holds the servers ("host:port/database") that refused a newer setting at startup.
var tooOld sync.Map

// ConnectNewer connects as Connect with pc, whose startup parameters carry the newer settings
// too, so that they hold from the first statement on. A server that does not know one refuses
// such a connection (SQLSTATE 42704): it is connected to again without them and given, through
// set_config, those its version has; it is remembered, and later connections to it go without
// them at once.
func ConnectNewer(ctx context.Context, pc *pgconn.Config, settings []Newer) (*pgconn.PgConn, error) {
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
	major := ServerMajor(conn)
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

// ServerMajor is the major version the server reported (server_version), 0 if it did not.
func ServerMajor(conn *pgconn.PgConn) int {
	v := conn.ParameterStatus("server_version")
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		v = v[:i]
	}
	n, _ := strconv.Atoi(v)
	return n
}
