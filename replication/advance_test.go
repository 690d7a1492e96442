package replication_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// TestHandOutAdvances: with Buffer.HandOutAdvances, WAL with nothing published moves the slot
// only through an Advance the consumer acknowledges; a resume position behind the slot is then
// refused (ErrSlotAhead) rather than warned about; System names the server.
func TestHandOutAdvances(t *testing.T) {
	for _, major := range installedMajors(t, 18) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			cs := srv.ConnString(db)
			ctx := pgtest.Context(t, time.Minute)
			pgtest.ExecAll(t, cs, `SELECT pg_create_logical_replication_slot('s', 'pgoutput')`)
			created, _ := slotState(t, cs, "s", false)
			cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s", Publications: []string{"pub"},
				StatusInterval: 20 * time.Millisecond, Buffer: reorderbuffer.Config{HandOutAdvances: true}}
			s, err := replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if sys := s.System(); sys.ID == "" || sys.ID != pgtest.QueryText(t, cs, `SELECT system_identifier::text FROM pg_control_system()`) ||
				sys.Timeline != 1 || sys.Database != db {
				t.Fatalf("System() = %+v", sys)
			}
			// Nothing published: only the unpublished table changes.
			pgtest.ExecAll(t, cs, `INSERT INTO other_t SELECT generate_series(1, 100)`)
			var wal decoding.LSN
			if err := wal.UnmarshalText([]byte(pgtest.QueryText(t, cs, `SELECT pg_current_wal_lsn()::text`))); err != nil {
				t.Fatal(err)
			}
			var adv *reorderbuffer.Txn
			for adv == nil || adv.EndLSN < wal {
				x := next(ctx, t, s)
				if x.Part != reorderbuffer.Advance {
					t.Fatalf("handed out a %v (xid %d), want an Advance", x.Part, x.Xid)
				}
				if confirmed, _ := slotState(t, cs, "s", false); adv == nil && confirmed != created {
					t.Fatalf("the slot moved from %s to %s before any Advance was acknowledged", created, confirmed)
				}
				if adv != nil && x.EndLSN <= adv.EndLSN {
					t.Fatalf("Advance to %s after one to %s", x.EndLSN, adv.EndLSN)
				}
				if err := s.Ack(x); err != nil {
					t.Fatal(err)
				}
				adv = x
			}
			if err := s.SendStatus(ctx, false); err != nil {
				t.Fatal(err)
			}
			s.Close(ctx)
			confirmed, _ := slotState(t, cs, "s", true)
			if confirmed < adv.EndLSN {
				t.Fatalf("slot at %s after the Advance to %s was acknowledged", confirmed, adv.EndLSN)
			}
			if s.Progress().Acked != adv.EndLSN {
				t.Fatalf("Position().Acked = %s, want %s", s.Progress().Acked, adv.EndLSN)
			}

			// The consumer persisted a position behind the slot: refused, and the slot stays.
			cfg.Buffer.SkipThrough = created
			_, err = replication.Start(ctx, cfg)
			var ce *replication.CheckError
			if !errors.Is(err, replication.ErrSlotAhead) || !errors.As(err, &ce) || replication.Retryable(err) {
				t.Fatalf("Start behind the slot: %v; want a *CheckError wrapping ErrSlotAhead", err)
			}
			if after, _ := slotState(t, cs, "s", true); after != confirmed {
				t.Fatalf("the slot moved from %s to %s", confirmed, after)
			}
			// At the slot's position: accepted.
			cfg.Buffer.SkipThrough = confirmed
			s, err = replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (1)`)
			for {
				x := next(ctx, t, s)
				if x.Part == reorderbuffer.Advance {
					s.Ack(x)
					continue
				}
				wantTxn(t, x, "", []string{"1"})
				break
			}
		})
	}
}
