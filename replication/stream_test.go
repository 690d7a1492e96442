package replication_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func forMajors(t *testing.T, f func(t *testing.T, srv *pgtest.Server, db string)) {
	for _, major := range pgtest.Majors(t) {
		if major != 15 && major != 18 {
			continue
		}
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := pgtest.Exec(ctx, srv.ConnString(db),
				`CREATE TABLE pub_t (id int PRIMARY KEY)`, `CREATE TABLE other_t (id int PRIMARY KEY)`,
				`CREATE PUBLICATION pub FOR TABLE pub_t`); err != nil {
				t.Fatal(err)
			}
			f(t, srv, db)
		})
	}
}

func slotLSN(ctx context.Context, t *testing.T, conn *pgx.Conn, waitInactive bool) decoding.LSN {
	t.Helper()
	for {
		var active bool
		var text string
		if err := conn.QueryRow(ctx, `SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots
			WHERE slot_name = 's' AND database = current_database()`).Scan(&active, &text); err != nil {
			t.Fatal(err)
		}
		lsn, err := decoding.ParseLSN(text)
		if err != nil {
			t.Fatal(err)
		}
		if !waitInactive || !active {
			return lsn
		}
		select {
		case <-ctx.Done():
			t.Fatal("slot stayed active")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestIdleSlotAdvances: with nothing published, the slot's confirmed_flush_lsn still follows the
// WAL written by unrelated tables, so an idle slot does not pin WAL.
func TestIdleSlotAdvances(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, StatusInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		conn, err := pgx.Connect(ctx, srv.ConnString(db))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		start := slotLSN(ctx, t, conn, false)
		for i := range 20 {
			if _, err := conn.Exec(ctx, `INSERT INTO other_t VALUES ($1)`, i); err != nil {
				t.Fatal(err)
			}
		}
		var text string
		if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&text); err != nil {
			t.Fatal(err)
		}
		target, err := decoding.ParseLSN(text)
		if err != nil {
			t.Fatal(err)
		}
		// Drive the stream until the slot has confirmed past the unrelated WAL.
		for slotLSN(ctx, t, conn, false) < target {
			idle(ctx, t, s, 100*time.Millisecond)
			if ctx.Err() != nil {
				t.Fatalf("confirmed_flush_lsn stayed at %s, below %s", slotLSN(ctx, t, conn, false), target)
			}
		}
		t.Logf("confirmed_flush_lsn advanced from %s past %s with no published change", start, target)
	})
}

// TestUnackedIsResent: a transaction received but not acknowledged is not confirmed, and comes
// again after a restart; once acknowledged (or skipped with SkipThrough) it does not.
func TestUnackedIsResent(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, StatusInterval: 20 * time.Millisecond}
		s, err := replication.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := pgtest.Exec(ctx, srv.ConnString(db), `INSERT INTO pub_t SELECT generate_series(1, 3000)`,
			`INSERT INTO pub_t VALUES (5000)`); err != nil {
			t.Fatal(err)
		}
		first, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !first.Streamed {
			t.Logf("note: the first transaction was not streamed")
		}
		s.Ack(first)
		second, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		end2 := second.EndLSN
		// Not acknowledged. Let status updates and keepalives flow for a while, then close.
		if err := s.SendStatus(ctx, true); err != nil {
			t.Fatal(err)
		}
		nctx, ncancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if x, err := s.Next(nctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next = %v, %v; want a deadline", x, err)
		}
		ncancel()
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := s.Next(ctx); !errors.Is(err, replication.ErrClosed) {
			t.Fatalf("Next after Close: %v", err)
		}
		conn, err := pgx.Connect(ctx, srv.ConnString(db))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if c := slotLSN(ctx, t, conn, true); c < first.EndLSN || c > second.CommitLSN {
			t.Fatalf("confirmed_flush_lsn %s; want between the acked end %s and the unacked commit %s", c, first.EndLSN, second.CommitLSN)
		}

		// Restart: the unacknowledged transaction comes again, and only it.
		cfg.CreateSlot = false
		s2 := startRetry(ctx, t, cfg)
		again, err := s2.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if again.EndLSN != end2 {
			t.Fatalf("after restart got end %s, want the unacknowledged %s", again.EndLSN, end2)
		}
		s2.Ack(again)
		if err := s2.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if c := slotLSN(ctx, t, conn, true); c < end2 {
			t.Fatalf("confirmed_flush_lsn %s after acknowledging %s", c, end2)
		}

		// Resume from a durable position ahead of the slot: nothing at or before it is repeated.
		if err := pgtest.Exec(ctx, srv.ConnString(db), `INSERT INTO pub_t VALUES (6000)`); err != nil {
			t.Fatal(err)
		}
		cfg.Buffer = reorderbuffer.Config{SkipThrough: end2}
		s3 := startRetry(ctx, t, cfg)
		defer s3.Close(ctx)
		third, err := s3.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if third.CommitLSN <= end2 {
			t.Fatalf("resumed after %s but got commit %s", end2, third.CommitLSN)
		}
	})
}

// TestCancel: a cancelled context stops Next with its error and leaves the stream usable.
func TestCancel(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, TemporarySlot: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		cctx, ccancel := context.WithCancel(ctx)
		time.AfterFunc(50*time.Millisecond, ccancel)
		if _, err := s.Next(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Next with a cancelled context: %v", err)
		}
		if err := pgtest.Exec(ctx, srv.ConnString(db), `INSERT INTO pub_t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		x, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("Next after a cancelled one: %v", err)
		}
		if n := inserts(t, x); n != 1 {
			t.Fatalf("%d inserts, want 1", n)
		}
	})
}

// TestNextBefore: NextBefore returns context.DeadlineExceeded once its time passed with no
// transaction complete, not before, and leaves the stream usable; a transaction that arrives in
// time is returned.
func TestNextBefore(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, TemporarySlot: true, StatusInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		// Two calls with one context, which then ends between calls: the next call, with
		// another context, is not disturbed by it.
		cctx, ccancel := context.WithCancel(ctx)
		for range 2 {
			until := time.Now().Add(100 * time.Millisecond) // past several status updates
			if x, err := s.NextBefore(cctx, until); x != nil || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("NextBefore with nothing published = %v, %v; want a deadline", x, err)
			}
			if now := time.Now(); now.Before(until) {
				t.Fatalf("NextBefore returned %s before its time", until.Sub(now))
			}
		}
		ccancel()
		if err := pgtest.Exec(ctx, srv.ConnString(db), `INSERT INTO pub_t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		x, err := s.NextBefore(ctx, time.Now().Add(30*time.Second))
		if err != nil {
			t.Fatalf("NextBefore after one that timed out: %v", err)
		}
		if n := inserts(t, x); n != 1 {
			t.Fatalf("%d inserts, want 1", n)
		}
	})
}

// inserts counts the inserts of x.
func inserts(t *testing.T, x *reorderbuffer.Txn) int {
	t.Helper()
	n := 0
	for c, err := range x.Changes() {
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Msg.(*decoding.Insert); ok {
			n++
		}
	}
	return n
}

func startRetry(ctx context.Context, t *testing.T, cfg replication.Config) *replication.Stream {
	t.Helper()
	var s *replication.Stream
	// The walsender of the stream before may not have released the slot yet.
	pgtest.Eventually(t, 30*time.Second, "the slot to be released", func() bool {
		var err error
		if s, err = replication.Start(ctx, cfg); err != nil && !errors.Is(err, replication.ErrSlotActive) {
			t.Fatal(err)
		}
		return err == nil
	})
	return s
}

// TestConcurrentAck: transactions are acknowledged by another goroutine while the consumer is
// already waiting in Next for the next one, and a third goroutine reads the positions and
// statistics meanwhile (run with -race). The slot ends confirmed through the last transaction.
func TestConcurrentAck(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, StatusInterval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		const n = 50
		stmts := make([]string, n)
		for i := range stmts {
			stmts[i] = fmt.Sprintf(`INSERT INTO pub_t VALUES (%d)`, i)
		}
		if err := pgtest.Exec(ctx, srv.ConnString(db), stmts...); err != nil {
			t.Fatal(err)
		}
		acks := make(chan *reorderbuffer.Txn, n)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			for x := range acks {
				// Not a wait for anything: acknowledging a little later keeps Next waiting while
				// the acknowledgements come from this goroutine.
				time.Sleep(time.Millisecond)
				if err := s.Ack(x); err != nil {
					t.Error(err)
				}
			}
		}()
		stop := make(chan struct{})
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Before anything arrives, the flush position is the slot's own.
				if p := s.Progress(); p.Acked > p.Received || p.Flushed > max(p.Received, p.Start) {
					t.Errorf("position %+v: acknowledged or flushed past what was received", p)
					return
				}
				_ = s.Stats()
				_ = s.Reconnects()
			}
		}()
		var last *reorderbuffer.Txn
		for i := range n {
			x, err := s.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids(t, x)) != 1 {
				t.Fatalf("transaction %d has no insert", i)
			}
			acks <- x
			last = x
		}
		close(acks)
		close(stop)
		wg.Wait()
		if p := s.Progress(); p.Acked != last.EndLSN {
			t.Fatalf("acked %s, want the last end %s", p.Acked, last.EndLSN)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if c := slotLSN(ctx, t, mustConnect(ctx, t, srv.ConnString(db)), true); c < last.EndLSN {
			t.Fatalf("confirmed_flush_lsn %s, want at least %s", c, last.EndLSN)
		}
	})
}

func mustConnect(ctx context.Context, t *testing.T, connString string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// idle drives s for d (or until ctx ends) when nothing is published: a transaction or an error
// other than the deadline fails the test.
func idle(ctx context.Context, t *testing.T, s *replication.Stream, d time.Duration) {
	t.Helper()
	nctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	x, err := s.Next(nctx)
	if x != nil {
		t.Fatalf("unexpected transaction %d: nothing is published", x.Xid)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}
