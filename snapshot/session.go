package snapshot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/replication"
)

// Session is an initial copy ready to run: its worker connections each hold a transaction in
// the snapshot, and the tables to copy are known and split in chunks. Open makes one; Run copies;
// Close ends the transactions and closes the connections.
type Session struct {
	cfg    Config
	log    *slog.Logger
	snap   replication.Snapshot
	major  int
	tables []*Table
	plan   []planned

	conns  []*pgconn.PgConn // one per worker, each in a transaction in the snapshot
	broken []atomic.Bool    // the worker's connection was closed by an abandoned COPY

	mu     sync.Mutex
	state  int // stateOpen, stateRunning, stateRan or stateClosed
	cancel context.CancelFunc
	done   chan struct{}
}

const (
	stateOpen = iota
	stateRunning
	stateRan
	stateClosed
)

// planned is one chunk to copy.
type planned struct {
	table  *Table
	index  int
	source string
	pages  string
	sql    string
}

// Open prepares a copy in the exported snapshot snap (from replication.Conn.CreateSlot with
// replication.ExportSnapshot): it connects the workers, starts a REPEATABLE READ transaction in
// the snapshot on each (SET TRANSACTION SNAPSHOT), lists the published tables as they were at the
// snapshot's point, takes an ACCESS SHARE lock on each (so that no TRUNCATE, ALTER or VACUUM FULL
// changes them under the copy) and splits them in chunks.
//
// The replication connection that created the slot must stay open and idle until Open
// returns: the server exports the snapshot only that long. Once Open has returned, every worker
// has imported the snapshot and it no longer depends on that connection: the caller may then
// call StartStreaming on it (see the package documentation for when to read the stream). If
// Open fails, it has closed what it opened; the snapshot is still exported and Open may be
// tried again.
func Open(ctx context.Context, cfg Config, snap replication.Snapshot) (_ *Session, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if snap.Name == "" {
		return nil, fmt.Errorf("%w: the Snapshot has no name (create the slot with replication.ExportSnapshot)", ErrInvalidConfig)
	}
	base, err := cfg.baseConnConfig()
	if err != nil {
		return nil, err
	}
	log := cfg.logger()
	s := &Session{cfg: cfg, log: log, snap: snap}
	defer func() {
		if err != nil {
			s.closeConns(ctx)
			s.state = stateClosed
		}
	}()
	start := time.Now()
	c0, err := cfg.connect(ctx, base, log)
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, c0)
	if s.major, err = parseMajor(c0.ParameterStatus("server_version")); err != nil {
		return nil, err
	}
	if s.major < 13 {
		return nil, fmt.Errorf("%w: PostgreSQL %d (13 or later is needed)", ErrUnsupported, s.major)
	}

	// What the publications publish, from the current catalog, then the same publications'
	// definitions now and in the snapshot: if they differ, the list is not the snapshot's.
	pub, err := listPublished(ctx, c0, s.major, cfg.Publications)
	if err != nil {
		return nil, err
	}
	now, err := pubFingerprint(ctx, c0, s.major, cfg.Publications)
	if err != nil {
		return nil, err
	}
	if err := begin(ctx, c0, snap.Name); err != nil {
		return nil, err
	}
	if err := checkPublications(ctx, c0, cfg.Publications); err != nil {
		return nil, err
	}
	then, err := pubFingerprint(ctx, c0, s.major, cfg.Publications)
	if err != nil {
		return nil, err
	}
	if now != then {
		return nil, fmt.Errorf("%w: a publication of %s was created, altered or dropped after the consistent point %s; "+
			"drop slot %q and start again", ErrPublicationChanged, strings.Join(cfg.Publications, ", "), snap.ConsistentPoint, snap.Slot)
	}
	blockSize, err := queryInt(ctx, c0, "SELECT pg_catalog.current_setting('block_size')")
	if err != nil {
		return nil, err
	}
	tables, err := describe(ctx, c0, s.major, pub, cfg.Binary, blockSize)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(tables, func(a, b *Table) int {
		return cmp.Or(cmp.Compare(a.Schema, b.Schema), cmp.Compare(a.Name, b.Name))
	})
	for _, t := range tables {
		if cfg.Tables == nil || cfg.Tables(t) {
			s.tables = append(s.tables, t)
		}
	}
	var lock string // every worker holds ACCESS SHARE on every table from its start
	if len(s.tables) > 0 {
		names := make([]string, len(s.tables))
		for i, t := range s.tables {
			names[i] = t.sqlName()
		}
		lock = "LOCK TABLE " + strings.Join(names, ", ") + " IN ACCESS SHARE MODE"
		if _, err := c0.Exec(ctx, lock).ReadAll(); err != nil {
			return nil, fmt.Errorf("snapshot: locking the tables: %w", err)
		}
	}
	s.plan = makePlan(s.tables, cfg.chunkSize()/blockSize, cfg.chunkSize() < 0, cfg.Binary)

	// The other workers, connected and in the snapshot in parallel.
	n := max(1, min(cfg.workers(), len(s.plan)))
	more := make([]*pgconn.PgConn, n-1)
	errs := make([]error, n-1)
	var wg sync.WaitGroup
	for i := range more {
		wg.Go(func() {
			c, err := cfg.connect(ctx, base, log)
			if err == nil {
				if err = begin(ctx, c, snap.Name); err == nil && lock != "" {
					err = lockMore(ctx, c, lock)
				}
				if err != nil {
					c.Close(ctx)
					c = nil
				}
			}
			more[i], errs[i] = c, err
		})
	}
	wg.Wait()
	for _, c := range more {
		if c != nil {
			s.conns = append(s.conns, c)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s.broken = make([]atomic.Bool, len(s.conns))
	var size int64
	for _, t := range s.tables {
		size += t.Size
	}
	log.Info(cfg.name()+" ready", "snapshot", snap.Name, "consistent_point", snap.ConsistentPoint,
		"tables", len(s.tables), "chunks", len(s.plan), "workers", len(s.conns), "bytes", size,
		"server_major", s.major, "elapsed", time.Since(start).Round(time.Millisecond))
	if len(s.tables) == 0 {
		log.Warn("nothing to copy: the publications publish no table (or Config.Tables selected none)",
			"publications", strings.Join(cfg.Publications, ", "))
	}
	for _, t := range s.tables {
		log.Debug("table", "table", t.String(), "oid", t.OID, "columns", len(t.Relation.Columns), "bytes", t.Size,
			"chunks", t.Chunks, "row_filter", t.RowFilter, "partitioned", t.Partitioned)
	}
	return s, nil
}

// moreLockTimeout bounds how long a worker after the first waits for its table locks.
const moreLockTimeout = 10 * time.Second

// lockMore takes the tables' locks in a worker after the first. A worker that first asked for a
// table's lock when it reached its first chunk of it would queue behind any ACCESS EXCLUSIVE
// request made meanwhile (a TRUNCATE or ALTER TABLE on the source), which itself waits for the
// first worker's lock, held until the copy ends: a wait that no one would ever end, and that
// PostgreSQL cannot see as a deadlock. Locked from the start, a worker never asks again; and if
// such a request is already queued, the lock times out (lock_not_available) instead of waiting
// forever, and the copy fails so that it can be started again.
func lockMore(ctx context.Context, conn *pgconn.PgConn, lock string) error {
	sql := "SET LOCAL lock_timeout = " + strconv.Itoa(int(moreLockTimeout/time.Millisecond)) + "; " + lock + "; SET LOCAL lock_timeout = 0"
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("snapshot: locking the tables (a lock on one of them that conflicts is held or awaited; the copy can be started again): %w", err)
	}
	return nil
}

// begin starts the transaction in the snapshot. The exported snapshot must still exist.
func begin(ctx context.Context, conn *pgconn.PgConn, name string) error {
	_, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT "+pgsession.QuoteLiteral(name)+
		"; SET LOCAL idle_in_transaction_session_timeout = 0").ReadAll()
	switch {
	case err == nil:
		return nil
	case pgsession.IsCode(err, pgsession.InvalidParameterValue) || pgsession.IsCode(err, pgsession.UndefinedObject):
		// "invalid snapshot identifier" (invalid_parameter_value) before PostgreSQL 18,
		// "snapshot ... does not exist" (undefined_object) since.
		return fmt.Errorf("%w: snapshot %q: %w", ErrSnapshotNotExported, name, err)
	default:
		return fmt.Errorf("snapshot: importing snapshot %q: %w", name, err)
	}
}

// checkPublications checks that every publication existed at the snapshot's point.
func checkPublications(ctx context.Context, conn *pgconn.PgConn, pubs []string) error {
	rows, err := query(ctx, conn, "SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ("+literals(pubs)+")")
	if err != nil {
		return fmt.Errorf("snapshot: reading publications: %w", err)
	}
	var missing []string
	for _, p := range pubs {
		if !slices.ContainsFunc(rows, func(r []*string) bool { return *r[0] == p }) {
			missing = append(missing, strconv.Quote(p))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s", ErrPublicationNotFound, strings.Join(missing, ", "))
	}
	return nil
}

// makePlan splits the tables in chunks of at most pagesPerChunk pages (where the relation can
// be read by ranges of pages), largest tables first.
func makePlan(tables []*Table, pagesPerChunk int64, noSplit, binary bool) []planned {
	pagesPerChunk = max(pagesPerChunk, 1)
	var plan []planned
	for _, t := range tables {
		first := len(plan)
		for _, src := range t.sources {
			if noSplit || !src.ranges || src.pages <= pagesPerChunk {
				plan = append(plan, planned{table: t, source: src.sqlName, sql: chunkSQL(t, src, -1, -1, binary)})
				continue
			}
			for lo := int64(0); lo < src.pages; lo += pagesPerChunk {
				hi, pages := lo+pagesPerChunk, fmt.Sprintf("[%d,%d)", lo, lo+pagesPerChunk)
				if hi >= src.pages {
					// The last chunk is open-ended: rows the snapshot sees cannot lie beyond the
					// size read, but nothing is lost if they did.
					hi, pages = -1, fmt.Sprintf("[%d,end)", lo)
				}
				plan = append(plan, planned{table: t, source: src.sqlName, pages: pages, sql: chunkSQL(t, src, lo, hi, binary)})
			}
		}
		t.Chunks = len(plan) - first
		for i := first; i < len(plan); i++ {
			plan[i].index = i - first
		}
	}
	slices.SortStableFunc(plan, func(a, b planned) int { return cmp.Compare(b.table.Size, a.table.Size) })
	return plan
}

// Tables returns the tables the copy covers, sorted by schema and name.
func (s *Session) Tables() []*Table { return s.tables }

// Snapshot returns the snapshot the copy reads.
func (s *Session) Snapshot() replication.Snapshot { return s.snap }

// Workers returns the number of worker connections.
func (s *Session) Workers() int { return len(s.conns) }

// Run copies every chunk, calling h for each from the worker goroutines, and returns once all
// are copied, or at the first error (a handler's, the server's, the context's), after stopping
// the other workers. An error concerning a chunk is a *ChunkError. Run can be called once.
//
// The error returned is the one that stopped the copy: the first that a worker met, except that
// a cancellation (an error that is context.Canceled) gives way to any other error a worker
// returns before Run does. A cancellation is a consequence: of Run stopping the workers after
// another's error, or of a handler's own shared state that another chunk's failure ended (a
// store whose chunks share one transaction aborts it when one fails), and the latter can come
// back before the failure that caused it.
func (s *Session) Run(ctx context.Context, h Handler) (*Result, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: nil Handler", ErrInvalidConfig)
	}
	s.mu.Lock()
	switch s.state {
	case stateClosed:
		s.mu.Unlock()
		return nil, ErrClosed
	case stateRunning, stateRan:
		s.mu.Unlock()
		return nil, ErrRunning
	}
	ctx, cancel := context.WithCancel(ctx)
	s.state, s.cancel, s.done = stateRunning, cancel, make(chan struct{})
	s.mu.Unlock()
	defer func() {
		cancel()
		s.mu.Lock()
		if s.state == stateRunning {
			s.state = stateRan
		}
		close(s.done)
		s.mu.Unlock()
	}()

	start := time.Now()
	var (
		next     atomic.Int64
		copied   atomic.Int64
		errMu    sync.Mutex
		firstErr error // the error Run returns
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil || cancellation(firstErr) && !cancellation(err) {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}
	for w := range s.conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(s.plan) {
					return
				}
				if err := s.copyChunk(ctx, w, s.plan[i], h); err != nil {
					fail(err)
					return
				}
				copied.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if int(copied.Load()) != len(s.plan) {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("snapshot: copy stopped: %w", context.Cause(ctx))
		}
		return nil, fmt.Errorf("snapshot: copy stopped after %d of %d chunks", copied.Load(), len(s.plan))
	}
	res := &Result{ConsistentPoint: s.snap.ConsistentPoint, Slot: s.snap.Slot, Tables: s.tables}
	for _, t := range s.tables {
		res.Rows += t.Rows()
	}
	s.log.Info(s.cfg.name()+" done", "tables", len(s.tables), "rows", res.Rows,
		"elapsed", time.Since(start).Round(time.Millisecond), "consistent_point", s.snap.ConsistentPoint)
	return res, nil
}

// copyChunk hands one chunk to the handler on worker w and checks that it was read whole.
func (s *Session) copyChunk(ctx context.Context, w int, p planned, h Handler) error {
	if s.broken[w].Load() {
		return &ChunkError{Table: p.table.sqlName(), Chunk: p.index, Err: ErrNotConsumed}
	}
	c := &Chunk{Table: p.table, Index: p.index, Worker: w, Source: p.source, Pages: p.pages,
		ctx: ctx, s: s, conn: s.conns[w], sql: p.sql, binary: s.cfg.Binary}
	start := time.Now()
	err := h(ctx, c)
	switch {
	case err != nil:
		return &ChunkError{Table: p.table.sqlName(), Chunk: p.index, Err: err}
	case c.err != nil:
		return &ChunkError{Table: p.table.sqlName(), Chunk: p.index, Err: c.err}
	case !c.complete && ctx.Err() != nil:
		// The handler stopped reading when the copy was stopped: a cancellation, like the
		// error Changes yields then.
		return &ChunkError{Table: p.table.sqlName(), Chunk: p.index, Err: fmt.Errorf("%w (%w)", ctx.Err(), ErrNotConsumed)}
	case !c.complete:
		return &ChunkError{Table: p.table.sqlName(), Chunk: p.index, Err: ErrNotConsumed}
	}
	s.log.Debug("chunk copied", "chunk", c.String(), "worker", w, "rows", c.rows,
		"elapsed", time.Since(start).Round(time.Millisecond))
	if int(p.table.done.Add(1)) == p.table.Chunks {
		s.log.Info("table copied", "table", p.table.String(), "rows", p.table.Rows(), "chunks", p.table.Chunks)
	}
	return nil
}

func (s *Session) markBroken(w int) { s.broken[w].Store(true) }

// cancellation reports whether err says that the work was stopped from outside, not that it
// failed: see Run.
func cancellation(err error) bool { return errors.Is(err, context.Canceled) }

// Close stops a Run in progress (from another goroutine; never from a Handler) and waits for
// it, ends the transactions and closes the connections. It is safe to call twice.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return nil
	}
	running, cancel, done := s.state == stateRunning, s.cancel, s.done
	s.state = stateClosed
	s.mu.Unlock()
	if running {
		cancel()
		<-done
	}
	return s.closeConns(ctx)
}

// closeConns ends the read-only transactions (by closing their connections) and closes the
// connections.
func (s *Session) closeConns(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var errs []error
	for _, c := range s.conns {
		if err := c.Close(ctx); err != nil && !c.IsClosed() {
			errs = append(errs, err)
		}
	}
	s.conns = nil
	return errors.Join(errs...)
}

// Result is what a copy did.
type Result struct {
	// ConsistentPoint is the snapshot's point: the copy holds every transaction that committed
	// before it, the stream of the slot that exported it every one that commits at or after it.
	ConsistentPoint decoding.LSN
	// Slot is the slot that exported the snapshot.
	Slot string
	// Tables are the tables copied, with their row counts (Table.Rows).
	Tables []*Table
	// Rows is the number of rows copied.
	Rows int64
}

// Copied reports whether the table whose OID is relationID was copied.
func (r *Result) Copied(relationID uint32) bool {
	return slices.ContainsFunc(r.Tables, func(t *Table) bool { return t.OID == relationID })
}

// Covers reports whether the copy already holds the changes that a streamed transaction
// committed at commitLSN (its CommitLSN) made to table relationID: the table was copied, and the
// transaction committed before the consistent point. A consumer skips such changes. It matters
// for copies made with SyncTables while a stream runs: the stream of a slot created with the
// copy's own snapshot never sends a transaction that Covers.
func (r *Result) Covers(relationID uint32, commitLSN decoding.LSN) bool {
	return commitLSN < r.ConsistentPoint && r.Copied(relationID)
}

// Copy is Open, Run and Close: it copies the published tables in the exported snapshot snap,
// handing each chunk to h. The replication connection that created the slot must stay open and
// idle until Copy returns (use Open and Run to start streaming earlier).
func Copy(ctx context.Context, cfg Config, snap replication.Snapshot, h Handler) (*Result, error) {
	s, err := Open(ctx, cfg, snap)
	if err != nil {
		return nil, err
	}
	res, err := s.Run(ctx, h)
	if cerr := s.Close(ctx); err == nil && cerr != nil {
		s.log.Warn("closing the copy connections", "error", cerr)
	}
	return res, err
}

// SyncTables copies tables in a snapshot of their own while a stream runs, typically tables
// added to a publication after the initial copy (the stream then sends their changes, never
// their existing rows). It connects with repl (a copy of the stream's replication Config whose
// Slot names a slot that does not exist: SyncTables makes it temporary), creates that slot with an
// exported snapshot, opens the copy in it, closes the replication connection (which drops the
// slot) and runs the copy. cfg.Tables selects the tables (for instance those the stream showed
// that no Result has Copied); cfg's connection and Publications default to repl's.
//
// The consumer applies the rows, and from then on skips the changes the Result Covers: those
// of streamed transactions that committed before its consistent point, which the copy holds
// already.
func SyncTables(ctx context.Context, repl replication.Config, cfg Config, h Handler) (*Result, error) {
	if cfg.ConnString == "" && cfg.ConnConfig == nil {
		cfg.ConnString, cfg.ConnConfig = repl.ConnString, repl.ConnConfig
		if cfg.BeforeConnect == nil {
			cfg.BeforeConnect = repl.BeforeConnect
		}
	}
	if len(cfg.Publications) == 0 {
		cfg.Publications = repl.Publications
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	repl.TemporarySlot, repl.CreateSlot, repl.TwoPhase = true, false, false
	conn, err := replication.Connect(ctx, repl)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
	if err != nil {
		return nil, err
	}
	s, err := Open(ctx, cfg, snap)
	if err != nil {
		return nil, err
	}
	if err := conn.Close(ctx); err != nil {
		s.log.Warn("closing the replication connection of the temporary slot", "slot", snap.Slot, "error", err)
	}
	res, err := s.Run(ctx, h)
	if cerr := s.Close(ctx); err == nil && cerr != nil {
		s.log.Warn("closing the copy connections", "error", cerr)
	}
	return res, err
}

// parseMajor returns the major version from the server_version parameter ("15.8 (Debian ...)",
// "18beta1").
func parseMajor(v string) (int, error) {
	end := 0
	for end < len(v) && v[end] >= '0' && v[end] <= '9' {
		end++
	}
	major, err := strconv.Atoi(v[:end])
	if err != nil {
		return 0, fmt.Errorf("snapshot: server_version %q: %w", v, err)
	}
	return major, nil
}
