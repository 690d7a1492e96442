// Package pgconnect redacts connection strings for messages (Redact, ParseConfig, RedactError),
// and prepares and opens the connections pgreorder's packages make to a server
// described by a *pgconn.Config: the walsender connection of package replication and the
// ordinary connections of package snapshot. It is one place for what they share: a copy of the
// user's configuration per attempt, the user's hook applied to it, the session settings values
// are printed with, a default application_name, server notices logged, and a Config that
// pgconn.ParseConfig did not make reported as an error instead of pgconn's panic.
package pgconnect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

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
// startup parameter, with the pinned value settings, application_name appName unless one is set,
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

// notParsed is the panic pgconn raises for a Config that pgconn.ParseConfig did not make.
const notParsed = "config must be created by ParseConfig"

// Connect is pgconn.ConnectConfig, returning ErrNotParsed where pgconn panics for a Config that
// pgconn.ParseConfig did not make.
func Connect(ctx context.Context, pc *pgconn.Config) (conn *pgconn.PgConn, err error) {
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
