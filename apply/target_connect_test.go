package apply

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestTargetConfigAndHook: the target's connections are made from TargetConfig, each through
// TargetBeforeConnect, with the pinned settings replacing what the hook set in another letter
// case, and the target's notices logged.
func TestTargetConfigAndHook(t *testing.T) {
	major := testMajors[len(testMajors)-1]
	e := newEnv(t, major,
		`CREATE FUNCTION say() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN RAISE NOTICE 'marker % datestyle %', NEW.id, current_setting('datestyle'); RETURN NEW; END $$`,
		`CREATE TRIGGER say BEFORE INSERT ON marker FOR EACH ROW EXECUTE FUNCTION say()`,
		`ALTER TABLE marker ENABLE ALWAYS TRIGGER say`)
	pc, err := pgconn.ParseConfig(e.dst)
	must(t, err)
	cfg := e.config(t, Buffered)
	cfg.Target, cfg.TargetConfig = "", pc
	var hooked atomic.Int32
	cfg.TargetBeforeConnect = func(_ context.Context, c *pgconn.Config) error {
		if c == pc {
			return errors.New("the hook got the configuration itself, not a copy")
		}
		hooked.Add(1)
		c.RuntimeParams["DateStyle"] = "German" // pinned anyway
		return nil
	}
	log := &pgtest.LockedBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))

	both := cfg
	both.Target = e.dst
	if _, err := New(both); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Target and TargetConfig: %v, want ErrInvalidConfig", err)
	}

	r := start(t, cfg)
	pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (1)`)
	e.waitMarker(t, r, 1)
	r.halt(t)
	if hooked.Load() == 0 {
		t.Error("TargetBeforeConnect was not called")
	}
	if got := log.String(); !strings.Contains(got, `msg="server notice"`) || !strings.Contains(got, "marker 1 datestyle ISO") {
		t.Errorf("the target's notice was not logged with the pinned DateStyle; notices:\n%s", got)
	}
	if _, ok := pc.RuntimeParams["DateStyle"]; ok {
		t.Error("TargetConfig was modified")
	}
}

// TestSourceConfigAndHook: the source's connection configuration and hook (Source.ConnConfig,
// Source.BeforeConnect) serve every connection to the source, the replication ones and the
// ordinary ones (SyncSequences), each on a copy, the ordinary ones without replication=database.
func TestSourceConfigAndHook(t *testing.T) {
	e := newEnv(t, testMajors[len(testMajors)-1])
	ctx := pgtest.Context(t, time.Minute)
	pc, err := pgconn.ParseConfig(e.repl)
	must(t, err)
	cfg := e.config(t, Buffered)
	cfg.Source.ConnString, cfg.Source.ConnConfig = "", pc
	var repl, plain atomic.Int32
	cfg.Source.BeforeConnect = func(_ context.Context, c *pgconn.Config) error {
		if c == pc {
			return errors.New("the hook got the configuration itself, not a copy")
		}
		if c.RuntimeParams["replication"] == "" {
			plain.Add(1)
		} else {
			repl.Add(1)
		}
		return nil
	}
	both := cfg
	both.Source.ConnString = e.repl
	if _, err := New(both); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Source.ConnString and Source.ConnConfig: %v, want ErrInvalidConfig", err)
	}
	r := start(t, cfg)
	pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (1)`)
	e.waitMarker(t, r, 1)
	if _, err := r.a.SyncSequences(ctx); err != nil {
		t.Fatalf("SyncSequences: %v", err)
	}
	r.halt(t)
	// One session: one replication connection, on which it identified the source and streamed.
	if repl.Load() != 1 || plain.Load() < 1 {
		t.Errorf("Source.BeforeConnect: %d replication connections, %d ordinary ones; want 1 and at least 1", repl.Load(), plain.Load())
	}
}
