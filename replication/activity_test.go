package replication_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// waitCaughtUp drives Next (which receives the server's keepalives) until the stream is caught
// up.
func waitCaughtUp(ctx context.Context, t *testing.T, s *replication.Stream) replication.Activity {
	t.Helper()
	for {
		if a := s.Activity(); a.CaughtUp {
			return a
		}
		idle(ctx, t, s, 50*time.Millisecond)
		if ctx.Err() != nil {
			t.Fatalf("never caught up: %+v", s.Activity())
		}
	}
}

// TestActivity follows what the stream records about handed-out transactions: counts, the
// oldest unacknowledged one, the last commit time, and the caught-up state, which the server's
// keepalives set once everything is handed out and acknowledged.
func TestActivity(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, StatusInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		a := waitCaughtUp(ctx, t, s)
		if a.HandedOut != 0 || a.Unacked != 0 || !a.LastCommitTime.IsZero() || a.Started.IsZero() {
			t.Fatalf("idle stream: %+v", a)
		}
		for i := range 3 {
			pgtest.ExecAll(t, srv.ConnString(db), fmt.Sprintf(`INSERT INTO pub_t VALUES (%d)`, i))
		}
		var xs []*reorderbuffer.Txn
		for range 3 {
			xs = append(xs, next(ctx, t, s))
		}
		a = s.Activity()
		if a.CaughtUp || a.HandedOut != 3 || a.Unacked != 3 || a.Acked != 0 {
			t.Fatalf("three handed out: %+v", a)
		}
		if !a.LastCommitTime.Equal(xs[2].CommitTime) || a.LastHandedOut.Before(a.BehindSince) {
			t.Fatalf("last commit %v (handed out %v, behind since %v); want %v", a.LastCommitTime, a.LastHandedOut,
				a.BehindSince, xs[2].CommitTime)
		}
		oldest := a.OldestUnackedAt
		if oldest.IsZero() || oldest.Before(a.BehindSince) || oldest.After(a.LastHandedOut) {
			t.Fatalf("oldest unacked at %v; behind since %v, last handed out %v", oldest, a.BehindSince, a.LastHandedOut)
		}
		// Out of order: the oldest stays until the first is acknowledged.
		ack := func(x *reorderbuffer.Txn) {
			t.Helper()
			if err := s.Ack(x); err != nil {
				t.Fatal(err)
			}
		}
		ack(xs[1])
		if a = s.Activity(); a.Unacked != 2 || a.Acked != 1 || !a.OldestUnackedAt.Equal(oldest) {
			t.Fatalf("second acknowledged: %+v", a)
		}
		ack(xs[0])
		if a = s.Activity(); a.Unacked != 1 || a.Acked != 2 || !a.OldestUnackedAt.After(oldest) {
			t.Fatalf("first two acknowledged: %+v (the oldest was handed out at %v)", a, oldest)
		}
		ack(xs[2])
		ack(xs[2]) // again: counted once
		if a = s.Activity(); a.Unacked != 0 || a.Acked != 3 || !a.OldestUnackedAt.IsZero() {
			t.Fatalf("all acknowledged: %+v", a)
		}
		a = waitCaughtUp(ctx, t, s)
		if !a.BehindSince.IsZero() {
			t.Fatalf("caught up, yet behind since %v", a.BehindSince)
		}
		if p := s.Progress(); p.Received < xs[2].EndLSN {
			t.Fatalf("received %s, before the last end %s", p.Received, xs[2].EndLSN)
		}
	})
}

// TestStatsWhileReading reads the statistics from another goroutine while the consumer reads
// spilled transactions (whose first read flushes their spill log), and checks that the
// acknowledgement fields follow the acknowledgements made while the consumer holds a
// transaction (run with -race).
func TestStatsWhileReading(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, StatusInterval: 5 * time.Millisecond,
			Buffer: reorderbuffer.Config{WorkMem: 64 << 10, Dir: t.TempDir()}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		const n, rows = 3, 10000
		for i := range n {
			pgtest.ExecAll(t, srv.ConnString(db), fmt.Sprintf(`INSERT INTO pub_t SELECT g FROM generate_series(%d, %d) g`, i*rows+1, (i+1)*rows))
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if st := s.Stats(); st.UnackedTxns < 0 || st.MemoryBytes < 0 {
					t.Errorf("stats %+v", st)
					return
				}
			}
		}()
		var held []*reorderbuffer.Txn
		for i := range n {
			x := next(ctx, t, s)
			if got := len(ids(t, x)); got != rows {
				t.Fatalf("transaction %d: %d rows", i, got)
			}
			held = append(held, x)
		}
		close(stop)
		<-done
		st := s.Stats()
		if st.SpillTxns == 0 || st.SpillBytesNow == 0 || st.UnackedTxns != n {
			t.Fatalf("holding %d spilled transactions: %+v", n, st)
		}
		// Acknowledged while the consumer holds the last one.
		for i, x := range held[:n-1] {
			if err := s.Ack(x); err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			if st.UnackedTxns != n-1-i || st.AckedThrough != x.EndLSN || st.OldestUnackedLSN != held[i+1].EndLSN {
				t.Fatalf("after acknowledging %d: unacked %d, acked through %s, oldest %s", i+1, st.UnackedTxns,
					st.AckedThrough, st.OldestUnackedLSN)
			}
		}
		if err := s.Ack(held[n-1]); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.UnackedTxns != 0 || st.OldestUnackedLSN != 0 || st.AckedThrough != held[n-1].EndLSN {
			t.Fatalf("all acknowledged: %+v", st)
		}
		// Once Next runs again the statistics are the buffer's own: the spill logs are gone.
		waitCaughtUp(ctx, t, s)
		if st := s.Stats(); st.SpillBytesNow != 0 || st.UnackedTxns != 0 {
			t.Fatalf("after Next: %+v", st)
		}
	})
}
