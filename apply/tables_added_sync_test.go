package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestTablesAddedSynchronous: on a source whose synchronous_standby_names names the applier, a
// writer commits all along (each COMMIT waits for the applier) and a table is added to the
// publication. Either the added table's snapshot waits for the transactions running on the
// source, which wait for the applier, or the stream describes the table before the change that
// published it is visible (its COMMIT waits for the applier): Run stops with ErrCopyBlocked,
// whose message names synchronous_standby_names, instead of waiting or starting over for ever. Following it (the applier
// taken out of synchronous_standby_names, started again, then put back), the table is copied and
// the target ends equal to the source.
func TestTablesAddedSynchronous(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) { tablesAddedSynchronous(t, major) })
	}
}

func tablesAddedSynchronous(t *testing.T, major int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src, err := pgtest.Start(ctx, pgtest.Shared(t, major).Install(), pgtest.Options{})
	must(t, err)
	t.Cleanup(func() { _ = src.Stop() })
	admin := src.ConnString("postgres")
	standby := func(names string) {
		t.Helper()
		must(t, pgtest.Exec(ctx, admin, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`, `SELECT pg_reload_conf()`))
	}
	e := addedEnvOn(t, src, pgtest.Shared(t, major))
	// Registered after the databases: commits wait for the applier only while the test runs (the
	// databases are dropped after this).
	t.Cleanup(func() {
		must(t, pgtest.Exec(context.Background(), admin, `ALTER SYSTEM RESET synchronous_standby_names`, `SELECT pg_reload_conf()`))
	})
	cfg := e.config(t, Buffered)
	cfg.Source.ConnString += " application_name=" + syncName
	standby(syncName)
	r := start(t, cfg)
	waitSync(t, ctx, e.src)
	waitRecorded(t, ctx, e.dst)
	w := writeAdded(t, e.src, seeded(t))
	w.waitMore(t, ctx, 20)
	// Its COMMIT waits for the applier too, which may end its session to copy the table first.
	altered := make(chan error, 1)
	go func() { altered <- pgtest.Exec(ctx, e.src, `ALTER PUBLICATION pub ADD TABLE t_late`) }()
	select {
	case err := <-r.done:
		r.stop = nil
		if !errors.Is(err, ErrCopyBlocked) || !strings.Contains(err.Error(), "synchronous_standby_names") {
			t.Fatalf("Run: %v; want ErrCopyBlocked naming synchronous_standby_names", err)
		}
		t.Logf("Run stopped: %v", err)
	case <-time.After(time.Minute):
		t.Fatalf("Run did not stop while the copy's snapshot and the source's commits waited for each other (stats %+v)", r.a.Stats())
	}
	// What the error says to do: the commits are released, the next start copies the table.
	standby("")
	must(t, <-altered)
	r = start(t, cfg)
	if !pgtest.Until(ctx, func() bool { return pgtest.Count(t, e.dst, `SELECT count(*) FROM t_late`) > 0 }) {
		t.Fatalf("t_late was never copied (stats %+v)", r.a.Stats())
	}
	standby(syncName)
	waitSync(t, ctx, e.src)
	w.waitMore(t, ctx, 50) // committed with the applier as the synchronous standby again
	w.halt(t)
	must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
	e.waitMarker(t, r, 1)
	e.waitSame(t, "marker", "t_main", "t_late")
	r.halt(t)
}
