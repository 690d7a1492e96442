package changefeed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// lateModel is a consumer that rebuilds the published tables from its batches: the initial
// copy, the copy of a table added later (and its changes up to where the stream stood), and
// the stream; a TableReset removes the table's rows.
type lateModel struct {
	mu       sync.Mutex
	m        *model
	copied   atomic.Int64 // Snapshot batches of an added table
	resets   atomic.Int64
	streamed atomic.Int64 // t_late's changes in the stream's own batches since the last TableReset
	marker   atomic.Int64 // the highest id of t_other streamed
	txns     atomic.Int64 // the stream's Transaction batches
	failCopy atomic.Int64 // fail the added table's copy at this Snapshot batch (1, 2...); 0 never
}

func (l *lateModel) handle(_ context.Context, b *changefeed.Batch) error {
	if b.Kind == changefeed.TableReset {
		l.resets.Add(1)
		l.streamed.Store(0)
		l.mu.Lock()
		delete(l.m.rows, b.Table.Schema+"."+b.Table.Name)
		l.mu.Unlock()
		return nil
	}
	if b.Table != nil && b.Kind == changefeed.Snapshot {
		if n := l.copied.Add(1); n == l.failCopy.Load() {
			return errFailCopy
		}
	}
	if b.Kind == changefeed.Transaction {
		l.txns.Add(1)
	}
	ls, err := lines(b)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range ls {
		if b.Table != nil { // the added table's changes up to the stream's position: not in the stream's order
			if i := strings.LastIndex(line, " @"); i >= 0 {
				line = line[:i]
			}
		}
		if err := l.m.apply(line); err != nil {
			return err
		}
		if b.Table == nil && strings.Contains(line, " public.t_late ") {
			l.streamed.Add(1) // the stream carries t_late's changes once its copy is done
		}
		if strings.Contains(line, " public.t_other id=") && strings.HasPrefix(line, "transaction insert") {
			var id int64
			fmt.Sscanf(strings.Fields(line)[3], "id=%d", &id)
			if id > l.marker.Load() {
				l.marker.Store(id)
			}
		}
	}
	return nil
}

var errFailCopy = errors.New("failing the added table's copy")

// lateWriter changes t_late and t_other at random until stopped, some transactions touching
// both.
func lateWriter(ctx context.Context, t *testing.T, dsn string) (stop func(), commits *atomic.Int64) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	// The writer stops between transactions, never in one: a transaction cut short by a
	// cancelled context may still commit on the server after the writer returned, after the
	// marker that ends the check.
	var stopping atomic.Bool
	done := make(chan error, 1)
	commits = new(atomic.Int64)
	go func() {
		defer conn.Close(context.Background())
		next := 100000
		for !stopping.Load() {
			var sql []string
			for range 1 + rand.IntN(4) {
				switch rand.IntN(5) {
				case 0, 1:
					next++
					sql = append(sql, fmt.Sprintf("INSERT INTO t_late VALUES (%d, 'w', %d)", next, next))
				case 2:
					sql = append(sql, fmt.Sprintf("UPDATE t_late SET v = 'u%d', n = n + 1 WHERE id = %d", rand.IntN(1000), 1+rand.IntN(10000)))
				case 3:
					sql = append(sql, fmt.Sprintf("DELETE FROM t_late WHERE id = %d", 1+rand.IntN(10000)))
				case 4:
					next++
					sql = append(sql, fmt.Sprintf("INSERT INTO t_other VALUES (%d, 'o', 1)", next),
						fmt.Sprintf("UPDATE t_other SET n = n + 1 WHERE id = %d", 1+rand.IntN(100)))
				}
			}
			if _, err := conn.Exec(ctx, "BEGIN; "+strings.Join(sql, "; ")+"; COMMIT"); err != nil {
				done <- err
				return
			}
			commits.Add(1)
		}
		done <- nil
	}()
	return func() {
		stopping.Store(true)
		require.NoError(t, <-done)
	}, commits
}

// waitCommits waits for n more of the writer's commits.
func waitCommits(ctx context.Context, t *testing.T, commits *atomic.Int64, n int64) {
	t.Helper()
	target := commits.Load() + n
	require.NoError(t, waitFor(ctx, func() bool { return commits.Load() >= target }), "the writer's commits")
}

// lateSetup makes t_other (published, 100 rows) and t_late (10,000 rows, not published yet).
func lateSetup(t *testing.T, dsn string) {
	pgtest.ExecAll(t, dsn,
		`CREATE TABLE t_other (id int PRIMARY KEY, v text, n int)`,
		`INSERT INTO t_other SELECT g, 'x', 0 FROM generate_series(1, 100) g`,
		`CREATE TABLE t_late (id int PRIMARY KEY, v text, n int)`,
		`INSERT INTO t_late SELECT g, repeat('y', 40), g FROM generate_series(1, 10000) g`,
		`CREATE PUBLICATION pub FOR TABLE t_other`)
}

// lateCheck waits until the stream carries t_late's changes (its copy is done: until then the
// stream goes on without them), stops the writer, writes a marker to t_other, waits for the
// stream to deliver it, and compares the model's tables with the source's.
func lateCheck(ctx context.Context, t *testing.T, dsn string, l *lateModel, stopWriter func()) {
	t.Helper()
	require.NoError(t, waitFor(ctx, func() bool { return l.streamed.Load() > 0 }), "t_late's changes in the stream")
	stopWriter()
	pgtest.ExecAll(t, dsn, `INSERT INTO t_other VALUES (999999, 'marker', 0)`)
	require.NoError(t, waitFor(ctx, func() bool { return l.marker.Load() == 999999 }), "the marker")
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, table := range []string{"t_late", "t_other"} {
		want := tableRows(ctx, t, dsn, table)
		got := l.m.rows["public."+table]
		require.Equal(t, len(want), len(got), "%s: %s", table, diff(got, want))
		require.Empty(t, diff(got, want), table)
	}
}

// TestTableAddedCopied: a table added to the publication while the Feed streams, and written
// to all along, is copied and then streamed: the consumer's table equals the source's, each
// row once, and the other table's stream is intact. With a TableStore too.
func TestTableAddedCopied(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		for _, store := range []string{"file", "table"} {
			t.Run(store, func(t *testing.T) {
				ctx := pgtest.Context(t, 2*time.Minute)
				db := pgtest.NewDatabase(t, srv)
				dsn := srv.ConnString(db)
				lateSetup(t, dsn)
				var st changefeed.Store = mustOpen(t, filepath.Join(t.TempDir(), "pos"))
				if store == "table" {
					ts, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn})
					require.NoError(t, err)
					st = ts
				}
				l := &lateModel{m: newModel()}
				var logs pgtest.LockedBuffer
				cfg := changefeed.Config{PublicationCheck: 50 * time.Millisecond, Copy: lateCopy(),
					Logger:      slog.New(slog.NewTextHandler(&logs, nil)),
					Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "late_" + store, Publications: []string{"pub"}}}
				stop := runFeed(t, cfg, st, l.handle)
				stopWriter, commits := lateWriter(ctx, t, dsn)
				waitCommits(ctx, t, commits, 50) // under way before the table is added
				pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub ADD TABLE t_late`)
				require.NoError(t, waitFor(ctx, func() bool { return l.copied.Load() > 0 }), "the copy")
				waitCommits(ctx, t, commits, 200) // changes after the copy
				lateCheck(ctx, t, dsn, l, stopWriter)
				require.NoError(t, stop())
				require.Zero(t, pgtest.Count(t, dsn, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE '%_sync_%'`), "the temporary slot is gone")
				// The log names each copy for what it is.
				require.Equal(t, 1, strings.Count(logs.String(), `msg="initial copy done"`), "the initial copy's end, once")
				require.Contains(t, logs.String(), `msg="added tables copy done"`)
			})
		}
	})
}

// lateCopy copies in chunks of 128kB: t_late in several.
func lateCopy() snapshot.Config { return snapshot.Config{ChunkSize: 128 << 10, Workers: 2} }

// TestTableAddedSynchronous is TestTableAddedCopied on a source whose synchronous_standby_names
// names the Feed: every COMMIT waits for the Feed's acknowledgement, the ALTER PUBLICATION's
// and those of the transactions the copy's temporary slot waits for as it is created. The Feed
// keeps acknowledging while it prepares the copy: a deadlock fails the test by its timeout.
func TestTableAddedSynchronous(t *testing.T) {
	for _, major := range testedMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx := pgtest.Context(t, 3*time.Minute)
			srv, db, dsn := ownServer(ctx, t, major)
			lateSetup(t, dsn)
			const name = "synclate"
			waitForStandby(t, srv, name)
			l := &lateModel{m: newModel()}
			cfg := changefeed.Config{PublicationCheck: 50 * time.Millisecond, Copy: lateCopy(),
				Replication: replication.Config{ConnString: srv.ReplicationConnString(db) + " application_name=" + name,
					Slot: "late_sync", Publications: []string{"pub"}, StatusInterval: time.Second}}
			stop := runFeed(t, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), l.handle)
			require.NoError(t, waitFor(ctx, func() bool {
				return pgtest.Count(t, dsn, `SELECT count(*) FROM pg_stat_replication WHERE application_name = '`+name+`' AND sync_state = 'sync'`) > 0
			}), "the Feed is the synchronous standby")
			stopWriter, commits := lateWriter(ctx, t, dsn)
			waitCommits(ctx, t, commits, 3) // each COMMIT waits for the Feed's status update
			pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub ADD TABLE t_late`)
			require.NoError(t, waitFor(ctx, func() bool { return l.copied.Load() > 0 }), "the copy")
			waitCommits(ctx, t, commits, 5)
			lateCheck(ctx, t, dsn, l, stopWriter)
			require.NoError(t, stop())
		})
	}
}

// TestTableAddedCopyFails: the handler fails in the middle of the added table's copy; the next
// Run hands it a TableReset for that table, copies it again, and the consumer's tables end
// exact.
func TestTableAddedCopyFails(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 4*time.Minute) // the restart works through the writer's backlog, a FileStore commit each
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		lateSetup(t, dsn)
		path := filepath.Join(t.TempDir(), "pos")
		l := &lateModel{m: newModel()}
		l.failCopy.Store(2)
		cfg := changefeed.Config{PublicationCheck: 50 * time.Millisecond, Copy: lateCopy(), Logger: testLogger(t),
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "late_fail", Publications: []string{"pub"}}}
		stopWriter, commits := lateWriter(ctx, t, dsn)
		done := make(chan error, 1)
		go func() { done <- changefeed.Run(ctx, cfg, mustOpen(t, path), l.handle) }()
		reader := mustOpen(t, path) // the initial copy is done before the table is added
		require.NoError(t, waitFor(ctx, func() bool { pos, ok, err := reader.Load(ctx, "late_fail"); return err == nil && ok && pos.CopyDone }))
		waitCommits(ctx, t, commits, 50)
		pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub ADD TABLE t_late`)
		require.ErrorIs(t, <-done, errFailCopy)

		store := mustOpen(t, path)
		pos, ok, err := store.Load(ctx, "late_fail")
		require.NoError(t, err)
		require.True(t, ok)
		require.NotNil(t, pos.Sync, "the copy that began is stored")
		require.Equal(t, "t_late", pos.Sync.Table.Name)
		require.NotContains(t, pos.Tables, pos.Sync.Table.OID)

		l.failCopy.Store(0)
		stop := runFeed(t, cfg, store, l.handle)
		require.NoError(t, waitFor(ctx, func() bool { return l.resets.Load() == 1 }), "the TableReset")
		require.NoError(t, waitFor(ctx, func() bool { return l.copied.Load() > 2 }), "the new copy")
		waitCommits(ctx, t, commits, 200)
		lateCheck(ctx, t, dsn, l, stopWriter)
		require.NoError(t, stop())
		pos, _, err = mustOpen(t, path).Load(ctx, "late_fail")
		require.NoError(t, err)
		require.Nil(t, pos.Sync)
		require.Len(t, pos.Tables, 2)
	})
}

// TestTableAddedStreamed: with NewTablesStream the added table is not copied: its changes
// stream from then on, and the log names the table and the switch.
func TestTableAddedStreamed(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, time.Minute)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	lateSetup(t, dsn)
	log := &pgtest.LockedBuffer{}
	var late atomic.Int64
	h := func(ctx context.Context, b *changefeed.Batch) error {
		ls, err := lines(b)
		for _, l := range ls {
			if strings.Contains(l, "public.t_late") {
				if b.Kind != changefeed.Transaction || b.Table != nil {
					return fmt.Errorf("a batch of kind %s (table %v) for t_late", b.Kind, b.Table)
				}
				late.Add(1)
			}
		}
		return err
	}
	cfg := changefeed.Config{PublicationCheck: 50 * time.Millisecond, NewTables: changefeed.NewTablesStream,
		Logger:      slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "late_stream", Publications: []string{"pub"}}}
	stop := runFeed(t, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), h)
	pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub ADD TABLE t_late`, `UPDATE t_late SET n = 0 WHERE id = 1`)
	require.NoError(t, waitFor(ctx, func() bool { return late.Load() > 0 }), "t_late's change")
	require.Equal(t, int64(1), late.Load(), "the change alone, no copied row")
	require.Contains(t, log.String(), `msg="table added to the publications: its changes are delivered from now on`)
	require.Contains(t, log.String(), "NewTablesStream")
	require.Contains(t, log.String(), "table=public.t_late")
	require.NoError(t, stop())
	require.Zero(t, pgtest.Count(t, dsn, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE '%_sync_%'`))
}

// TestTableAddedLegacyPosition: a position stored without the known tables (by an earlier
// release) takes the publications' tables as known: nothing is copied again at the restart,
// and a table added afterwards is copied.
func TestTableAddedLegacyPosition(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, 2*time.Minute)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	lateSetup(t, dsn)
	path := filepath.Join(t.TempDir(), "pos")
	l := &lateModel{m: newModel()}
	cfg := changefeed.Config{PublicationCheck: 50 * time.Millisecond, Copy: lateCopy(),
		Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "late_legacy", Publications: []string{"pub"}}}
	stop := runFeed(t, cfg, mustOpen(t, path), l.handle)
	require.NoError(t, stop())

	// The position as an earlier release stored it: no tables.
	s := mustOpen(t, path)
	pos, ok, err := s.Load(ctx, "late_legacy")
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, pos.Tables, 1, "the initial copy's table")
	pos.Tables = nil
	u, err := s.Begin(ctx, changefeed.StreamWorker)
	require.NoError(t, err)
	require.NoError(t, u.Commit(ctx, &pos))
	require.NoError(t, s.Close())

	stop = runFeed(t, cfg, mustOpen(t, path), l.handle)
	stopWriter, commits := lateWriter(ctx, t, dsn)
	waitCommits(ctx, t, commits, 20)
	// The publications' tables are listed before the stream's first transaction is handled: a
	// table added before that listing would be taken as known.
	require.NoError(t, waitFor(ctx, func() bool { return l.txns.Load() > 0 }), "a transaction streamed")
	require.Zero(t, l.copied.Load(), "t_other is known: not copied again")
	pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub ADD TABLE t_late`)
	require.NoError(t, waitFor(ctx, func() bool { return l.copied.Load() > 0 }), "the copy")
	waitCommits(ctx, t, commits, 50)
	lateCheck(ctx, t, dsn, l, stopWriter)
	require.NoError(t, stop())
	pos, _, err = mustOpen(t, path).Load(ctx, "late_legacy")
	require.NoError(t, err)
	require.Len(t, pos.Tables, 2)
}

// TestTableAddedConnectionsKilled: in the middle of an added table's copy, the source's
// walsenders (the stream's and the copy's temporary slot's) and the copy's connections are
// terminated. Run does not stop: its next attempt resets the table (TableReset), copies it again
// from a new temporary slot, and the consumer's tables end exact.
func TestTableAddedConnectionsKilled(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 3*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		lateSetup(t, dsn)
		l := &lateModel{m: newModel()}
		var killed atomic.Int64
		h := func(ctx context.Context, b *changefeed.Batch) error {
			if b.Kind == changefeed.Snapshot && b.Table != nil && killed.Add(1) == 1 {
				n := pgtest.Count(t, dsn, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid() AND (backend_type = 'walsender' OR application_name = 'pgreorder-copy')`)
				t.Logf("terminated %d connections during the added table's copy", n)
				if n < 3 {
					return fmt.Errorf("terminated %d connections, want the walsenders and the copy's", n)
				}
			}
			return l.handle(ctx, b)
		}
		// One copy worker: the handler holds it while the connections are terminated, so that
		// the copy cannot end before the kill.
		cfg := changefeed.Config{PublicationCheck: 50 * time.Millisecond, Copy: snapshot.Config{ChunkSize: 128 << 10, Workers: 1}, Logger: testLogger(t),
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "late_killed", Publications: []string{"pub"},
				Reconnect: replication.ReconnectPolicy{MinDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}}}
		stop := runFeed(t, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), h)
		stopWriter, commits := lateWriter(ctx, t, dsn)
		waitCommits(ctx, t, commits, 50)
		pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub ADD TABLE t_late`)
		require.NoError(t, waitFor(ctx, func() bool { return l.resets.Load() > 0 }), "a reset")
		waitCommits(ctx, t, commits, 100)
		lateCheck(ctx, t, dsn, l, stopWriter)
		require.NoError(t, stop())
	})
}
