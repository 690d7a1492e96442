package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// conflictServer starts a server of the major with track_commit_timestamp on, stopped at the end
// of t.
func conflictServer(t *testing.T, major int) *pgtest.Server {
	t.Helper()
	var in pgtest.Install
	for _, i := range pgtest.FindInstalls() {
		if i.Major == major {
			in = i
		}
	}
	if in.Major == 0 {
		pgtest.Unavailable(t, fmt.Sprintf("PostgreSQL %d is not installed", major))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, in, pgtest.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	must(t, err)
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stopping the server: %v", err)
		}
	})
	return srv
}

var conflictSchema = []string{
	`CREATE TABLE kv (id int PRIMARY KEY, u int UNIQUE, v text)`,
	`CREATE TABLE marker (id int PRIMARY KEY)`,
}

// conflictEnv is a source and a target database of srv with the conflict schema.
func conflictEnv(t *testing.T, srv *pgtest.Server) *env {
	t.Helper()
	return serverEnv(t, srv, "conflicts", conflictSchema)
}

// conflictConfig is a Buffered Applier with an origin, logging into log.
func (e *env) conflictConfig(t *testing.T, log *pgtest.LockedBuffer, res map[conflict.Type]conflict.Resolution) Config {
	cfg := e.config(t, Buffered)
	cfg.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.Origin = "pgr_test_" + strings.TrimPrefix(e.dst[strings.LastIndex(e.dst, "dbname=")+7:], "'")
	cfg.Origin = strings.Fields(cfg.Origin)[0]
	cfg.Conflicts.Resolutions = res
	return cfg
}

// loggedConfig is conflictConfig with a log of its own, printed if t fails, and its origins
// dropped at the end of t.
func (e *env) loggedConfig(t *testing.T, res map[conflict.Type]conflict.Resolution) (Config, *pgtest.LockedBuffer) {
	log := &pgtest.LockedBuffer{}
	cfg := e.conflictConfig(t, log, res)
	dropOrigins(t, e.dst, cfg.Origin)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(log.String())
		}
	})
	return cfg, log
}

// dropOrigins drops, at the end of the test (after its Appliers stopped), the replication
// origins named origin*: the server has a bounded number of origin states.
func dropOrigins(t *testing.T, dsn, origin string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		// The Appliers' backends may not have exited yet: an origin in use is 55006.
		pgtest.Until(ctx, func() bool {
			err = pgtest.Exec(ctx, dsn, `SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname LIKE '`+origin+`%'`)
			return err == nil || !strings.Contains(err.Error(), "55006")
		})
		if err != nil {
			t.Errorf("dropping the origins: %v", err)
		}
	})
}

// rowsOf returns kv's rows as "id,u,v" strings, in id order.
func rowsOf(t *testing.T, dsn string) string {
	t.Helper()
	return pgtest.QueryOne[string](t, dsn, `SELECT coalesce(string_agg(concat_ws(',', id, coalesce(u::text, '-'), coalesce(v, '-')), ' ' ORDER BY id), '') FROM kv`)
}

// stopped waits for an Applier to stop by itself and returns its error.
func (r *running) stopped(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.stop = nil
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("the applier did not stop")
		return nil
	}
}

// waitTrigger waits until the tombstone trigger is on kv.
func waitTrigger(t *testing.T, dsn string) { waitTriggerOn(t, dsn, "kv") }

// waitTriggerOn waits until the tombstone trigger is on table.
func waitTriggerOn(t *testing.T, dsn, table string) {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	c, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer c.Close(context.Background())
	for {
		var n int
		must(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2`, table, detect.TombstoneTrigger).Scan(&n))
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no tombstone trigger on %s", table)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// conflictCase provokes one conflict. Before the Applier starts: setup on both sides (replicated
// by a first Applier), then local on the target and remote on the source, in the order
// remoteFirst says (which decides last_update_wins); then the Applier runs with the resolution.
type conflictCase struct {
	name        string
	ct          conflict.Type
	res         conflict.Resolution
	setupSrc    []string // on the source, replicated before the conflict
	local       []string // on the target, locally
	remote      []string // on the source
	remoteFirst bool
	retention   time.Duration
	want        string // kv on the target at the end
	wantCount   int64
	wantLog     []string
	stops       bool // the resolution is error: Run stops
	mode        Mode
	check       string // a query on the target whose count must be 1
}

func TestConflicts(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := conflictServer(t, major)
			for _, c := range conflictCases() {
				t.Run(c.name, func(t *testing.T) { runConflictCase(t, srv, c) })
			}
		})
	}
}

func conflictCases() []conflictCase {
	seed := []string{`INSERT INTO kv VALUES (1, 10, 'a'), (2, 20, 'b'), (3, 30, 'c')`}
	var cases []conflictCase
	// insert_exists under every resolution.
	ie := func(res conflict.Resolution, remoteFirst bool, want string) conflictCase {
		return conflictCase{name: "insert_exists/" + res.String() + map[bool]string{true: "/remote_first", false: ""}[remoteFirst],
			ct: conflict.InsertExists, res: res, setupSrc: seed,
			local: []string{`INSERT INTO kv VALUES (4, 40, 'local')`}, remote: []string{`INSERT INTO kv VALUES (4, 41, 'remote')`},
			remoteFirst: remoteFirst, want: want, wantCount: 1,
			wantLog: []string{`conflict detected on relation \"public.kv\": conflict=insert_exists`, `Key already exists in unique index \"kv_pkey\"`,
				`key (id)=(4)`, `local row (4, 40, local)`, `remote row (4, 41, remote)`}}
	}
	base := "1,10,a 2,20,b 3,30,c "
	cases = append(cases,
		ie(conflict.Default, false, base+"4,40,local"),
		ie(conflict.Skip, false, base+"4,40,local"),
		ie(conflict.ApplyRemote, false, base+"4,41,remote"),
		ie(conflict.LastUpdateWins, false, base+"4,41,remote"),
		ie(conflict.LastUpdateWins, true, base+"4,40,local"),
	)
	cases[0].stops = true
	// Oversized values: cut in the log line, replaced by a marker in the log table.
	cases = append(cases, conflictCase{name: "insert_exists/large", ct: conflict.InsertExists, res: conflict.Skip, setupSrc: seed,
		local: []string{`INSERT INTO kv VALUES (4, 40, 'local')`}, remote: []string{`INSERT INTO kv VALUES (4, 41, repeat('x', 2000))`},
		want: base + "4,40,local", wantCount: 1,
		wantLog: []string{`remote row (4, 41, ` + strings.Repeat("x", 64) + `...)`},
		check: `SELECT count(*) FROM conflict_log WHERE remote_tuple -> 'v' = '{"omitted_bytes": 2000}' AND remote_tuple ->> 'id' = '4'
			AND local_conflicts -> 0 -> 'tuple' ->> 'v' = 'local' AND local_conflicts -> 0 ->> 'index' = 'kv_pkey'`})
	// A run of inserts long enough for COPY, one of which conflicts.
	cases = append(cases, conflictCase{name: "insert_exists/copy", ct: conflict.InsertExists, res: conflict.Skip, setupSrc: seed,
		local:  []string{`INSERT INTO kv VALUES (5, 55, 'local')`},
		remote: []string{`INSERT INTO kv SELECT g, g * 10, 'r' FROM generate_series(4, 9) g`},
		want:   base + "4,40,r 5,55,local 6,60,r 7,70,r 8,80,r 9,90,r", wantCount: 1,
		wantLog: []string{`conflict=insert_exists`, `key (id)=(5)`}})
	// multiple_unique_conflicts: one remote row against two local rows.
	muc := func(res conflict.Resolution, want string) conflictCase {
		return conflictCase{name: "multiple_unique_conflicts/" + res.String(), ct: conflict.MultipleUniqueConflicts, res: res, setupSrc: seed,
			local:  []string{`INSERT INTO kv VALUES (4, 40, 'l4'), (5, 50, 'l5')`},
			remote: []string{`INSERT INTO kv VALUES (4, 50, 'remote')`}, want: want, wantCount: 1, stops: res == conflict.Default,
			wantLog: []string{`conflict=multiple_unique_conflicts`, `unique index \"kv_pkey\"`, `unique index \"kv_u_key\"`,
				`local row (4, 40, l4)`, `local row (5, 50, l5)`}}
	}
	cases = append(cases,
		muc(conflict.Default, base+"4,40,l4 5,50,l5"),
		muc(conflict.Skip, base+"4,40,l4 5,50,l5"),
		muc(conflict.ApplyRemote, base+"4,50,remote"))
	// update_exists: the update sets a unique column to a value a local row holds.
	ue := func(res conflict.Resolution, want string) conflictCase {
		return conflictCase{name: "update_exists/" + res.String(), ct: conflict.UpdateExists, res: res, setupSrc: seed,
			local: []string{`INSERT INTO kv VALUES (4, 40, 'local')`}, remote: []string{`UPDATE kv SET u = 40 WHERE id = 3`},
			want: want, wantCount: 1, stops: res == conflict.Default,
			wantLog: []string{`conflict=update_exists`, `unique index \"kv_u_key\"`, `key (u)=(40)`, `local row (4, 40, local)`,
				`replica identity (id)=(3)`}}
	}
	cases = append(cases,
		ue(conflict.Default, base+"4,40,local"),
		ue(conflict.Skip, base+"4,40,local"),
		ue(conflict.ApplyRemote, "1,10,a 2,20,b 3,40,c"))
	// update_missing and delete_missing.
	cases = append(cases,
		conflictCase{name: "update_missing/skip", ct: conflict.UpdateMissing, res: conflict.Default, setupSrc: seed,
			local: []string{`DELETE FROM kv WHERE id = 2`}, remote: []string{`UPDATE kv SET v = 'remote' WHERE id = 2`},
			want: "1,10,a 3,30,c", wantCount: 1,
			wantLog: []string{`conflict=update_missing`, `Could not find the row to be updated: remote row (2, 20, remote), replica identity (id)=(2)`}},
		conflictCase{name: "update_missing/apply_remote", ct: conflict.UpdateMissing, res: conflict.ApplyRemote, setupSrc: seed,
			local: []string{`DELETE FROM kv WHERE id = 2`}, remote: []string{`UPDATE kv SET v = 'remote' WHERE id = 2`},
			want: "1,10,a 2,20,remote 3,30,c", wantCount: 1, wantLog: []string{`conflict=update_missing`}},
		conflictCase{name: "delete_missing/skip", ct: conflict.DeleteMissing, res: conflict.Default, setupSrc: seed,
			local: []string{`DELETE FROM kv WHERE id = 2`}, remote: []string{`DELETE FROM kv WHERE id = 2`},
			want: "1,10,a 3,30,c", wantCount: 1,
			wantLog: []string{`conflict=delete_missing`, `Could not find the row to be deleted: replica identity (id)=(2)`}},
	)
	// *_origin_differs: the row was changed locally since the Applier wrote it.
	uod := func(res conflict.Resolution, remoteFirst bool, want string) conflictCase {
		return conflictCase{name: "update_origin_differs/" + res.String() + map[bool]string{true: "/remote_first", false: ""}[remoteFirst],
			ct: conflict.UpdateOriginDiffers, res: res, setupSrc: seed, remoteFirst: remoteFirst,
			local: []string{`UPDATE kv SET v = 'local' WHERE id = 2`}, remote: []string{`UPDATE kv SET v = 'remote' WHERE id = 2`},
			want: want, wantCount: 1,
			wantLog: []string{`conflict=update_origin_differs`, `Updating the row that was modified locally in transaction`,
				`local row (2, 20, local), remote row (2, 20, remote), replica identity (id)=(2)`}}
	}
	cases = append(cases,
		uod(conflict.Default, false, "1,10,a 2,20,remote 3,30,c"),
		uod(conflict.Skip, false, "1,10,a 2,20,local 3,30,c"),
		uod(conflict.LastUpdateWins, false, "1,10,a 2,20,remote 3,30,c"),
		uod(conflict.LastUpdateWins, true, "1,10,a 2,20,local 3,30,c"),
		conflictCase{name: "delete_origin_differs/apply_remote", ct: conflict.DeleteOriginDiffers, res: conflict.Default, setupSrc: seed,
			local: []string{`UPDATE kv SET v = 'local' WHERE id = 2`}, remote: []string{`DELETE FROM kv WHERE id = 2`},
			want: "1,10,a 3,30,c", wantCount: 1,
			wantLog: []string{`conflict=delete_origin_differs`, `Deleting the row that was modified locally`}},
		conflictCase{name: "delete_origin_differs/skip", ct: conflict.DeleteOriginDiffers, res: conflict.Skip, setupSrc: seed,
			local: []string{`UPDATE kv SET v = 'local' WHERE id = 2`}, remote: []string{`DELETE FROM kv WHERE id = 2`},
			want: "1,10,a 2,20,local 3,30,c", wantCount: 1, wantLog: []string{`conflict=delete_origin_differs`}},
	)
	// update_deleted: the row was deleted locally after the source's update committed (with
	// tombstones); deleted before it, the update is update_missing.
	cases = append(cases,
		conflictCase{name: "update_deleted/skip", ct: conflict.UpdateDeleted, res: conflict.Default, setupSrc: seed, retention: time.Minute,
			remoteFirst: true, local: []string{`DELETE FROM kv WHERE id = 2`}, remote: []string{`UPDATE kv SET v = 'remote' WHERE id = 2`},
			want: "1,10,a 3,30,c", wantCount: 1,
			wantLog: []string{`conflict=update_deleted`, `The row to be updated was deleted locally in transaction`}},
		conflictCase{name: "update_deleted/apply_remote", ct: conflict.UpdateDeleted, res: conflict.ApplyRemote, setupSrc: seed, retention: time.Minute,
			remoteFirst: true, local: []string{`DELETE FROM kv WHERE id = 2`}, remote: []string{`UPDATE kv SET v = 'remote' WHERE id = 2`},
			want: "1,10,a 2,20,remote 3,30,c", wantCount: 1, wantLog: []string{`conflict=update_deleted`}},
		conflictCase{name: "update_deleted/last_update_wins", ct: conflict.UpdateDeleted, res: conflict.LastUpdateWins, setupSrc: seed, retention: time.Minute,
			remoteFirst: true, local: []string{`DELETE FROM kv WHERE id = 2`}, remote: []string{`UPDATE kv SET v = 'remote' WHERE id = 2`},
			want: "1,10,a 3,30,c", wantCount: 1, wantLog: []string{`conflict=update_deleted`, `local change is the last update`}},
		conflictCase{name: "update_deleted/deleted_before", ct: conflict.UpdateMissing, res: conflict.Default, setupSrc: seed, retention: time.Minute,
			local: []string{`DELETE FROM kv WHERE id = 2`}, remote: []string{`UPDATE kv SET v = 'remote' WHERE id = 2`},
			want: "1,10,a 3,30,c", wantCount: 1, wantLog: []string{`conflict=update_missing`}},
	)
	// The same detection on the workers of Parallel and Eager.
	for _, name := range []string{"insert_exists/apply_remote", "update_exists/default", "update_origin_differs/default", "update_deleted/skip", "delete_missing/skip"} {
		for _, c := range cases {
			if c.name == name {
				for _, mode := range []Mode{Eager, Parallel} {
					c.name, c.mode = name+"/"+mode.String(), mode
					cases = append(cases, c)
				}
			}
		}
	}
	return cases
}

func runConflictCase(t *testing.T, srv *pgtest.Server, c conflictCase) {
	e := conflictEnv(t, srv)
	var log pgtest.LockedBuffer
	res := map[conflict.Type]conflict.Resolution{c.ct: c.res}
	cfg := e.conflictConfig(t, &log, res)
	cfg.Mode = c.mode
	cfg.Conflicts.LogTable = "conflict_log"
	cfg.Conflicts.Retention = c.retention
	dropOrigins(t, e.dst, cfg.Origin)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(log.String())
		}
	})
	// Setup: replicated by a first Applier (which also installs the tombstone trigger).
	pgtest.ExecAll(t, e.src, append(c.setupSrc, `INSERT INTO marker VALUES (1)`)...)
	r := start(t, cfg)
	e.waitMarker(t, r, 1)
	if c.retention > 0 {
		waitTrigger(t, e.dst)
	}
	r.halt(t)
	// The conflict, in the order asked (the later commit has the later timestamp).
	if c.remoteFirst {
		pgtest.ExecAll(t, e.src, c.remote...)
		pgtest.ClockPast(t, e.src)
		pgtest.ExecAll(t, e.dst, c.local...)
	} else {
		pgtest.ExecAll(t, e.dst, c.local...)
		pgtest.ClockPast(t, e.dst)
		pgtest.ExecAll(t, e.src, c.remote...)
	}
	pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (2)`)
	r = start(t, cfg)
	if c.stops {
		err := r.stopped(t)
		if !errors.Is(err, ErrConflict) {
			t.Fatalf("Run: %v, want an ErrConflict", err)
		}
		var ae *ApplyError
		var ce *conflict.StopError
		if !errors.As(err, &ae) || !errors.As(err, &ce) || ce.Report.Type != c.ct {
			t.Fatalf("Run: %v, want an *ApplyError with a %s *conflict.StopError", err, c.ct)
		}
		// Nothing was acknowledged: an Applier that skips it meets it again.
		cfg.Conflicts.Resolutions = map[conflict.Type]conflict.Resolution{c.ct: conflict.Skip}
		again := start(t, cfg)
		e.waitMarker(t, again, 2)
		e.settled(t, again)
		if n := again.a.Stats().Conflicts(c.ct); n != 1 {
			t.Errorf("%s conflicts after the stop: %d, want 1", c.ct, n)
		}
	} else {
		e.waitMarker(t, r, 2)
		e.settled(t, r)
	}
	st := r.a.Stats()
	if got := st.Conflicts(c.ct); got != c.wantCount {
		t.Errorf("%s conflicts: %d, want %d (stats %+v)", c.ct, got, c.wantCount, st)
	}
	for _, other := range conflict.Types() {
		if other != c.ct && st.Conflicts(other) != 0 {
			t.Errorf("%s conflicts: %d, want 0", other, st.Conflicts(other))
		}
	}
	if got := rowsOf(t, e.dst); got != c.want {
		t.Errorf("target rows %q, want %q", got, c.want)
	}
	if !c.stops {
		q := fmt.Sprintf(`SELECT count(*) FROM conflict_log WHERE conflict = '%s' AND relation = '"public"."kv"' AND remote_xid > 0
			AND remote_final_lsn IS NOT NULL AND remote_commit_ts IS NOT NULL AND slot = 'conflicts'`, c.ct)
		if n := pgtest.Count(t, e.dst, q); n != c.wantCount {
			t.Errorf("%d rows in the conflict log table, want %d", n, c.wantCount)
		}
	}
	if c.check != "" {
		if n := pgtest.Count(t, e.dst, c.check); n != 1 {
			t.Errorf("%s: %d, want 1", c.check, n)
		}
	}
	logs := log.String()
	for _, w := range c.wantLog {
		if !strings.Contains(logs, w) {
			t.Errorf("log lacks %q:\n%s", w, logs)
		}
	}
	r.halt(t)
}

// TestCopyWithOrigin copies a source into an empty target with an origin set, then updates and
// deletes the copied rows on the source: the copy's rows carry an origin of the Applier's, so
// none of those changes is update_origin_differs or delete_origin_differs.
func TestCopyWithOrigin(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			srv := conflictServer(t, major)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
			e := &env{srv: srv, src: srv.ConnString(srcDB), dst: srv.ConnString(dstDB), repl: srv.ReplicationConnString(srcDB), slot: "copyorigin"}
			must(t, pgtest.Exec(ctx, e.src, append(append([]string{}, conflictSchema...),
				`INSERT INTO kv SELECT g, g, 'copied' FROM generate_series(1, 200) g`,
				`CREATE PUBLICATION pub FOR ALL TABLES`)...))
			must(t, pgtest.Exec(ctx, e.dst, conflictSchema...))
			var log pgtest.LockedBuffer
			cfg := e.conflictConfig(t, &log, nil)
			cfg.Copy = true
			dropOrigins(t, e.dst, cfg.Origin)
			r := start(t, cfg)
			e.waitProgress(t, r)
			must(t, pgtest.Exec(ctx, e.src, `UPDATE kv SET v = 'updated' WHERE id <= 100`, `DELETE FROM kv WHERE id > 150`,
				`INSERT INTO marker VALUES (1)`))
			e.waitMarker(t, r, 1)
			r.halt(t)
			if got, want := rowsOf(t, e.dst), rowsOf(t, e.src); got != want {
				t.Errorf("target rows differ from the source's:\n%s\nwant\n%s", got, want)
			}
			st := r.a.Stats()
			if st.UpdateOriginDiffers != 0 || st.DeleteOriginDiffers != 0 {
				t.Errorf("%d update_origin_differs and %d delete_origin_differs on rows the copy wrote\n%s",
					st.UpdateOriginDiffers, st.DeleteOriginDiffers, log.String())
			}
		})
	}
}

// settled waits until r's counters include everything its progress row says it committed: they
// are updated just after a commit returns, and the marker a test waits for may be visible before
// (AppliedLSN is updated last, after the commit's conflicts are counted).
func (e *env) settled(t *testing.T, r *running) {
	t.Helper()
	want := e.progress(t)
	pgtest.Eventually(t, time.Minute, "the Applier's counters", func() bool { return r.a.Stats().AppliedLSN >= want })
}
