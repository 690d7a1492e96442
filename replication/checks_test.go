package replication_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// wantCheck checks that err is a *CheckError for setting wrapping sentinel, mentioning text.
func wantCheck(t *testing.T, err error, setting string, sentinel error, text string) {
	t.Helper()
	var ce *replication.CheckError
	if !errors.As(err, &ce) || !errors.Is(err, sentinel) {
		t.Fatalf("error %v; want a *CheckError wrapping %v", err, sentinel)
	}
	if ce.Setting != setting || !strings.Contains(err.Error(), text) || ce.Fix == "" {
		t.Fatalf("error %q (setting %q, fix %q); want setting %q, mentioning %q, and a fix", err, ce.Setting, ce.Fix, setting, text)
	}
	if replication.Retryable(err) {
		t.Errorf("%v is retryable", err)
	}
}

// TestPreflight: Start refuses, with an error naming the problem and its fix, a missing
// publication (PostgreSQL 18 would only warn and then confirm the slot with nothing sent), a
// missing slot, and slots that cannot serve the configuration. Nothing is created or consumed.
func TestPreflight(t *testing.T) {
	for _, major := range installedMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			cs := srv.ConnString(db)
			ctx := pgtest.Context(t, time.Minute)
			base := replication.Config{ConnString: srv.ReplicationConnString(db), Publications: []string{"pub"},
				Reconnect: replication.ReconnectPolicy{MaxAttempts: 1}}
			start := func(slot string, mod func(*replication.Config)) error {
				t.Helper()
				cfg := base
				cfg.Slot = slot
				if mod != nil {
					mod(&cfg)
				}
				s, err := replication.Start(ctx, cfg)
				if err == nil {
					s.Close(ctx)
					t.Fatalf("Start on slot %s succeeded", slot)
				}
				return err
			}

			t.Run("missing publication", func(t *testing.T) {
				err := start("s1", func(c *replication.Config) {
					c.Publications, c.CreateSlot = []string{"pub", "nopub"}, true
				})
				wantCheck(t, err, "publication", replication.ErrPublicationNotFound, `"nopub"`)
				if v := pgtest.QueryText(t, cs, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's1'`); v != "0" {
					t.Fatal("the slot was created anyway")
				}
			})
			t.Run("missing slot", func(t *testing.T) {
				wantCheck(t, start("s2", nil), "slot", replication.ErrSlotNotFound, "CreateSlot")
			})
			t.Run("other plugin", func(t *testing.T) {
				pgtest.ExecAll(t, cs, `SELECT pg_create_logical_replication_slot('td', 'test_decoding')`)
				wantCheck(t, start("td", nil), "slot", replication.ErrSlotMismatch, "test_decoding")
			})
			t.Run("physical slot", func(t *testing.T) {
				name := "ph_" + db // physical slots belong to no database: NewDatabase does not drop them
				pgtest.ExecAll(t, cs, `SELECT pg_create_physical_replication_slot('`+name+`')`)
				t.Cleanup(func() { pgtest.ExecAll(t, cs, `SELECT pg_drop_replication_slot('`+name+`')`) })
				wantCheck(t, start(name, nil), "slot", replication.ErrSlotMismatch, "physical")
			})
			t.Run("other database", func(t *testing.T) {
				db2 := pgtest.NewDatabase(t, srv)
				pgtest.ExecAll(t, srv.ConnString(db2), `SELECT pg_create_logical_replication_slot('od', 'pgoutput')`)
				wantCheck(t, start("od", nil), "slot", replication.ErrSlotMismatch, db2)
			})
			t.Run("two_phase slot", func(t *testing.T) {
				pgtest.ExecAll(t, cs, `SELECT pg_create_logical_replication_slot('tp', 'pgoutput', false, true)`)
				wantCheck(t, start("tp", nil), "two_phase", replication.ErrSlotMismatch, "TwoPhase")
			})
			t.Run("plain slot with TwoPhase", func(t *testing.T) {
				pgtest.ExecAll(t, cs, `SELECT pg_create_logical_replication_slot('ntp', 'pgoutput')`)
				err := start("ntp", func(c *replication.Config) { c.TwoPhase = true })
				wantCheck(t, err, "two_phase", replication.ErrSlotMismatch, "for good")
				if v := pgtest.QueryText(t, cs, `SELECT two_phase FROM pg_replication_slots WHERE slot_name = 'ntp'`); v != "f" {
					t.Fatalf("the slot's two_phase is now %q", v)
				}
			})
		})
	}
}

// TestPublicationCreatedAfterSlot: the publication exists at Start but not yet at the slot's
// position in the WAL. PostgreSQL 18 skips it with a WARNING, which is logged; earlier versions
// fail with an error, which is not retried.
func TestPublicationCreatedAfterSlot(t *testing.T) {
	for _, major := range installedMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			cs := srv.ConnString(db)
			ctx := pgtest.Context(t, time.Minute)
			pgtest.ExecAll(t, cs, `CREATE TABLE late_t (id int PRIMARY KEY)`,
				`SELECT pg_create_logical_replication_slot('s', 'pgoutput')`,
				`INSERT INTO late_t VALUES (1)`,
				`CREATE PUBLICATION late FOR TABLE late_t`,
				`INSERT INTO late_t VALUES (2)`)
			log := newLogRecorder()
			s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
				Publications: []string{"late"}, Logger: log.logger(),
				Reconnect: replication.ReconnectPolicy{MinDelay: 10 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			x, err := s.Next(ctx)
			if major >= 18 {
				if err != nil {
					t.Fatal(err)
				}
				wantTxn(t, x, "", []string{"2"})
				if w := log.find(slog.LevelWarn, "server notice"); len(w) == 0 || !strings.Contains(w[0], `publication "late"`) {
					t.Fatalf("server notices logged: %q", w)
				}
				return
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42704" {
				t.Fatalf("Next = %v; want the server's undefined_object error", err)
			}
			if replication.Retryable(err) || s.Reconnects() != 0 {
				t.Fatalf("the error was retried (%d reconnections)", s.Reconnects())
			}
			if _, err2 := s.Next(ctx); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("second Next: %v; want the same error", err2)
			}
		})
	}
}

// TestWalLevel: a server without wal_level = logical is refused at Start with the setting named.
func TestWalLevel(t *testing.T) {
	for _, major := range installedMajors(t, 15, 18) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			t.Parallel()
			srv := ownServer(t, major, map[string]string{"wal_level": "replica"})
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			ctx := pgtest.Context(t, time.Minute)
			_, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
				Publications: []string{"pub"}, CreateSlot: true})
			wantCheck(t, err, "wal_level", replication.ErrServerConfig, `"replica"`)
		})
	}
}
