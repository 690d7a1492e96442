package changefeed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// partFollower reads the stream part by part and stops once it has seen the commit of a
// transaction that was streamed in several parts, after acknowledging it.
type partFollower struct {
	parts     []reorderbuffer.PartKind
	committed decoding.LSN
}

func (p *partFollower) Follow(ctx context.Context, s *replication.Stream) error {
	for {
		txn, err := s.Next(ctx)
		if err != nil {
			return err
		}
		p.parts = append(p.parts, txn.Part)
		if txn.Part == reorderbuffer.PartCommit {
			p.committed = txn.EndLSN
			if err := s.Ack(txn); err != nil {
				return err
			}
			return errDone
		}
		if txn.Part == reorderbuffer.Whole || txn.Part == reorderbuffer.Advance {
			if err := s.Ack(txn); err != nil {
				return err
			}
		}
	}
}

var errDone = errors.New("follower done")

// runToLargeCommit runs a Feed of cfg, whose Follower is a partFollower, until it has seen the
// commit of a large transaction written into table t once it streams: Run must return errDone.
func runToLargeCommit(ctx context.Context, t *testing.T, cfg changefeed.Config, h changefeed.Handler, dsn, why string) {
	t.Helper()
	feed, err := changefeed.New(cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), h)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- feed.Run(ctx) }()
	require.True(t, pgtest.Until(ctx, func() bool { return feed.Progress().Start != 0 }), "streaming")
	pgtest.ExecAll(t, dsn, `INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g`)
	select {
	case err := <-done:
		require.ErrorIs(t, err, errDone, why)
	case <-ctx.Done():
		t.Fatal("the Follower never saw the commit")
	}
}

// TestFollower: with a Follower, the Handler gets the Reset, and the Follower the stream itself:
// a large transaction arrives in parts (Incremental), and what the Follower returns is Run's.
func TestFollower(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text)`, `CREATE PUBLICATION pub FOR TABLE t`)
		var kinds []changefeed.Kind
		h := func(_ context.Context, b *changefeed.Batch) error {
			kinds = append(kinds, b.Kind)
			return nil
		}
		f := &partFollower{}
		cfg := changefeed.Config{Start: changefeed.StartStream, Follower: f, Logger: testLogger(t),
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "fo", Publications: []string{"pub"},
				CreateSlot: true, Buffer: reorderbuffer.Config{WorkMem: 64 << 10, Incremental: true}}}
		runToLargeCommit(ctx, t, cfg, h, dsn, "Run returns the Follower's error")
		require.Equal(t, []changefeed.Kind{changefeed.Reset}, kinds)
		require.Contains(t, f.parts, reorderbuffer.PartChanges, "the transaction came in parts")
		require.NotZero(t, f.committed)
	})
}

// failCopier fails its Plan: the Feed makes one attempt and returns the error.
type failCopier struct{ begins, discards int }

func (c *failCopier) Begin(context.Context, string) error           { c.begins++; return nil }
func (c *failCopier) Plan(context.Context, *snapshot.Session) error { return errPlan }
func (c *failCopier) Chunk(context.Context, *snapshot.Chunk) error  { return nil }
func (c *failCopier) Done(context.Context, decoding.LSN) error      { return nil }
func (c *failCopier) Discard(_ context.Context, noSlot bool)        { c.discards++ }

var errPlan = errors.New("plan refused")

// TestCopier: with a Copier, the copy goes through it: a failure that another attempt cannot
// cure is returned after one attempt, with the slot dropped and Discard called.
func TestCopier(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY)`, `INSERT INTO t VALUES (1)`, `CREATE PUBLICATION pub FOR TABLE t`)
		c := &failCopier{}
		cfg := changefeed.Config{Copier: c, Logger: testLogger(t),
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "co", Publications: []string{"pub"}}}
		err := changefeed.Run(ctx, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), drain)
		require.ErrorIs(t, err, errPlan)
		require.Equal(t, 1, c.begins, "one attempt")
		require.Equal(t, 1, c.discards)
		require.Zero(t, pgtest.Count(t, dsn, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'co'`), "the slot is dropped")
	})
}

// TestPublicationChanges: while the feed streams, a table added to the publication is logged at
// Warn (its rows from before are not copied), and a table removed at Info.
func TestPublicationChanges(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, time.Minute)
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY)`, `CREATE TABLE "Late" (id int PRIMARY KEY)`,
		`INSERT INTO "Late" VALUES (1)`, `CREATE PUBLICATION pub FOR TABLE t`)
	log := &pgtest.LockedBuffer{}
	cfg := changefeed.Config{Start: changefeed.StartStream, PublicationCheck: 20 * time.Millisecond,
		Logger:      slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "pc", Publications: []string{"pub"}, CreateSlot: true}}
	stop := runFeed(t, cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), drain)
	// The first listing is the baseline: wait until it has been read before changing the
	// publication.
	require.True(t, pgtest.Until(ctx, func() bool {
		return pgtest.Count(t, dsn, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgreorder-catalog'
			AND state = 'idle' AND query LIKE '%pg_publication_tables%'`) > 0
	}), "the first listing")
	pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub ADD TABLE "Late"`)
	require.True(t, pgtest.Until(ctx, func() bool { return strings.Contains(log.String(), `table="public.\"Late\""`) }), log.String())
	require.Contains(t, log.String(), "level=WARN msg=\"table added to the publication")
	pgtest.ExecAll(t, dsn, `ALTER PUBLICATION pub DROP TABLE t`)
	require.True(t, pgtest.Until(ctx, func() bool { return strings.Contains(log.String(), "table removed from the publication") }), log.String())
	require.Contains(t, log.String(), "table=public.t ")
	require.NoError(t, stop())
}

// identifier is a Restarter whose Prepare identifies the source and only then asks for the
// stream in parts; it records the walsender that answered and the one that streams.
type identifier struct {
	partFollower
	dsn           string
	sys           []replication.System
	prepared      []int32 // the walsender backends of the database during each Prepare
	streaming     []int32 // the slot's active_pid during each Follow
	prepareErrors []error
	src           *changefeed.Source
}

func (r *identifier) Prepare(ctx context.Context, src *changefeed.Source, rcfg *replication.Config) error {
	sys, slot, err := src.Identify(ctx)
	if err != nil {
		return err
	}
	again, _, err := src.Identify(ctx) // a second call reuses the connection
	if err != nil {
		return err
	}
	r.sys = append(r.sys, sys, again)
	r.src = src // used after Prepare returned: an error, not a panic (checked by the test)
	if slot != nil {
		return fmt.Errorf("slot %q exists before the first attempt", slot.Name)
	}
	pids, err := queryPIDs(ctx, r.dsn, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = current_database()`)
	r.prepared = append(r.prepared, pids...)
	r.prepareErrors = append(r.prepareErrors, err)
	rcfg.Buffer.Incremental = true // after the connection was made: the stream still gets it
	return nil
}

func (r *identifier) Follow(ctx context.Context, s *replication.Stream) error {
	pids, err := queryPIDs(ctx, r.dsn, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'ident'`)
	if err != nil {
		return err
	}
	r.streaming = append(r.streaming, pids...)
	return r.partFollower.Follow(ctx, s)
}

func (r *identifier) Ended(context.Context, *changefeed.Outcome) {}

func queryPIDs(ctx context.Context, dsn, sql string) ([]int32, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int32])
}

// TestRestarterIdentify: a Restarter that identifies the source in Prepare costs no connection
// of its own: the attempt streams on the walsender that answered Identify, with the reorder
// buffer settings Prepare set after it (the stream arrives in parts).
func TestRestarterIdentify(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, 2*time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE TABLE t (id int PRIMARY KEY, v text)`, `CREATE PUBLICATION pub FOR TABLE t`)
		r := &identifier{dsn: dsn}
		cfg := changefeed.Config{Start: changefeed.StartStream, Follower: r, Logger: testLogger(t),
			Replication: replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "ident", Publications: []string{"pub"},
				CreateSlot: true, Buffer: reorderbuffer.Config{WorkMem: 64 << 10}}}
		runToLargeCommit(ctx, t, cfg, func(context.Context, *changefeed.Batch) error { return nil }, dsn,
			"the stream came in parts: Prepare's settings reached it")
		require.Len(t, r.sys, 2)
		require.NotEmpty(t, r.sys[0].ID)
		require.Equal(t, r.sys[0], r.sys[1], "Identify twice: the same connection's answer")
		require.NoError(t, errors.Join(r.prepareErrors...))
		require.Len(t, r.prepared, 1, "one walsender while Prepare ran")
		require.Equal(t, r.prepared, r.streaming, "the attempt streams on the walsender that Identify connected")
		_, _, err := r.src.Identify(ctx)
		require.ErrorIs(t, err, changefeed.ErrInvalidConfig, "Identify after Prepare returned")
	})
}
