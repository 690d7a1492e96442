package changefeed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("test", t.Name())
}

// runFeed runs a Feed in the background until stop is called, and returns once it streams;
// stop returns Run's error (nil for a stop by cancellation).
func runFeed(t *testing.T, cfg changefeed.Config, store changefeed.Store, h changefeed.Handler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	f, err := changefeed.New(cfg, store, h)
	require.NoError(t, err)
	go func() { done <- f.Run(ctx) }()
	var once bool
	var res error
	stop = func() error {
		if !once {
			once = true
			cancel()
			res = <-done
			if errors.Is(res, context.Canceled) {
				res = nil
			}
		}
		return res
	}
	t.Cleanup(func() { stop() })
	for f.Progress().Start == 0 {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("Run returned before streaming: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return stop
}

func waitTxns(t *testing.T, r *recorder, n int) {
	t.Helper()
	for range n {
		select {
		case <-r.txns:
		case <-time.After(30 * time.Second):
			t.Fatalf("waiting for %d transactions", n)
		}
	}
}

// TestCopyThenStream: the rows there before are Snapshot batches after a Reset, the changes
// after are Transaction batches; a second run resumes after the last stored transaction (a
// Resume with the state set), with nothing handed out twice; the store's position is the last
// transaction's end.
func TestCopyThenStream(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text, n int)`,
			`INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 300) g`,
			`CREATE TABLE u (id int PRIMARY KEY, v text, n int)`, `INSERT INTO u VALUES (1, 'a', NULL)`,
			`CREATE PUBLICATION pub FOR TABLE t, u`)
		path := filepath.Join(t.TempDir(), "pos")
		cfg := changefeed.Config{
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "cf", Publications: []string{"pub"}},
			Copy:        snapshot.Config{Workers: 2, ChunkSize: 8 << 10},
		}
		open := func() *changefeed.FileStore {
			s, err := changefeed.OpenFile(path)
			require.NoError(t, err)
			return s
		}
		r := &recorder{txns: make(chan struct{}, 100)}
		var stateSeen [][]byte
		h := func(ctx context.Context, b *changefeed.Batch) error {
			if b.Kind == changefeed.Resume {
				stateSeen = append(stateSeen, b.State)
			}
			if b.Kind == changefeed.Transaction {
				if err := b.SetState([]byte(b.Txn.EndLSN.String())); err != nil {
					return err
				}
			}
			return r.handle(ctx, b)
		}
		stop := runFeed(t, cfg, open(), h)
		pgtest.ExecAll(t, dsn, `INSERT INTO t VALUES (1000, 'x', 1)`, `UPDATE t SET id = 1001, v = 'y' WHERE id = 1`, `DELETE FROM u`)
		waitTxns(t, r, 3)
		require.NoError(t, stop())

		m := newModel()
		for _, l := range r.lines {
			require.NoError(t, m.apply(l), l)
		}
		require.Empty(t, diff(m.rows["public.t"], tableRows(ctx, t, dsn, "t")))
		require.Empty(t, diff(m.rows["public.u"], tableRows(ctx, t, dsn, "u")))
		require.Equal(t, changefeed.Reset, r.kinds[0])
		require.Equal(t, 301, countKind(r.lines, "snapshot"), "copied rows")
		require.Equal(t, []changefeed.Kind{changefeed.Transaction, changefeed.Transaction, changefeed.Transaction}, r.kinds[len(r.kinds)-3:])

		// Resume: only what follows, after a Resume batch with the stored state.
		s := open()
		pos, ok, err := s.Load(ctx, "cf")
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, pos.CopyDone)
		require.NotEmpty(t, pos.SystemID)
		require.Equal(t, pos.EndLSN.String(), string(pos.State))
		r.lines, r.kinds, r.linesAt = nil, nil, nil
		stop = runFeed(t, cfg, s, h)
		pgtest.ExecAll(t, dsn, `INSERT INTO u VALUES (2, 'b', 2)`)
		waitTxns(t, r, 1)
		require.NoError(t, stop())
		require.Equal(t, []changefeed.Kind{changefeed.Resume, changefeed.Transaction}, r.kinds)
		require.Equal(t, [][]byte{pos.State}, stateSeen)
		for _, l := range r.lines {
			require.NoError(t, m.apply(l), l)
		}
		require.Empty(t, diff(m.rows["public.u"], tableRows(ctx, t, dsn, "u")))
	})
}

func countKind(lines []string, kind string) int {
	n := 0
	for _, l := range lines {
		if len(l) > len(kind) && l[:len(kind)+1] == kind+" " {
			n++
		}
	}
	return n
}

// TestCopyFailsAndStartsOver: a handler error during the copy stops Run and drops the slot;
// the next Run starts with a Reset and copies everything again, from a new slot.
func TestCopyFailsAndStartsOver(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text, n int)`,
			`INSERT INTO t SELECT g, 'v', g FROM generate_series(1, 2000) g`, `CREATE PUBLICATION pub FOR TABLE t`)
		path := filepath.Join(t.TempDir(), "pos")
		cfg := changefeed.Config{
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "cf", Publications: []string{"pub"}},
			Copy:        snapshot.Config{Workers: 2, ChunkSize: 8 << 10},
		}
		boom := errors.New("boom")
		var chunks atomic.Int32 // the handler runs on every copy worker at once
		s, err := changefeed.OpenFile(path)
		require.NoError(t, err)
		err = changefeed.Run(ctx, cfg, s, func(ctx context.Context, b *changefeed.Batch) error {
			if b.Kind == changefeed.Snapshot {
				for _, err := range b.Changes() {
					if err != nil {
						return err
					}
				}
				if chunks.Add(1) == 3 {
					return boom
				}
			}
			return nil
		})
		require.ErrorIs(t, err, boom)
		s, err = changefeed.OpenFile(path)
		require.NoError(t, err)
		pos, ok, err := s.Load(ctx, "cf")
		require.NoError(t, err)
		require.True(t, ok)
		require.False(t, pos.CopyDone, "a copy that failed is not done")
		require.Equal(t, 0, slotCount(ctx, t, dsn, "cf"), "the failed copy's slot is dropped")

		r := &recorder{txns: make(chan struct{}, 10)}
		stop := runFeed(t, cfg, s, r.handle)
		pgtest.ExecAll(t, dsn, `INSERT INTO t VALUES (0, 'z', 0)`)
		waitTxns(t, r, 1)
		require.NoError(t, stop())
		require.Equal(t, changefeed.Reset, r.kinds[0])
		m := newModel()
		for _, l := range r.lines {
			require.NoError(t, m.apply(l), l)
		}
		require.Empty(t, diff(m.rows["public.t"], tableRows(ctx, t, dsn, "t")))
	})
}

func slotCount(ctx context.Context, t *testing.T, dsn, slot string) int {
	t.Helper()
	var n int
	conn := pgtest.Connect(t, dsn)
	defer conn.Close(ctx)
	res := pgtest.MustExec(t, conn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '"+slot+"'")
	for _, r := range res {
		for _, row := range r.Rows {
			n = int(row[0][0] - '0')
		}
	}
	return n
}

// TestStoreMismatch: with either store, a position of another server (system identifier), one
// beyond the server's WAL, a stored copy whose slot is gone, and a slot the store knows nothing
// of are errors that say what to do, and Run leaves the slot alone.
func TestStoreMismatch(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		db, tdb := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY)`, `CREATE PUBLICATION pub FOR TABLE t`)
		for _, kind := range []string{"file", "table"} {
			t.Run(kind, func(t *testing.T) {
				ctx := pgtest.Context(t, 2*time.Minute)
				slot := "cf_" + kind
				cfg := changefeed.Config{Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: slot, Publications: []string{"pub"}}}
				dir := t.TempDir()
				open := func() changefeed.Store {
					if kind == "file" {
						return mustOpen(t, filepath.Join(dir, "pos"))
					}
					s, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: srv.ConnString(tdb)})
					require.NoError(t, err)
					return s
				}
				run := func(pos *changefeed.Position) error {
					os.Remove(filepath.Join(dir, "pos"))
					if kind == "table" {
						pgtest.ExecAll(t, srv.ConnString(tdb), `DELETE FROM `+changefeed.DefaultTable)
					}
					s := open()
					if pos != nil {
						require.NoError(t, save(t, s, *pos))
					}
					return changefeed.Run(ctx, cfg, s, drain)
				}
				// The real position, from a copy that is complete.
				stop := runFeed(t, cfg, open(), drain)
				require.NoError(t, stop())
				s := open()
				real, ok, err := s.Load(ctx, slot)
				require.NoError(t, err)
				require.NoError(t, s.Close())
				require.True(t, ok && real.CopyDone)

				other := real
				other.SystemID = "1234"
				err = run(&other)
				require.ErrorIs(t, err, changefeed.ErrSystemMismatch)
				require.ErrorContains(t, err, "remove the stored position")

				ahead := real
				ahead.EndLSN = 0xFFFF_0000_0000
				err = run(&ahead)
				require.ErrorIs(t, err, replication.ErrResumeAhead)
				require.ErrorContains(t, err, "beyond the server's WAL")

				err = run(nil) // no position, but the slot exists
				require.ErrorIs(t, err, changefeed.ErrForeignSlot)

				begunElsewhere := real
				begunElsewhere.CopyDone, begunElsewhere.SystemID = false, "1234"
				require.ErrorIs(t, run(&begunElsewhere), changefeed.ErrSystemMismatch)

				otherSlot := real
				otherSlot.Slot = "another"
				if kind == "file" { // a table keeps one row per slot
					require.ErrorIs(t, run(&otherSlot), changefeed.ErrStore)
				}
				require.Equal(t, 1, slotCount(ctx, t, dsn, slot), "the slot is left alone")

				pgtest.ExecAll(t, dsn, `SELECT pg_drop_replication_slot('`+slot+`')`)
				err = run(&real)
				require.ErrorIs(t, err, replication.ErrSlotNotFound)
				require.ErrorContains(t, err, "start again with a copy")
			})
		}
	})
}

// drain is a handler that reads every row and keeps nothing.
func drain(_ context.Context, b *changefeed.Batch) error {
	for _, err := range b.Changes() {
		if err != nil {
			return err
		}
	}
	return nil
}

func mustOpen(t *testing.T, path string) *changefeed.FileStore {
	t.Helper()
	s, err := changefeed.OpenFile(path)
	require.NoError(t, err)
	return s
}

func waitFor(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// TestCopyRetried: the copy's connections terminated in the middle of the copy fail it; Run
// discards it and copies again (a second Reset), in one more attempt of its one loop, and the
// stream follows.
func TestCopyRetried(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text, n int)`,
			`INSERT INTO t SELECT g, 'v', g FROM generate_series(1, 2000) g`, `CREATE PUBLICATION pub FOR TABLE t`)
		log := newMessageCount(t)
		cfg := changefeed.Config{
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "cf", Publications: []string{"pub"}},
			Copy:        snapshot.Config{Workers: 2, ChunkSize: 8 << 10},
			Logger:      slog.New(log),
		}
		r := &recorder{txns: make(chan struct{}, 10)}
		var once sync.Once
		h := func(ctx context.Context, b *changefeed.Batch) error {
			if err := r.handle(ctx, b); err != nil {
				return err
			}
			if b.Kind == changefeed.Snapshot {
				once.Do(func() {
					pgtest.ExecAll(t, dsn, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgreorder-copy'`)
				})
			}
			return nil
		}
		stop := runFeed(t, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), h)
		pgtest.ExecAll(t, dsn, `INSERT INTO t VALUES (0, 'z', 0)`)
		waitTxns(t, r, 1)
		require.NoError(t, stop())
		var resets []int
		for i, k := range r.kinds {
			if k == changefeed.Reset {
				resets = append(resets, i)
			}
		}
		require.Len(t, resets, 2, "a Reset for each copy")
		require.Equal(t, 1, log.count(restartMessage), "one attempt made again")
		// What the first copy delivered is discarded at the second Reset.
		m := newModel()
		r.mu.Lock()
		lines := r.lines[r.linesAt[resets[1]]:]
		r.mu.Unlock()
		for _, l := range lines {
			require.NoError(t, m.apply(l), l)
		}
		require.Empty(t, diff(m.rows["public.t"], tableRows(ctx, t, dsn, "t")))
	})
}

// TestIdleAdvancesStored: while nothing published changes, the server's position moves on
// (writes to a table outside the publication); the store follows it, and the slot never confirms
// more than the store holds, so a later run resumes without finding the slot ahead of it.
func TestIdleAdvancesStored(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY)`, `CREATE TABLE other (id int)`,
			`CREATE PUBLICATION pub FOR TABLE t`)
		path := filepath.Join(t.TempDir(), "pos")
		cfg := changefeed.Config{Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "idle",
			Publications: []string{"pub"}, StatusInterval: 100 * time.Millisecond}}
		stop := runFeed(t, cfg, mustOpen(t, path), drain)
		reader := mustOpen(t, path)
		defer reader.Close()
		stored := func() decoding.LSN {
			pos, _, err := reader.Load(ctx, "idle")
			require.NoError(t, err)
			return pos.EndLSN
		}
		confirmed := func() decoding.LSN {
			conn := pgtest.Connect(t, dsn)
			defer conn.Close(ctx)
			res := pgtest.MustExec(t, conn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'idle'")
			lsn, err := decoding.ParseLSN(string(res[0].Rows[0][0]))
			require.NoError(t, err)
			return lsn
		}
		start := stored()
		for i := range 2 {
			pgtest.ExecAll(t, dsn, fmt.Sprintf(`INSERT INTO other SELECT generate_series(1, %d)`, 100*(i+1)))
			before := stored()
			require.NoError(t, waitFor(ctx, func() bool { return stored() > before }), "the store did not follow the server's position")
			require.LessOrEqual(t, confirmed(), stored(), "the slot confirmed more than the store holds")
		}
		require.Greater(t, stored(), start)
		require.NoError(t, stop())
		require.LessOrEqual(t, confirmed(), stored())

		// The next run resumes from the stored idle position: the slot is not ahead of it.
		stop = runFeed(t, cfg, mustOpen(t, path), drain)
		require.NoError(t, stop())
	})
}

// TestStartStream: with StartStream the feed creates the slot (CreateSlot) and streams what
// follows it, with no copy, after a Reset; the position it starts from is stored at once, so a
// second run resumes after the last stored transaction (a Resume); with a SlotStore nothing is
// stored and a run starts where the slot's confirmed position is; a missing slot without
// CreateSlot is ErrSlotNotFound.
func TestStartStream(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text, n int)`,
			`INSERT INTO t VALUES (1, 'before', 1)`, `CREATE PUBLICATION pub FOR TABLE t`)
		path := filepath.Join(t.TempDir(), "pos")
		cfg := changefeed.Config{Start: changefeed.StartStream,
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "cs", Publications: []string{"pub"}}}

		_, err := changefeed.New(cfg, mustOpen(t, path), drain)
		require.NoError(t, err)
		err = changefeed.Run(ctx, cfg, mustOpen(t, path), drain)
		require.ErrorIs(t, err, replication.ErrSlotNotFound)

		cfg.Replication.CreateSlot = true
		r := &recorder{txns: make(chan struct{}, 100)}
		stop := runFeed(t, cfg, mustOpen(t, path), r.handle)
		s := mustOpen(t, path)
		pos, ok, err := s.Load(ctx, "cs")
		require.NoError(t, err)
		require.True(t, ok, "the starting position is stored before anything streams")
		require.True(t, pos.CopyDone)
		require.NotEmpty(t, pos.SystemID)
		s.Close()
		pgtest.ExecAll(t, dsn, `INSERT INTO t VALUES (2, 'after', 2)`, `UPDATE t SET n = 3 WHERE id = 1`)
		waitTxns(t, r, 2)
		require.NoError(t, stop())
		require.Equal(t, []changefeed.Kind{changefeed.Reset, changefeed.Transaction, changefeed.Transaction}, r.kinds)
		require.Zero(t, countKind(r.lines, "snapshot"))
		require.Len(t, r.lines, 2, "only what follows the slot")

		// A second run resumes after the stored position.
		r.lines, r.kinds, r.linesAt = nil, nil, nil
		stop = runFeed(t, cfg, mustOpen(t, path), r.handle)
		pgtest.ExecAll(t, dsn, `DELETE FROM t WHERE id = 2`)
		waitTxns(t, r, 1)
		require.NoError(t, stop())
		require.Equal(t, []changefeed.Kind{changefeed.Resume, changefeed.Transaction}, r.kinds)
		require.Len(t, r.lines, 1)
		require.Contains(t, r.lines[0], "delete public.t")

		// SlotStore: from the slot's confirmed position, with nothing stored.
		r.lines, r.kinds, r.linesAt = nil, nil, nil
		stop = runFeed(t, cfg, changefeed.SlotStore{}, r.handle)
		pgtest.ExecAll(t, dsn, `INSERT INTO t VALUES (4, 'slot', 4)`)
		waitTxns(t, r, 1)
		require.NoError(t, stop())
		require.Equal(t, []changefeed.Kind{changefeed.Reset, changefeed.Transaction}, r.kinds)
		require.Len(t, r.lines, 1)
		require.Contains(t, r.lines[0], "id=4")
	})
}
