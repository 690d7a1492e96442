package replication_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// unusualSettings make a server that differs from the defaults where it matters to a consumer: a
// short wal_sender_timeout, value formats other than the defaults, and few walsenders and slots.
var unusualSettings = map[string]string{
	"wal_sender_timeout":    "2s",
	"DateStyle":             "SQL, DMY",
	"IntervalStyle":         "sql_standard",
	"extra_float_digits":    "0",
	"max_wal_senders":       "2",
	"max_replication_slots": "3",
}

// waitNoWalsenders waits until the walsenders of earlier subtests have exited.
func waitNoWalsenders(t *testing.T, srv *pgtest.Server) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, "the walsenders of earlier tests to exit", func() bool {
		return pgtest.QueryText(t, srv.ConnString("postgres"), `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'`) == "0"
	})
}

// TestUnusualServer runs against a server configured as above.
func TestUnusualServer(t *testing.T) {
	for _, major := range installedMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			t.Parallel()
			srv := ownServer(t, major, unusualSettings)
			t.Run("pinned formats", func(t *testing.T) { testPinnedFormats(t, srv) })
			if major == 15 || major == 18 {
				t.Run("slow consumer", func(t *testing.T) { testSlowConsumer(t, srv) })
			}
			t.Run("no free slot", func(t *testing.T) { testNoFreeSlot(t, srv) })
			t.Run("no free walsender", func(t *testing.T) { testNoFreeWalsender(t, srv) })
		})
	}
}

// testPinnedFormats: pgoutput formats text values with the walsender session's settings. Whatever
// postgresql.conf and the connection string say (DateStyle, IntervalStyle, extra_float_digits,
// client_encoding), values arrive as PostgreSQL's own subscriber gets them.
func testPinnedFormats(t *testing.T, srv *pgtest.Server) {
	waitNoWalsenders(t, srv)
	db := pgtest.NewDatabase(t, srv)
	cs := srv.ConnString(db)
	ctx := pgtest.Context(t, time.Minute)
	pgtest.ExecAll(t, cs, `CREATE TABLE fmt (id int PRIMARY KEY, d date, i interval, f float8, r real, t text)`,
		`CREATE PUBLICATION fmt FOR TABLE fmt`)
	const dsnSettings = ` options='-c DateStyle=SQL,DMY -c IntervalStyle=sql_standard -c extra_float_digits=0 -c client_encoding=LATIN1'` +
		` DateStyle='SQL, DMY' client_encoding=LATIN1`
	// The test would not notice anything if the server and the connection string did not change
	// the formats of an ordinary session.
	conn := pgtest.Connect(t, cs+dsnSettings)
	res := pgtest.MustExec(t, conn, `SELECT '2024-03-04'::date::text, '1 day 02:03:04'::interval::text, (0.1::float8 + 0.2::float8)::text, chr(233)`)
	if row := res[0].Rows[0]; string(row[0]) != "04/03/2024" || string(row[2]) != "0.3" || string(row[3]) != "\xe9" {
		t.Fatalf("the settings do not reach an ordinary session: %q", row)
	}

	s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db) + dsnSettings,
		Slot: "s", Publications: []string{"fmt"}, CreateSlot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	pgtest.ExecAll(t, cs, `INSERT INTO fmt VALUES (1, '2024-03-04', '1 day 02:03:04', 0.1::float8 + 0.2::float8, 1.1, chr(233))`)
	x := next(ctx, t, s)
	var got []string
	for c, err := range x.Changes() {
		if err != nil {
			t.Fatal(err)
		}
		if ins, ok := c.Msg.(*decoding.Insert); ok {
			for _, c := range ins.New {
				got = append(got, string(c.Data))
			}
		}
	}
	want := []string{"1", "2024-03-04", "1 day 02:03:04", "0.30000000000000004", "1.1", "é"}
	if !slices.Equal(got, want) {
		t.Fatalf("values %q, want %q", got, want)
	}
}

// testSlowConsumer: the consumer spends longer than wal_sender_timeout (2s) on one transaction,
// outside Next. Status updates keep flowing, the connection survives (reconnection is off, and
// the walsender is the same), and nothing unacknowledged is confirmed meanwhile.
func testSlowConsumer(t *testing.T, srv *pgtest.Server) {
	waitNoWalsenders(t, srv)
	db := pgtest.NewDatabase(t, srv)
	setupPub(t, srv, db)
	cs := srv.ConnString(db)
	ctx := pgtest.Context(t, time.Minute)
	log := newLogRecorder()
	s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
		Publications: []string{"pub"}, CreateSlot: true, Reconnect: replication.ReconnectPolicy{Disabled: true},
		Logger: log.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	_, pid := slotState(t, cs, "s", false)
	pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (1), (2)`)
	x := next(ctx, t, s)
	n := 0
	for c, err := range x.Changes() {
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Msg.(*decoding.Insert); ok {
			if n++; n == 1 {
				// Applying the first row takes long: until the server has a status update sent
				// more than twice wal_sender_timeout after this point, from the same walsender's
				// client. Without updates meanwhile, the walsender would have ended the connection.
				held := pgtest.QueryOne[time.Time](t, cs, `SELECT clock_timestamp()`)
				pgtest.Eventually(t, 30*time.Second, "a status update past twice wal_sender_timeout", func() bool {
					past := pgtest.QueryOne[*bool](t, cs, `SELECT (SELECT coalesce(reply_time > $1::timestamptz + 2 * current_setting('wal_sender_timeout')::interval, false)
						FROM pg_stat_replication WHERE pid = $2)`, held, pid)
					if past == nil {
						t.Fatalf("walsender %d is gone", pid)
					}
					return *past
				})
				if c, _ := slotState(t, cs, "s", false); c >= x.CommitLSN {
					t.Fatalf("confirmed_flush_lsn %s passed the transaction being applied (commit %s)", c, x.CommitLSN)
				}
			}
		}
	}
	if err := s.Ack(x); err != nil {
		t.Fatal(err)
	}
	pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (3)`)
	y, err := s.Next(ctx)
	if err != nil {
		log.dump(t)
		t.Fatalf("Next after a pause of over 4s with wal_sender_timeout = 2s: %v", err)
	}
	wantTxn(t, y, "", []string{"3"})
	if _, pid2 := slotState(t, cs, "s", false); pid2 != pid {
		t.Fatalf("the walsender changed from %d to %d", pid, pid2)
	}
}

// testNoFreeSlot: creating a slot when all are in use is refused, naming max_replication_slots.
func testNoFreeSlot(t *testing.T, srv *pgtest.Server) {
	waitNoWalsenders(t, srv)
	db := pgtest.NewDatabase(t, srv)
	setupPub(t, srv, db)
	cs := srv.ConnString(db)
	ctx := pgtest.Context(t, time.Minute)
	pgtest.ExecAll(t, cs, `SELECT pg_create_logical_replication_slot('full_' || i, 'pgoutput')
		FROM generate_series(1, current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)) i`)
	_, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
		Publications: []string{"pub"}, CreateSlot: true})
	wantCheck(t, err, "max_replication_slots", replication.ErrServerConfig, "in use")
}

// testNoFreeWalsender: with every walsender taken, Connect names max_wal_senders.
func testNoFreeWalsender(t *testing.T, srv *pgtest.Server) {
	waitNoWalsenders(t, srv)
	db := pgtest.NewDatabase(t, srv)
	setupPub(t, srv, db)
	ctx := pgtest.Context(t, time.Minute)
	cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s", Publications: []string{"pub"}}
	for range 2 {
		c, err := replication.Connect(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
	}
	_, err := replication.Connect(ctx, cfg)
	wantCheck(t, err, "max_wal_senders", replication.ErrServerConfig, "walsender")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
		t.Fatalf("the server's error is not kept: %v", err)
	}
}
