// Package catalog reads from the source database what pgoutput leaves out of a table's
// description and what Debezium-style events need: the table's key (its primary key, else a
// unique index of NOT NULL columns), which columns are NOT NULL, their defaults, the labels of
// enum types; and the tables a set of publications holds.
//
// A Reader is a format.Tables. It connects on first use, on an ordinary connection with the
// session settings package replication pins, and again after its connection is lost. It caches
// what it read by table, and reads a table again when a relation describes it differently (a
// column added, renamed or retyped). What it reads is the catalog as it is now, not as it was
// when a change was written: an event of a column since dropped is described as nullable with
// no default, and a primary key added to a table whose Relation messages stay the same (REPLICA
// IDENTITY FULL) is seen when the Reader is made anew.
//
// A Reader is safe for concurrent use; its queries run one at a time.
package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// ErrInvalidConfig is wrapped by the errors of a Config that cannot work.
var ErrInvalidConfig = errors.New("catalog: invalid configuration")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("catalog: closed")

// Config says how a Reader connects. ConnString or ConnConfig is required.
type Config struct {
	// ConnString is a libpq connection string or URL of the source database (an ordinary
	// connection: replication=database is not needed). Use it or ConnConfig, not both.
	ConnString string
	// ConnConfig is a connection configuration made by pgconn.ParseConfig.
	ConnConfig *pgconn.Config
	// BeforeConnect, if set, is called before every connection with a fresh copy of the
	// configuration: it may set a password (an IAM token) or a dialer.
	BeforeConnect func(ctx context.Context, cfg *pgconn.Config) error
	// Logger receives the server's notices; nil logs nothing.
	Logger *slog.Logger
}

// Reader reads the catalog of the source database. The zero value is not usable: make one with
// New.
type Reader struct {
	cfg  Config
	base *pgconn.Config

	mu     sync.Mutex
	conn   *pgconn.PgConn
	tables map[uint32]cached
	closed bool
}

type cached struct {
	shape string // the relation description it was read for
	table *format.Table
}

// New returns a Reader for cfg. It does not connect: the first query does.
func New(cfg Config) (*Reader, error) {
	switch {
	case cfg.ConnString != "" && cfg.ConnConfig != nil:
		return nil, fmt.Errorf("%w: set ConnString or ConnConfig, not both", ErrInvalidConfig)
	case cfg.ConnString == "" && cfg.ConnConfig == nil:
		return nil, fmt.Errorf("%w: no ConnString or ConnConfig", ErrInvalidConfig)
	}
	base, err := pgsession.ConnConfig(cfg.ConnConfig, cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	// An ordinary connection, even from the stream's connection string: a walsender does not
	// take the extended query protocol.
	base = base.Copy()
	delete(base.RuntimeParams, "replication")
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Reader{cfg: cfg, base: base, tables: map[uint32]cached{}}, nil
}

// Close closes the Reader's connection. It is safe to call twice.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.conn == nil {
		return nil
	}
	err := r.conn.Close(context.Background())
	r.conn = nil
	return err
}

// query runs sql with text parameters and returns the rows' text values (nil for NULL). r.mu is
// held.
func (r *Reader) query(ctx context.Context, sql string, params ...string) ([][][]byte, error) {
	rows, err := r.queryOnce(ctx, sql, params...)
	if err != nil && r.conn != nil && r.conn.IsClosed() && ctx.Err() == nil {
		// The connection was lost (a server restart, an idle timeout): once more, on a new one.
		rows, err = r.queryOnce(ctx, sql, params...)
	}
	return rows, err
}

func (r *Reader) queryOnce(ctx context.Context, sql string, params ...string) ([][][]byte, error) {
	if r.closed {
		return nil, ErrClosed
	}
	if r.conn == nil || r.conn.IsClosed() {
		conn, err := pgsession.Connect(ctx, pgsession.Options{Kind: pgsession.Source, Config: r.base,
			BeforeConnect: r.cfg.BeforeConnect, ApplicationName: "pgreorder-catalog", Logger: r.cfg.Logger})
		if errors.Is(err, pgsession.ErrNotParsed) {
			return nil, fmt.Errorf("%w: ConnConfig must be made by pgconn.ParseConfig", ErrInvalidConfig)
		}
		if err != nil {
			return nil, fmt.Errorf("catalog: connect: %w", err)
		}
		r.conn = conn
	}
	vals := make([][]byte, len(params))
	for i, p := range params {
		vals[i] = []byte(p)
	}
	res := r.conn.ExecParams(ctx, sql, vals, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, fmt.Errorf("catalog: %w", res.Err)
	}
	return res.Rows, nil
}

// Database returns the name of the database the Reader reads.
func (r *Reader) Database(ctx context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rows, err := r.query(ctx, "SELECT current_database()")
	if err != nil {
		return "", err
	}
	return string(rows[0][0]), nil
}

// TableName names a table.
type TableName struct {
	Schema, Name string
}

// String returns schema.name, each part double-quoted where it needs it to read back as one
// name.
func (t TableName) String() string {
	return pgsession.DisplayIdent(t.Schema) + "." + pgsession.DisplayIdent(t.Name)
}

// Published returns the tables the publications hold as the stream publishes them
// (pg_publication_tables: partitions under their root with publish_via_partition_root), sorted.
// A publication that does not exist holds none.
func (r *Reader) Published(ctx context.Context, publications []string) ([]TableName, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rows, err := r.query(ctx, `SELECT DISTINCT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables
		WHERE pubname = ANY($1::text[]) ORDER BY 1, 2`, pgsession.QuoteTextArray(publications))
	if err != nil {
		return nil, err
	}
	out := make([]TableName, len(rows))
	for i, row := range rows {
		out[i] = TableName{Schema: string(row[0]), Name: string(row[1])}
	}
	return out, nil
}

// PublishedTable is a table the publications hold, with its OID (the RelationID of its
// changes in the stream).
type PublishedTable struct {
	OID uint32
	TableName
}

// PublishedOIDs is Published with each table's OID, sorted by name.
func (r *Reader) PublishedOIDs(ctx context.Context, publications []string) ([]PublishedTable, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rows, err := r.query(ctx, `SELECT DISTINCT c.oid::text, pt.schemaname::text, pt.tablename::text
		FROM pg_catalog.pg_publication_tables pt
		JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = ANY($1::text[]) ORDER BY 2, 3`, pgsession.QuoteTextArray(publications))
	if err != nil {
		return nil, err
	}
	out := make([]PublishedTable, len(rows))
	for i, row := range rows {
		oid, err := strconv.ParseUint(string(row[0]), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("catalog: a table's OID %q: %w", row[0], err)
		}
		out[i] = PublishedTable{OID: uint32(oid), TableName: TableName{Schema: string(row[1]), Name: string(row[2])}}
	}
	return out, nil
}

// shape describes a relation for the cache: a table is read again when it changes.
func shape(rel *decoding.Relation) string {
	var b strings.Builder
	b.WriteString(rel.Namespace)
	b.WriteByte(0)
	b.WriteString(rel.Name)
	for _, c := range rel.Columns {
		fmt.Fprintf(&b, "\x00%s\x00%d\x00%d\x00%d", c.Name, c.TypeOID, c.TypeMod, c.Flags)
	}
	return b.String()
}

// Table returns what the catalog says of the table rel describes (its RelationID is the table's
// OID). It is format.Tables's method. A table that no longer exists is described with no key
// and no column facts.
func (r *Reader) Table(ctx context.Context, rel *decoding.Relation) (*format.Table, error) {
	if rel == nil {
		return nil, errors.New("catalog: nil relation")
	}
	sh := shape(rel)
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.tables[rel.RelationID]; ok && c.shape == sh {
		return c.table, nil
	}
	t, err := r.read(ctx, rel.RelationID)
	if err != nil {
		return nil, err
	}
	if len(r.tables) > 4096 {
		clear(r.tables)
	}
	r.tables[rel.RelationID] = cached{shape: sh, table: t}
	return t, nil
}

// columnsSQL lists a table's columns: name, NOT NULL, default expression (not of a generated
// column), type name, and an enum's labels as a JSON array.
const columnsSQL = `SELECT a.attname::text, a.attnotnull,
	CASE WHEN a.attgenerated = '' THEN pg_catalog.pg_get_expr(d.adbin, d.adrelid) END,
	t.typname::text,
	CASE WHEN t.typtype = 'e' THEN (SELECT pg_catalog.array_to_json(pg_catalog.array_agg(e.enumlabel ORDER BY e.enumsortorder))::text
		FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid) END
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

// indexesSQL lists a table's unique indexes that can key it (valid, not partial, no expression):
// primary key first, then the replica identity index, then by name; each with its key columns
// (a JSON array, in order) and whether they are all NOT NULL.
const indexesSQL = `SELECT i.indisprimary,
	(SELECT pg_catalog.array_to_json(pg_catalog.array_agg(a.attname ORDER BY k.n))::text
		FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE k.n <= i.indnkeyatts),
	(SELECT bool_and(a.attnotnull)
		FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE k.n <= i.indnkeyatts)
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::oid AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
ORDER BY i.indisprimary DESC, i.indisreplident DESC, c.relname`

// read reads table oid. r.mu is held.
func (r *Reader) read(ctx context.Context, oid uint32) (*format.Table, error) {
	id := strconv.FormatUint(uint64(oid), 10)
	rows, err := r.query(ctx, columnsSQL, id)
	if err != nil {
		return nil, err
	}
	t := &format.Table{Columns: make(map[string]format.TableColumn, len(rows))}
	for _, row := range rows {
		c := format.TableColumn{NotNull: string(row[1]) == "t", Default: string(row[2]), TypeName: string(row[3])}
		if row[4] != nil {
			if err := json.Unmarshal(row[4], &c.EnumLabels); err != nil {
				return nil, fmt.Errorf("catalog: enum labels of a column of table %d: %w", oid, err)
			}
			if c.EnumLabels == nil {
				c.EnumLabels = []string{}
			}
		}
		t.Columns[string(row[0])] = c
	}
	rows, err = r.query(ctx, indexesSQL, id)
	if err != nil {
		return nil, err
	}
	for _, row := range rows {
		primary, notNull := string(row[0]) == "t", string(row[2]) == "t"
		if row[1] == nil || !primary && !notNull {
			continue
		}
		if err := json.Unmarshal(row[1], &t.Key); err != nil {
			return nil, fmt.Errorf("catalog: key columns of table %d: %w", oid, err)
		}
		break
	}
	return t, nil
}

var _ format.Tables = (*Reader)(nil)
