package changefeed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// DefaultTable is the table a TableStore keeps positions in when TableConfig.Table is empty.
const DefaultTable = "pgreorder_changefeed_position"

// TableConfig describes a TableStore.
type TableConfig struct {
	// ConnString is the database's connection string (the consumer's target, typically; it may
	// be the source's). Use it or ConnConfig.
	ConnString string
	// ConnConfig is a configuration made by pgx.ParseConfig; it is copied for each connection.
	ConnConfig *pgx.ConnConfig

	// Whatever the configuration says, the connections are made with the session settings with
	// which the stream's values read (DateStyle ISO, IntervalStyle postgres, extra_float_digits
	// 3, client_encoding UTF8), standard_conforming_strings on, and no statement, lock,
	// idle-in-transaction, idle-session or transaction timeout, which would end the stream's
	// connection, that holds the slot's lock for its whole life, or a unit the handler takes its
	// time over; application_name is "pgreorder-changefeed" unless the configuration sets one.
	// The search_path is the configuration's: the handler's SQL names its tables as it wants.

	// Schema and Table name the position table (created if missing): "public" and DefaultTable
	// when empty. They are quoted: give them as they are in the catalog.
	Schema, Table string
}

// TableStore keeps positions in a table of a PostgreSQL database, one row per slot, and gives
// the handler the transaction the position commits in (Tx): what the handler writes there
// commits together with the position, or not at all, so that a consumer that writes into that
// database holds every change exactly once without further care. Each copy worker and the
// stream have a connection of their own; a position commits with synchronous_commit on.
//
// The connections of a process that died may still finish what they had received, a commit
// included, after the next process started. Load waits for them to be gone before it reads the
// position: the stream's connection holds an advisory lock for the slot for its whole life, and
// the workers' connections another in shared mode; Load takes the first and, for a moment, the
// second exclusively. A second consumer of the same slot therefore waits in Load until the first
// is gone.
type TableStore struct {
	cfg   *pgx.ConnConfig
	table string
	// The advisory lock keys of the slot's stream connection and of its workers' (see Load).
	leadKey, workersKey int64

	mu     sync.Mutex
	conns  map[int]*pgx.Conn
	closed bool
}

// OpenTableStore connects to the database and creates the position table if it is missing.
func OpenTableStore(ctx context.Context, cfg TableConfig) (*TableStore, error) {
	pc := cfg.ConnConfig
	switch {
	case pc != nil && cfg.ConnString != "":
		return nil, fmt.Errorf("%w: TableConfig: set ConnString or ConnConfig, not both", ErrInvalidConfig)
	case pc == nil:
		var err error
		if pc, err = pgsession.ParsePgxConnString(cfg.ConnString); err != nil {
			return nil, fmt.Errorf("%w: TableConfig.ConnString: %w", ErrInvalidConfig, err)
		}
	}
	schema, table := cfg.Schema, cfg.Table
	if schema == "" {
		schema = "public"
	}
	if table == "" {
		table = DefaultTable
	}
	s := &TableStore{cfg: pc, table: pgsession.QuoteQualified(schema, table), conns: map[int]*pgx.Conn{}}
	conn, err := s.conn(ctx, StreamWorker)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+s.table+
		" (slot text PRIMARY KEY, system_id text NOT NULL, copy_done boolean NOT NULL, end_lsn pg_lsn NOT NULL, state bytea)")
	if err != nil && !pgsession.IsCode(err, pgsession.UniqueViolation) && !pgsession.IsCode(err, pgsession.DuplicateTable) { // made meanwhile
		s.Close()
		return nil, fmt.Errorf("changefeed: creating the position table %s: %w", s.table, err)
	}
	// The known tables and the table whose copy began (Position.Tables, Position.Sync), added
	// to a table an earlier release made: NULL reads as none.
	_, err = conn.Exec(ctx, "ALTER TABLE "+s.table+" ADD COLUMN IF NOT EXISTS tables bigint[], ADD COLUMN IF NOT EXISTS sync jsonb")
	if err != nil && !pgsession.IsCode(err, pgsession.DuplicateColumn) { // added meanwhile
		s.Close()
		return nil, fmt.Errorf("changefeed: adding columns to the position table %s: %w", s.table, err)
	}
	return s, nil
}

// conn returns the worker's connection, connecting if it has none (or a broken one).
func (s *TableStore) conn(ctx context.Context, worker int) (*pgx.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if c := s.conns[worker]; c != nil && !c.IsClosed() {
		return c, nil
	}
	c, err := pgsession.ConnectPgx(ctx, s.cfg, pgsession.Options{Kind: pgsession.Store, ApplicationName: "pgreorder-changefeed"})
	if errors.Is(err, pgsession.ErrNotParsed) {
		return nil, fmt.Errorf("%w: TableConfig.ConnConfig must be made by pgx.ParseConfig", ErrInvalidConfig)
	}
	if err != nil {
		return nil, fmt.Errorf("changefeed: connecting to the position table's database: %w", err)
	}
	lock, key := "SELECT pg_catalog.pg_advisory_lock_shared($1)", s.workersKey
	if worker == StreamWorker {
		lock, key = "SELECT pg_catalog.pg_advisory_lock($1)", s.leadKey // again, after a lost connection
	}
	if key != 0 {
		if _, err := c.Exec(ctx, lock, key); err != nil {
			c.Close(ctx)
			return nil, fmt.Errorf("changefeed: position table: locking the slot: %w", err)
		}
	}
	s.conns[worker] = c
	return c, nil
}

// fence takes the slot's locks (see TableStore) on the stream's connection.
func (s *TableStore) fence(ctx context.Context, conn *pgx.Conn, slot string) error {
	if s.leadKey != 0 {
		return nil
	}
	h := fnv.New64a()
	h.Write([]byte("pgreorder changefeed\x00" + s.table + "\x00" + slot))
	lead := int64(h.Sum64())
	h.Write([]byte("\x00workers"))
	workers := int64(h.Sum64())
	for _, step := range []struct {
		sql string
		key int64
	}{{"SELECT pg_catalog.pg_advisory_lock($1)", lead}, {"SELECT pg_catalog.pg_advisory_lock($1)", workers},
		{"SELECT pg_catalog.pg_advisory_unlock($1)", workers}} {
		if _, err := conn.Exec(ctx, step.sql, step.key); err != nil {
			return fmt.Errorf("changefeed: position table: locking the slot: %w", err)
		}
	}
	s.mu.Lock()
	s.leadKey, s.workersKey = lead, workers
	s.mu.Unlock()
	return nil
}

// Load waits for the connections of an earlier consumer of the slot to be gone, then reads the
// slot's row.
func (s *TableStore) Load(ctx context.Context, slot string) (Position, bool, error) {
	conn, err := s.conn(ctx, StreamWorker)
	if err != nil {
		return Position{}, false, err
	}
	if err := s.fence(ctx, conn, slot); err != nil {
		return Position{}, false, err
	}
	p := Position{Slot: slot}
	var (
		end    string
		tables []int64
		sync   []byte
	)
	err = conn.QueryRow(ctx, "SELECT system_id, copy_done, end_lsn::text, state, tables, sync::text FROM "+s.table+" WHERE slot = $1", slot).
		Scan(&p.SystemID, &p.CopyDone, &end, &p.State, &tables, &sync)
	if errors.Is(err, pgx.ErrNoRows) {
		return Position{}, false, nil
	}
	if err == nil {
		err = p.EndLSN.UnmarshalText([]byte(end))
	}
	if err == nil && tables != nil {
		p.Tables = make([]uint32, len(tables))
		for i, oid := range tables {
			p.Tables[i] = uint32(oid)
		}
	}
	if err == nil && sync != nil {
		err = json.Unmarshal(sync, &p.Sync)
	}
	if err != nil {
		return Position{}, false, fmt.Errorf("changefeed: reading the position table %s: %w", s.table, err)
	}
	return p, true, nil
}

// Begin starts a transaction on the worker's connection.
func (s *TableStore) Begin(ctx context.Context, worker int) (Unit, error) {
	conn, err := s.conn(ctx, worker)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("changefeed: position table: %w", err)
	}
	return &tableUnit{s: s, tx: tx}, nil
}

// Tx returns the transaction of a TableStore's unit, in which the batch's position commits;
// nil if b's store is another.
func Tx(b *Batch) pgx.Tx {
	if u, ok := b.Unit.(*tableUnit); ok {
		return u.tx
	}
	return nil
}

type tableUnit struct {
	s  *TableStore
	tx pgx.Tx
}

func (u *tableUnit) Commit(ctx context.Context, p *Position) error {
	if p != nil {
		if len(p.State) > MaxState {
			return fmt.Errorf("%w: State of %d bytes", ErrInvalidConfig, len(p.State))
		}
		// The commit must be durable before the source is acknowledged, whatever the role's
		// synchronous_commit; the upsert gives the transaction WAL to flush.
		if _, err := u.tx.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
			return fmt.Errorf("changefeed: position table: %w", err)
		}
		var tables []int64
		if p.Tables != nil {
			tables = make([]int64, len(p.Tables))
			for i, oid := range p.Tables {
				tables[i] = int64(oid)
			}
		}
		var sync *string
		if p.Sync != nil {
			b, err := json.Marshal(p.Sync)
			if err != nil {
				return fmt.Errorf("changefeed: position table: %w", err)
			}
			sync = new(string(b))
		}
		if _, err := u.tx.Exec(ctx, "INSERT INTO "+u.s.table+" (slot, system_id, copy_done, end_lsn, state, tables, sync) "+
			"VALUES ($1, $2, $3, $4::text::pg_lsn, $5, $6, $7::text::jsonb) ON CONFLICT (slot) DO UPDATE SET system_id = excluded.system_id, "+
			"copy_done = excluded.copy_done, end_lsn = excluded.end_lsn, state = excluded.state, tables = excluded.tables, sync = excluded.sync",
			p.Slot, p.SystemID, p.CopyDone, p.EndLSN.String(), p.State, tables, sync); err != nil {
			return fmt.Errorf("changefeed: writing the position table %s: %w", u.s.table, err)
		}
	}
	if err := u.tx.Commit(ctx); err != nil {
		return fmt.Errorf("changefeed: committing to the position table's database: %w", err)
	}
	return nil
}

func (u *tableUnit) Rollback(ctx context.Context) error { return u.tx.Rollback(ctx) }

// Close closes the store's connections. It is safe to call twice.
func (s *TableStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	for _, c := range s.conns {
		errs = append(errs, c.Close(context.Background()))
	}
	return errors.Join(errs...)
}
