package changefeed_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		feed, err := changefeed.New(cfg, mustOpen(t, filepath.Join(t.TempDir(), "pos")), h)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- feed.Run(ctx) }()
		require.True(t, pgtest.Until(ctx, func() bool { return feed.Progress().Start != 0 }), "streaming")
		pgtest.ExecAll(t, dsn, `INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g`)
		select {
		case err := <-done:
			require.ErrorIs(t, err, errDone, "Run returns the Follower's error")
		case <-ctx.Done():
			t.Fatal("the Follower never saw the commit")
		}
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
