package snapshot_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/snapshot"
)

// TestTableAddedLater: a table added to the publication while the stream runs is copied by
// SyncTables in a snapshot of its own, triggered by its first streamed change, while a writer
// keeps changing it and the table copied at first. The streamed changes the sync's copy holds
// already (Result.Covers) are skipped, the later ones applied: both tables end up equal to the
// database, every change applied once.
func TestTableAddedLater(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		db := pgtest.NewDatabase(t, srv)
		cs := srv.ConnString(db)
		ctx := pgtest.Context(t, 3*time.Minute)
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		const n = 2000
		pgtest.ExecAll(t, cs, `CREATE TABLE t1 (id int PRIMARY KEY, v int NOT NULL, pad text NOT NULL)`,
			`CREATE TABLE t2 (id int PRIMARY KEY, v int NOT NULL, pad text NOT NULL)`,
			`CREATE TABLE done (id int PRIMARY KEY)`,
			`INSERT INTO t1 SELECT i, 0, md5(i::text) FROM generate_series(1, 2000) i`,
			`INSERT INTO t2 SELECT i, 0, md5(i::text) FROM generate_series(1, 2000) i`,
			`CREATE PUBLICATION pub FOR TABLE t1, done`)
		w := startWriter(ctx, t, cs, seed, 2*n, "t1", "t2")
		must(t, w.waitFor(ctx, 10))
		conn, snap, rcfg := connectSlot(ctx, t, srv, db, "main", false, "pub")
		m := newRowModel()
		res, err := snapshot.Copy(ctx, snapshot.Config{ConnString: cs, Publications: []string{"pub"}}, snap, copyInto(m))
		copied := m.keys("public.t1")
		// On a gap or an overlap, log what the copy should have held: the rows of t1 at the
		// consistent point, by the writer's operations in the transactions not streamed.
		diagnose = func(t *testing.T, e *modelError) {
			t.Logf("consistent point %s", snap.ConsistentPoint)
			for _, op := range w.ops(e.key) {
				t.Log(op)
			}
			keys, before, after := w.keysBefore("t1", n, m.streamed())
			var missing, extra []string
			for k := range keys {
				if !copied[strconv.Itoa(k)] {
					missing = append(missing, strconv.Itoa(k))
				}
			}
			for k := range copied {
				if id, _ := strconv.Atoi(k); !keys[id] {
					extra = append(extra, k)
				}
			}
			t.Logf("at the consistent point: %d rows by the writer's log, %d copied; missing from the copy %v, extra %v; "+
				"last transactions of t1 not streamed %v, first streamed %v", len(keys), len(copied), missing, extra, before, after)
		}
		defer func() { diagnose = nil }()
		if err != nil {
			t.Fatal(err)
		}
		if res.Copied(0) || len(res.Tables) != 2 {
			t.Fatalf("copied %v", res.Tables)
		}
		s, err := conn.StartStreaming(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		must(t, w.waitFor(ctx, 20))
		pgtest.ExecAll(t, cs, `ALTER PUBLICATION pub ADD TABLE t2`)
		finished := make(chan error, 1)
		go func() {
			// The sync happens while the writer goes on; then the writer stops and the
			// stream's end is marked.
			err := w.waitFor(ctx, 300)
			w.stop()
			if err == nil {
				err = pgtest.Exec(ctx, cs, `INSERT INTO done VALUES (1)`)
			}
			finished <- err
		}()

		syncs := 0
		var synced *snapshot.Result
		sync := func(rel *decoding.Relation) *snapshot.Result {
			syncs++
			if rel.Name != "t2" || syncs > 1 {
				t.Fatalf("sync #%d for %s", syncs, relName(rel))
			}
			cfg := rcfg
			cfg.Slot = "main_sync"
			r, err := snapshot.SyncTables(ctx, cfg, snapshot.Config{Workers: 2, ChunkSize: 16 << 10,
				Tables: func(tab *snapshot.Table) bool { return !res.Copied(tab.OID) }}, copyInto(m))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Tables) != 1 || r.Tables[0].Name != "t2" || r.ConsistentPoint <= res.ConsistentPoint {
				t.Fatalf("sync copied %v at %s", r.Tables, r.ConsistentPoint)
			}
			synced = r
			return r
		}
		skipped := streamInto(ctx, t, s, m, []*snapshot.Result{res}, isDone, sync)
		must(t, <-finished)
		t.Logf("writer: %s; %d streamed changes of t2 skipped as copied by the sync (%d rows, %d chunks)", w, skipped,
			synced.Rows, synced.Tables[0].Chunks)
		if synced == nil || skipped == 0 {
			t.Errorf("sync %v, %d changes skipped: the test did not exercise the overlap", synced, skipped)
		}
		checkModel(ctx, t, cs, m, "public.t1", "SELECT * FROM t1", 0)
		checkModel(ctx, t, cs, m, "public.t2", "SELECT * FROM t2", 0)
		// The server drops the temporary slot when its walsender exits, shortly after the
		// connection closed.
		pgtest.Eventually(t, 10*time.Second, "the temporary slot to be dropped", func() bool {
			return pgtest.Count(t, cs, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'main_sync'`) == 0
		})
	})
}
