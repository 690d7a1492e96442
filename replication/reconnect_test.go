package replication_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// setupPub creates pub_t, other_t and the publication pub in db.
func setupPub(t *testing.T, srv *pgtest.Server, db string) {
	t.Helper()
	pgtest.ExecAll(t, srv.ConnString(db),
		`CREATE TABLE pub_t (id int PRIMARY KEY)`, `CREATE TABLE other_t (id int PRIMARY KEY)`,
		`CREATE PUBLICATION pub FOR TABLE pub_t`)
}

// session is a plain SQL session of a test, for transactions that span steps.
func session(t *testing.T, connString string) *pgconn.PgConn {
	t.Helper()
	return pgtest.Connect(t, connString)
}

func run(t *testing.T, conn *pgconn.PgConn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		t.Fatalf("%v (in %q)", err, sql)
	}
}

func wantTxn(t *testing.T, x *reorderbuffer.Txn, gid string, want []string) {
	t.Helper()
	if x.GID != gid {
		t.Errorf("transaction %d (end %s): GID %q, want %q", x.Xid, x.EndLSN, x.GID, gid)
	}
	if got := ids(t, x); !slices.Equal(got, want) {
		if len(got) > 10 || len(want) > 10 {
			t.Fatalf("transaction %d (end %s): %d inserts, want %d", x.Xid, x.EndLSN, len(got), len(want))
		}
		t.Fatalf("transaction %d (end %s): inserts %v, want %v", x.Xid, x.EndLSN, got, want)
	}
}

func reconnectConfig(srv *pgtest.Server, db string, log logRecorder) replication.Config {
	return replication.Config{
		ConnString:     srv.ReplicationConnString(db),
		Slot:           "s",
		Publications:   []string{"pub"},
		CreateSlot:     true,
		TwoPhase:       true,
		StatusInterval: 50 * time.Millisecond,
		Reconnect:      replication.ReconnectPolicy{MinDelay: 10 * time.Millisecond, MaxDelay: 500 * time.Millisecond},
		Logger:         log.logger(),
	}
}

// TestReconnectAfterTerminate: the walsender is terminated while a large transaction is being
// streamed, a prepared transaction awaits COMMIT PREPARED and a handed-out transaction is not
// acknowledged yet. Next reconnects by itself and the consumer sees every transaction once.
func TestReconnectAfterTerminate(t *testing.T) {
	for _, major := range installedMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			ctx := pgtest.Context(t, 2*time.Minute)
			log := newLogRecorder()
			defer func() {
				if t.Failed() {
					log.dump(t)
				}
			}()
			s, err := replication.Start(ctx, reconnectConfig(srv, db, log))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			cs := srv.ConnString(db)
			a, b := session(t, cs), session(t, cs)
			run(t, a, `BEGIN; INSERT INTO pub_t SELECT generate_series(1000, 2999)`) // streamed: more than 64kB
			run(t, b, `BEGIN; INSERT INTO pub_t VALUES (1); PREPARE TRANSACTION 'p1'`)
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (2)`)
			x := next(ctx, t, s)
			wantTxn(t, x, "", []string{"2"})
			if st := s.Stats(); st.StreamTxns == 0 || st.OpenTxns < 2 {
				t.Fatalf("before the walsender is terminated: %d streamed, %d open transactions; want 1 and 2", st.StreamTxns, st.OpenTxns)
			}

			pgtest.ExecAll(t, cs, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'`)
			if err := s.Ack(x); err != nil { // acknowledged while the connection is down
				t.Fatal(err)
			}
			run(t, a, `INSERT INTO pub_t SELECT generate_series(3000, 3999); COMMIT`)
			run(t, b, `COMMIT PREPARED 'p1'`)
			pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (3)`)

			var last *reorderbuffer.Txn
			for _, want := range []struct {
				gid string
				ids []string
			}{{"", series(1000, 3999)}, {"p1", []string{"1"}}, {"", []string{"3"}}} {
				last = next(ctx, t, s)
				wantTxn(t, last, want.gid, want.ids)
				if err := s.Ack(last); err != nil {
					t.Fatal(err)
				}
			}
			expectNothingBefore(ctx, t, s, cs, 9000) // nothing again after the reconnection
			if s.Reconnects() == 0 {
				t.Fatal("no reconnection counted")
			}
			if len(log.find(slog.LevelWarn, "replication connection lost")) == 0 || len(log.find(slog.LevelInfo, "reconnected")) == 0 {
				t.Error("the lost connection and the reconnection were not logged")
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if c, _ := slotState(t, cs, "s", true); c < last.EndLSN {
				t.Fatalf("confirmed_flush_lsn %s, below the last acknowledged end %s", c, last.EndLSN)
			}
		})
	}
}

// TestReconnectAfterServerRestart: the server restarts (fast or immediate shutdown) while a
// streamed transaction is in progress (the restart rolls it back) and a prepared transaction
// awaits COMMIT PREPARED. The consumer, blocked in Next all along, gets the prepared
// transaction and what follows, once, and never the rolled-back one. A fast shutdown ends the
// walsender's stream with CommandComplete: with reconnection off, Next reports
// ErrServerEndedStream (a walsender still before its streaming loop would die with FATAL
// 57P01 instead; the test shuts down once it streams).
func TestReconnectAfterServerRestart(t *testing.T) {
	for _, major := range installedMajors(t, 15, 18) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := ownServer(t, major, nil)
			r := newRestarter(t, srv)

			t.Run("ended", func(t *testing.T) {
				db := pgtest.NewDatabase(t, srv)
				setupPub(t, srv, db)
				ctx := pgtest.Context(t, 2*time.Minute)
				log := newLogRecorder()
				cfg := reconnectConfig(srv, db, log)
				cfg.Reconnect.Disabled = true
				reads := watchReads(&cfg)
				s, err := replication.Start(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close(ctx)
				done := make(chan error, 1)
				go func() {
					_, err := s.Next(ctx)
					done <- err
				}()
				reads.waitReading(t) // Next waits for the server when it shuts down
				// A walsender that has not entered its streaming loop yet dies at a fast shutdown
				// as at SIGTERM (FATAL 57P01), with no CommandComplete: the shutdown must find it
				// streaming, as pg_stat_replication shows once its loop has caught up.
				pgtest.Eventually(t, time.Minute, "the walsender streaming", func() bool {
					return pgtest.Count(t, srv.ConnString(db), `SELECT count(*) FROM pg_stat_replication r
						JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1 AND r.state = 'streaming'`, cfg.Slot) == 1
				})
				r.restart(t, syscall.SIGINT)
				err = <-done
				if !errors.Is(err, replication.ErrServerEndedStream) {
					log.dump(t)
					t.Fatalf("Next after a fast shutdown: %v; want ErrServerEndedStream", err)
				}
				if replication.Retryable(err) != true {
					t.Error("ErrServerEndedStream is not retryable")
				}
				if _, err := s.Next(ctx); !errors.Is(err, replication.ErrServerEndedStream) {
					t.Errorf("the error is not sticky with reconnection off: %v", err)
				}
			})

			for _, mode := range []struct {
				name string
				sig  syscall.Signal
			}{{"fast", syscall.SIGINT}, {"immediate", syscall.SIGQUIT}} {
				t.Run(mode.name, func(t *testing.T) {
					db := pgtest.NewDatabase(t, srv)
					setupPub(t, srv, db)
					ctx := pgtest.Context(t, 2*time.Minute)
					log := newLogRecorder()
					defer func() {
						if t.Failed() {
							log.dump(t)
						}
					}()
					cfg := reconnectConfig(srv, db, log)
					reads := watchReads(&cfg)
					s, err := replication.Start(ctx, cfg)
					if err != nil {
						t.Fatal(err)
					}
					defer s.Close(ctx)
					cs := srv.ConnString(db)
					a := pgtest.Connect(t, cs)
					run(t, a, `BEGIN; INSERT INTO pub_t VALUES (1); PREPARE TRANSACTION 'p1'`)
					run(t, a, `BEGIN; INSERT INTO pub_t SELECT generate_series(1000, 2999)`) // streamed, never committed
					pgtest.ExecAll(t, cs, `INSERT INTO pub_t VALUES (2)`)
					x := next(ctx, t, s)
					wantTxn(t, x, "", []string{"2"})
					if st := s.Stats(); st.StreamTxns == 0 {
						t.Fatal("the large transaction was not streamed before the restart")
					}
					s.Ack(x)

					type result struct {
						x   *reorderbuffer.Txn
						ids []string
						err error
					}
					results := make(chan result)
					go func() { // the consumer waits in Next through the restart
						for {
							x, err := s.Next(ctx)
							if err != nil {
								results <- result{err: err}
								return
							}
							results <- result{x: x, ids: ids(t, x)}
							s.Ack(x)
						}
					}()
					reads.waitReading(t) // the consumer waits in Next when the server stops
					r.restart(t, mode.sig)
					pgtest.ExecAll(t, cs, `COMMIT PREPARED 'p1'`, `INSERT INTO pub_t VALUES (3)`)
					var last *reorderbuffer.Txn
					for _, want := range []struct {
						gid string
						ids []string
					}{{"p1", []string{"1"}}, {"", []string{"3"}}} {
						res := <-results
						if res.err != nil {
							t.Fatal(res.err)
						}
						if res.x.GID != want.gid || !slices.Equal(res.ids, want.ids) {
							t.Fatalf("got transaction %q with %d inserts (%v...), want %q with %v",
								res.x.GID, len(res.ids), res.ids[:min(3, len(res.ids))], want.gid, want.ids)
						}
						last = res.x
					}
					if s.Reconnects() == 0 {
						t.Fatal("no reconnection counted")
					}
					if mode.sig == syscall.SIGINT && len(log.find(slog.LevelWarn, "replication connection lost")) == 0 {
						t.Error("the end of the stream was not logged")
					}
					// Nothing else comes (the goroutine is still in Next).
					select {
					case res := <-results:
						if res.err == nil {
							t.Fatalf("unexpected transaction %q with %v", res.x.GID, res.ids)
						}
						t.Fatal(res.err)
					case <-time.After(300 * time.Millisecond):
					}
					s.Close(ctx)
					if res := <-results; !errors.Is(res.err, replication.ErrClosed) {
						t.Fatalf("Next while Close: %v; want ErrClosed", res.err)
					}
					if c, _ := slotState(t, cs, "s", true); c < last.EndLSN {
						t.Fatalf("confirmed_flush_lsn %s, below the last acknowledged end %s", c, last.EndLSN)
					}
				})
			}
		})
	}
}

// TestConnConfigAndBeforeConnect: a *pgconn.Config is accepted instead of a connection string,
// left unmodified, and BeforeConnect runs before every connection, the reconnections included,
// and may change what the connection uses (here its application_name, as an IAM token would
// change the password).
func TestConnConfigAndBeforeConnect(t *testing.T) {
	for _, major := range installedMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			ctx := pgtest.Context(t, time.Minute)
			pc, err := pgconn.ParseConfig(srv.ConnString(db)) // no replication=database: added
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int32
			cfg := replication.Config{ConnConfig: pc, Slot: "s", Publications: []string{"pub"}, CreateSlot: true,
				Reconnect: replication.ReconnectPolicy{MinDelay: 10 * time.Millisecond},
				BeforeConnect: func(ctx context.Context, c *pgconn.Config) error {
					c.RuntimeParams["application_name"] = fmt.Sprintf("token-%d", calls.Add(1))
					return nil
				}}
			s, err := replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			appName := func() string {
				return pgtest.QueryText(t, srv.ConnString(db), `SELECT application_name FROM pg_stat_replication r
					JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 's' AND s.database = current_database()`)
			}
			if got := appName(); got != "token-1" {
				t.Fatalf("application_name %q after the first connection, want token-1", got)
			}
			pgtest.ExecAll(t, srv.ConnString(db), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'`,
				`INSERT INTO pub_t VALUES (1)`)
			wantTxn(t, next(ctx, t, s), "", []string{"1"})
			if n := calls.Load(); n < 2 {
				t.Fatalf("BeforeConnect called %d times, want at least 2", n)
			}
			if got, want := appName(), fmt.Sprintf("token-%d", calls.Load()); got != want {
				t.Fatalf("application_name %q after reconnecting, want %q", got, want)
			}
			if _, ok := pc.RuntimeParams["replication"]; ok || pc.RuntimeParams["application_name"] != "" {
				t.Fatalf("ConnConfig was modified: %v", pc.RuntimeParams)
			}

			// A failing hook fails Start, with its error.
			hookErr := errors.New("no token")
			cfg.Slot, cfg.BeforeConnect = "s2", func(context.Context, *pgconn.Config) error { return hookErr }
			if _, err := replication.Start(ctx, cfg); !errors.Is(err, hookErr) {
				t.Fatalf("Start with a failing BeforeConnect: %v", err)
			}
		})
	}
}
