package replication_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// TestTwoPhaseResume: the consumer's resume position lies between a PREPARE and its COMMIT
// PREPARED. Started there, the server would send only COMMIT PREPARED and the transaction's
// changes would be lost; started at the slot's own position, with the resume position as a
// filter, the prepared transaction comes whole and the one before the resume position does not.
func TestTwoPhaseResume(t *testing.T) {
	for _, major := range installedMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			cs := srv.ConnString(db)
			ctx := pgtest.Context(t, time.Minute)
			// Two slots created back to back see the same transactions.
			pgtest.ExecAll(t, cs, `SELECT pg_create_logical_replication_slot('a', 'pgoutput', false, true)`,
				`SELECT pg_create_logical_replication_slot('b', 'pgoutput', false, true)`,
				`BEGIN; INSERT INTO pub_t VALUES (1); PREPARE TRANSACTION 'g1'`,
				`INSERT INTO pub_t VALUES (2)`,
				`COMMIT PREPARED 'g1'`,
				`INSERT INTO pub_t VALUES (3)`)
			cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "a",
				Publications: []string{"pub"}, TwoPhase: true}

			// Slot a tells where the transaction between PREPARE and COMMIT PREPARED ends.
			sa, err := replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			mid := next(ctx, t, sa)
			wantTxn(t, mid, "", []string{"2"})
			sa.Close(ctx)

			// A consumer that handled that transaction resumes from slot b.
			cfg.Slot, cfg.Buffer = "b", reorderbuffer.Config{SkipThrough: mid.EndLSN}
			sb, err := replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close(ctx)
			if p := sb.Progress(); p.Start >= mid.EndLSN || p.Acked != mid.EndLSN {
				t.Errorf("position %+v: want a start before %s (the slot's) and acked = the resume position", p, mid.EndLSN)
			}
			wantTxn(t, next(ctx, t, sb), "g1", []string{"1"})
			wantTxn(t, next(ctx, t, sb), "", []string{"3"})
			if st := sb.Stats(); st.SkippedTxns != 1 {
				t.Errorf("%d transactions skipped, want 1 (the one the consumer had)", st.SkippedTxns)
			}
		})
	}
}

// TestAckedPrefix: Position().Acked is the acknowledged prefix whatever the order of the
// acknowledgements, the slot is confirmed no further, and Ack(nil) is an error, not a panic.
func TestAckedPrefix(t *testing.T) {
	for _, major := range installedMajors(t, 15, 18) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			cs := srv.ConnString(db)
			ctx := pgtest.Context(t, time.Minute)
			s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
				Publications: []string{"pub"}, CreateSlot: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			start := s.Progress().Acked
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (1)`, `INSERT INTO pub_t VALUES (2)`, `INSERT INTO pub_t VALUES (3)`)
			x1, x2, x3 := next(ctx, t, s), next(ctx, t, s), next(ctx, t, s)
			if err := s.Ack(nil); !errors.Is(err, reorderbuffer.ErrForeignTxn) {
				t.Fatalf("Ack(nil) = %v, want ErrForeignTxn", err)
			}
			for _, step := range []struct {
				x    *reorderbuffer.Txn
				want decoding.LSN
			}{{x3, start}, {x1, x1.EndLSN}, {x2, x3.EndLSN}} {
				if err := s.Ack(step.x); err != nil {
					t.Fatal(err)
				}
				if got := s.Progress().Acked; got != step.want {
					t.Fatalf("after acknowledging %s: Acked %s, want %s", step.x.EndLSN, got, step.want)
				}
				if step.x == x1 {
					// Confirmed: x1, not x3 (acknowledged earlier, but after x2 which is not).
					if err := s.SendStatus(ctx, false); err != nil {
						t.Fatal(err)
					}
					if p := s.Progress(); p.Flushed != x1.EndLSN {
						t.Fatalf("flushed %s, want %s", p.Flushed, x1.EndLSN)
					}
				}
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if c, _ := slotState(t, cs, "s", true); c < x3.EndLSN {
				t.Fatalf("confirmed_flush_lsn %s, want at least %s", c, x3.EndLSN)
			}
			if err := s.Ack(x3); !errors.Is(err, replication.ErrClosed) {
				t.Fatalf("Ack after Close: %v", err)
			}
		})
	}
}

// TestResumePosition: a resume position beyond the server's WAL (a typo like FF/0) is refused
// before anything is sent, and the slot does not move; one behind the slot's confirmed position
// is accepted with a warning.
func TestResumePosition(t *testing.T) {
	for _, major := range installedMajors(t, 15, 18) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			cs := srv.ConnString(db)
			ctx := pgtest.Context(t, time.Minute)
			pgtest.ExecAll(t, cs, `SELECT pg_create_logical_replication_slot('s', 'pgoutput')`)
			before, _ := slotState(t, cs, "s", false)
			cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s", Publications: []string{"pub"},
				StatusInterval: 10 * time.Millisecond, Buffer: reorderbuffer.Config{SkipThrough: 0xFF << 32}}
			s, err := replication.Start(ctx, cfg)
			if err == nil {
				// What happened before: the position was sent as the start and as the flush position.
				// (slotState waits for the walsender to exit, after it took the Close's update.)
				s.Close(ctx)
				after, _ := slotState(t, cs, "s", true)
				t.Fatalf("Start with a resume position of FF/0 succeeded; confirmed_flush_lsn went from %s to %s", before, after)
			}
			var ce *replication.CheckError
			if !errors.Is(err, replication.ErrResumeAhead) || !errors.As(err, &ce) || ce.Setting != "Buffer.SkipThrough" {
				t.Fatalf("Start with FF/0: %v; want a *CheckError wrapping ErrResumeAhead", err)
			}
			if replication.Retryable(err) {
				t.Error("ErrResumeAhead is retryable")
			}
			if after, _ := slotState(t, cs, "s", true); after != before {
				t.Fatalf("confirmed_flush_lsn moved from %s to %s", before, after)
			}

			// The same position given to a connection already made (Conn.SetBuffer) is refused
			// the same way, and leaves the settings as they were.
			ok := cfg
			ok.Buffer.SkipThrough = 0
			conn, err := replication.Connect(ctx, ok)
			if err != nil {
				t.Fatal(err)
			}
			if err := conn.SetBuffer(cfg.Buffer); !errors.Is(err, replication.ErrResumeAhead) || !errors.As(err, &ce) {
				t.Fatalf("SetBuffer with FF/0: %v; want a *CheckError wrapping ErrResumeAhead", err)
			}
			conn.Close(ctx)
			if err := conn.SetBuffer(ok.Buffer); !errors.Is(err, replication.ErrClosed) {
				t.Fatalf("SetBuffer after Close: %v; want ErrClosed", err)
			}

			// Behind the slot: accepted, with a warning.
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (1)`, `SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())`)
			log := newLogRecorder()
			cfg.Buffer.SkipThrough, cfg.Logger = before, log.logger()
			s, err = replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			if w := log.find(slog.LevelWarn, "behind the slot's confirmed position"); len(w) != 1 {
				t.Fatalf("warnings about the resume position: %q", w)
			}
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (2)`)
			wantTxn(t, next(ctx, t, s), "", []string{"2"})
		})
	}
}
