package snapshot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// DefaultWorkers is the number of connections that copy in parallel when Config.Workers is 0.
const DefaultWorkers = 4

// DefaultChunkSize is the size of a table (or partition) above which it is copied in several
// chunks, and the size of each, when Config.ChunkSize is 0.
const DefaultChunkSize = 64 << 20

// Config describes an initial copy. A connection (ConnString or ConnConfig) and the
// Publications are required; every other field has a working zero value.
type Config struct {
	// ConnString is a libpq connection string or URL for the normal (not replication)
	// connections that copy. A "replication" parameter in it is ignored, so the replication
	// connection's string can be used. Use it or ConnConfig, not both.
	ConnString string
	// ConnConfig is a connection configuration made by pgconn.ParseConfig and adjusted as the
	// application needs (TLS, DialFunc, ...). It is copied before each connection and never
	// modified.
	ConnConfig *pgconn.Config
	// BeforeConnect, if set, is called before every connection with a fresh copy of the
	// configuration that it may change (a password that expires). An error fails Open.
	BeforeConnect func(ctx context.Context, cfg *pgconn.Config) error

	// Whatever the configuration says, the connections are made with the session settings that
	// the replication connection pins and with which pgoutput formats text values: DateStyle ISO,
	// IntervalStyle postgres, extra_float_digits 3 and client_encoding UTF8, so that a copied
	// value reads exactly as the same value streamed. TimeZone is left as configured: give both
	// connections the same (or read timestamptz values as instants, which they are).

	// Publications are the publications the stream reads (the replication Config's): the copy
	// covers the tables they publish, with their column lists and row filters (PostgreSQL 15+).
	Publications []string

	// Workers is the number of connections that copy in parallel, each in its own transaction
	// in the snapshot; 0 means DefaultWorkers. Open uses no more connections than there are
	// chunks.
	Workers int
	// ChunkSize is the size in bytes above which a table, or a partition, is copied in several
	// chunks (ranges of its pages, by ctid), each at most about that size; 0 means
	// DefaultChunkSize, a negative value never splits. Tables are split on PostgreSQL 14 and
	// later only (earlier servers cannot scan a range of pages).
	ChunkSize int64
	// Tables, if set, selects the tables to copy among those the publications publish: a table
	// is copied when it returns true. It is called by Open, once per table, with the table fully
	// described (columns, key, row filter, size).
	Tables func(*Table) bool
	// Binary copies values in the binary format (the types' send functions), as a slot read
	// with binary 'true' streams them; columns whose type has no send function are copied in the
	// text format, as pgoutput sends them. Set it exactly when the replication Config's Binary is
	// set, so that copied and streamed values have the same format.
	Binary bool

	// Logger receives the plan, the progress of each table and server notices (at Warn); nil
	// logs nothing.
	Logger *slog.Logger
	// Name is what the log lines call this copy ("<Name> ready", "<Name> done"): "initial copy"
	// when empty. The copy of tables added to a publication later is named "added tables copy".
	Name string
}

// name returns what the log lines call the copy.
func (c *Config) name() string {
	if c.Name == "" {
		return "initial copy"
	}
	return c.Name
}

func (c *Config) validate() error {
	switch {
	case c.ConnConfig != nil && c.ConnString != "":
		return configerr.New(ErrInvalidConfig, field("ConnString"), "is set, and so is %s: set one of them", field("ConnConfig"))
	case c.ConnConfig == nil && c.ConnString == "":
		return configerr.New(ErrInvalidConfig, field("ConnString"), "is required (or %s)", field("ConnConfig"))
	case len(c.Publications) == 0:
		return configerr.New(ErrInvalidConfig, field("Publications"), "is required")
	case c.Workers < 0:
		return configerr.New(ErrInvalidConfig, field("Workers"), "%d (want 0 for the default, or more)", c.Workers)
	}
	for _, p := range c.Publications {
		if p == "" {
			return configerr.New(ErrInvalidConfig, field("Publications"), "holds an empty name")
		}
	}
	return nil
}

func (c *Config) workers() int {
	if c.Workers == 0 {
		return DefaultWorkers
	}
	return c.Workers
}

func (c *Config) chunkSize() int64 {
	if c.ChunkSize == 0 {
		return DefaultChunkSize
	}
	return c.ChunkSize
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

func (c *Config) baseConnConfig() (*pgconn.Config, error) {
	pc, err := pgsession.ConnConfig(c.ConnConfig, c.ConnString)
	if err != nil {
		return nil, &ConfigError{Field: field("ConnString"), Reason: configerr.Words("is not a connection string"), Err: ErrInvalidConfig, Cause: err}
	}
	return pc, nil
}

// connect opens one normal connection with the pinned settings.
func (c *Config) connect(ctx context.Context, base *pgconn.Config, log *slog.Logger) (*pgconn.PgConn, error) {
	// The values must read exactly as the stream's: a Source connection pins the settings of a
	// replication connection.
	conn, err := pgsession.Connect(ctx, pgsession.Options{Kind: pgsession.Source, Config: base, BeforeConnect: c.BeforeConnect,
		ApplicationName: "pgreorder-copy", Logger: log})
	if errors.Is(err, pgsession.ErrNotParsed) {
		return nil, configerr.New(ErrInvalidConfig, field("ConnConfig"), "must be made by pgconn.ParseConfig")
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: connect: %w", err)
	}
	return conn, nil
}
