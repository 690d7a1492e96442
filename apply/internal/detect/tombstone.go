package detect

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Tuning of the tombstone store.
const (
	// tombstonePurgeRows bounds the tombstones one purge removes.
	tombstonePurgeRows = 10000
	// TombstoneTrigger is the name of the trigger that records deletions.
	TombstoneTrigger = "pgreorder_tombstone"
)

// Exec runs one statement on the connection applying the transaction, inside it, and returns
// its result.
type Exec func(ctx context.Context, sql string, params [][]byte, oids []uint32, formats []int16) (*pgconn.Result, error)

// Tombstones is the record of local deletions that update_deleted detection reads: a table of
// (relid, key, deleted_at, xid) fed by an AFTER DELETE trigger on each target table the Applier
// writes. The trigger is an ordinary one: it fires in local sessions, not in the Applier's (nor
// in PostgreSQL's subscribers'), which run with session_replication_role = replica; a
// connection that could not set it says so with pgreorder.applying = on. A maintainer goroutine
// of the session installs the triggers (on its own connection, with a short lock timeout, so
// that no apply transaction waits for it), purges tombstones older than the retention, a
// bounded number at a time, and stops and resumes recording as the apply lag crosses the
// retention.
type Tombstones struct {
	table, fn string // quoted, qualified
	retention time.Duration
	dial      func(ctx context.Context) (*pgconn.PgConn, error) // the maintainer's connection
	now       func() time.Time
	stats     *TombstoneCounters
	log       *slog.Logger

	mu        sync.Mutex
	wanted    map[uint32]*Table // target tables without trigger yet, by OID
	installed map[uint32]bool

	lag atomic.Int64 // the apply lag at the last commit, in nanoseconds

	active bool // maintainer only: the trigger records
	done   chan struct{}
}

// TombstoneStore says where the tombstone store is and how its maintainer connects.
type TombstoneStore struct {
	Table, Function   string // quoted, qualified
	KeyIndex, AtIndex string // the names of the table's indexes, quoted, in the table's schema
	Retention         time.Duration
	// Dial opens the maintainer's connection, with the session settings of the applier's.
	Dial func(ctx context.Context) (*pgconn.PgConn, error)
	Now  func() time.Time
}

// NewTombstoneStore creates the tombstone table and the trigger function (recording) on conn.
func NewTombstoneStore(ctx context.Context, conn *pgconn.PgConn, st TombstoneStore, stats *TombstoneCounters,
	log *slog.Logger) (*Tombstones, error) {
	tb := &Tombstones{table: st.Table, fn: st.Function, retention: st.Retention, dial: st.Dial, now: st.Now,
		stats: stats, log: log, wanted: map[uint32]*Table{}, installed: map[uint32]bool{}, active: true}
	// One statement at a time, through the extended protocol, which takes no more than one.
	for _, sql := range []string{
		"CREATE TABLE IF NOT EXISTS " + tb.table + " (relid pg_catalog.oid NOT NULL, key pg_catalog.text[] NOT NULL, " +
			"deleted_at pg_catalog.timestamptz NOT NULL, xid pg_catalog.xid8 NOT NULL)",
		// Only the Applier's role, which owns the table, reads and writes it; local sessions
		// write it through the trigger function, which runs as that role.
		"REVOKE ALL ON " + tb.table + " FROM PUBLIC",
		"CREATE INDEX IF NOT EXISTS " + st.KeyIndex + " ON " + tb.table + " (relid, key)",
		"CREATE INDEX IF NOT EXISTS " + st.AtIndex + " ON " + tb.table + " (deleted_at)",
		tb.function(true),
		"REVOKE ALL ON FUNCTION " + tb.fn + "() FROM PUBLIC",
		"SET pgreorder.applying = on",
	} {
		if _, err := conn.ExecParams(ctx, sql, nil, nil, nil, nil).Close(); err != nil {
			return nil, fmt.Errorf("apply: setting up the tombstone table %s: %w", tb.table, err)
		}
	}
	stats.RetentionActive.Store(true)
	return tb, nil
}

// function is the trigger function: recording, or not. It fires in local sessions, whatever
// their role and search_path: it runs as its owner, the Applier's role (SECURITY DEFINER), the
// only one that may write the tombstone table, with a search_path of its own, and names every
// object with its schema.
func (tb *Tombstones) function(record bool) string {
	body := "BEGIN RETURN NULL; END"
	if record {
		body = `BEGIN
	IF pg_catalog.current_setting('pgreorder.applying', true) OPERATOR(pg_catalog.=) 'on' THEN RETURN NULL; END IF;
	INSERT INTO ` + tb.table + ` (relid, key, deleted_at, xid)
	VALUES (TG_ARGV[0]::pg_catalog.oid,
		ARRAY(SELECT pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.->>) a.k
			FROM pg_catalog.unnest(TG_ARGV[1:]) WITH ORDINALITY a(k, n) ORDER BY a.n),
		pg_catalog.clock_timestamp(), pg_catalog.pg_current_xact_id());
	RETURN NULL;
END`
	}
	return "CREATE OR REPLACE FUNCTION " + tb.fn + "() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER " +
		"SET search_path = pg_catalog, pg_temp AS $pgr$" + body + "$pgr$"
}

// Want asks for the trigger on m's target table.
func (tb *Tombstones) Want(m *Table) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if !tb.installed[m.OID] {
		tb.wanted[m.OID] = m
	}
}

// Committed records the apply lag of a source transaction just committed.
func (tb *Tombstones) Committed(commitTime time.Time) {
	if !commitTime.IsZero() {
		tb.lag.Store(int64(tb.now().Sub(commitTime)))
	}
}

// Lookup returns the latest tombstone of key in m's table, or nil.
func (tb *Tombstones) Lookup(ctx context.Context, exec Exec, m *Table, key [][]byte, formats []int16) (*conflict.LocalRow, error) {
	var b strings.Builder
	b.WriteString(`SELECT (pg_catalog.date_part('epoch', deleted_at) * 1000000)::int8, xid::text FROM ` + tb.table +
		` WHERE relid = $1 AND key = ARRAY[`)
	params := [][]byte{[]byte(strconv.FormatUint(uint64(m.OID), 10))}
	fmts := []int16{0}
	oids := []uint32{26} // oid
	for j, i := range m.Key {
		if j > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `pg_catalog.to_jsonb($%d) #>> '{}'`, j+2)
		params, fmts, oids = append(params, key[j]), append(fmts, formats[j]), append(oids, m.Columns[i].TypeOID)
	}
	b.WriteString(`] ORDER BY deleted_at DESC LIMIT 1`)
	res, err := exec(ctx, b.String(), params, oids, fmts)
	if err != nil {
		return nil, fmt.Errorf("apply: reading tombstones: %w", err)
	}
	if len(res.Rows) == 0 {
		return nil, nil
	}
	us, _ := strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
	x, _ := strconv.ParseUint(string(res.Rows[0][1]), 10, 64)
	return &conflict.LocalRow{Xid: uint32(x), CommitTime: time.UnixMicro(us).UTC()}, nil
}

// Start runs the maintainer until ctx is done; stop waits for it.
func (tb *Tombstones) Start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	tb.done = make(chan struct{})
	go func() {
		defer close(tb.done)
		tb.run(ctx)
	}()
	return func() {
		cancel()
		<-tb.done
	}
}

func (tb *Tombstones) run(ctx context.Context) {
	tick := min(max(tb.retention/4, 50*time.Millisecond), time.Second)
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		if conn == nil || conn.IsClosed() {
			c, err := tb.connect(ctx)
			if err != nil {
				tb.log.Debug("tombstones: connecting to the target", "err", err)
			}
			conn = c
		}
		if conn != nil {
			if err := tb.maintain(ctx, conn); err != nil && ctx.Err() == nil {
				tb.log.Debug("tombstones: maintenance", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(tick):
		}
	}
}

func (tb *Tombstones) connect(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := tb.dial(ctx)
	if err != nil {
		return nil, err
	}
	// Maintenance gives way to the tables' other users: a lock not granted soon is asked for
	// again at the next tick.
	if _, err := conn.ExecParams(ctx, "SELECT pg_catalog.set_config('lock_timeout', '1s', false), "+
		"pg_catalog.set_config('statement_timeout', '30s', false)", nil, nil, nil, nil).Close(); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// maintain installs the triggers wanted, follows the lag, purges, and counts.
func (tb *Tombstones) maintain(ctx context.Context, conn *pgconn.PgConn) error {
	tb.mu.Lock()
	var todo []*Table
	for _, m := range tb.wanted {
		todo = append(todo, m)
	}
	tb.mu.Unlock()
	for _, m := range todo {
		if err := tb.install(ctx, conn, m); err != nil {
			if pgsession.IsCode(err, pgsession.InsufficientPrivilege) {
				tb.log.Warn("the target role may not create the tombstone trigger: update_deleted is not detected for the table",
					"relation", m.Name, "err", err)
			} else {
				return err // a lock timeout: next time
			}
		}
		tb.mu.Lock()
		delete(tb.wanted, m.OID)
		tb.installed[m.OID] = true
		tb.mu.Unlock()
	}
	lag := time.Duration(tb.lag.Load())
	switch {
	case tb.active && lag > tb.retention:
		if _, err := conn.ExecParams(ctx, tb.function(false), nil, nil, nil, nil).Close(); err != nil {
			return err
		}
		tb.active = false
		tb.stats.RetentionActive.Store(false)
		tb.stats.RetentionStops.Add(1)
		tb.log.Warn("apply lag exceeds the conflict retention: deletions are no longer recorded, update_deleted is reported as "+
			"update_missing until the lag is back under it", "lag", lag, "retention", tb.retention)
	case !tb.active && lag <= tb.retention:
		if _, err := conn.ExecParams(ctx, tb.function(true), nil, nil, nil, nil).Close(); err != nil {
			return err
		}
		tb.active = true
		tb.stats.RetentionActive.Store(true)
		tb.log.Info("apply lag is back under the conflict retention: deletions are recorded again", "lag", lag,
			"retention", tb.retention)
	}
	return tb.purge(ctx, conn)
}

// install creates the trigger on m's table unless it is there.
func (tb *Tombstones) install(ctx context.Context, conn *pgconn.PgConn, m *Table) error {
	oid := strconv.FormatUint(uint64(m.OID), 10)
	rows, err := query(ctx, conn, "SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = $1::oid AND tgname = $2", oid, TombstoneTrigger)
	if err != nil || len(rows) > 0 {
		return err
	}
	// A trigger's arguments are literals, not parameters: the column names come from the
	// source, quoted by pgsession.QuoteLiteral, in one statement the extended protocol sends.
	args := []string{pgsession.QuoteLiteral(oid)}
	for _, i := range m.Key {
		args = append(args, pgsession.QuoteLiteral(m.Columns[i].Source))
	}
	_, err = conn.ExecParams(ctx, "CREATE TRIGGER "+TombstoneTrigger+" AFTER DELETE ON "+m.Name+" FOR EACH ROW EXECUTE FUNCTION "+
		tb.fn+"("+strings.Join(args, ", ")+")", nil, nil, nil, nil).Close()
	if pgsession.IsCode(err, pgsession.DuplicateObject) { // made meanwhile
		return nil
	}
	return err
}

// purge removes tombstones older than the retention, at most tombstonePurgeRows, and counts
// the rest.
func (tb *Tombstones) purge(ctx context.Context, conn *pgconn.PgConn) error {
	us := strconv.FormatInt(tb.retention.Microseconds(), 10)
	tag, err := conn.ExecParams(ctx, "DELETE FROM "+tb.table+" WHERE ctid = ANY (ARRAY(SELECT ctid FROM "+tb.table+
		" WHERE deleted_at < pg_catalog.clock_timestamp() - $1::int8 * interval '1 microsecond' LIMIT "+
		strconv.Itoa(tombstonePurgeRows)+"))", [][]byte{[]byte(us)}, nil, nil, nil).Close()
	if err != nil {
		return err
	}
	tb.stats.TombstonesPurged.Add(tag.RowsAffected())
	rows, err := query(ctx, conn, "SELECT count(*) FROM "+tb.table)
	if err != nil {
		return err
	}
	n, _ := strconv.ParseInt(string(rows[0][0]), 10, 64)
	tb.stats.TombstoneRows.Store(n)
	return nil
}

// TombstoneCounters are the counters of the tombstone store (update_deleted detection).
type TombstoneCounters struct {
	RetentionStops, TombstoneRows, TombstonesPurged atomic.Int64
	RetentionActive                                 atomic.Bool
}

// query runs sql with text parameters and returns the rows as text.
func query(ctx context.Context, conn *pgconn.PgConn, sql string, args ...string) ([][][]byte, error) {
	params := make([][]byte, len(args))
	for i, a := range args {
		params[i] = []byte(a)
	}
	res := conn.ExecParams(ctx, sql, params, nil, nil, nil).Read()
	return res.Rows, res.Err
}
