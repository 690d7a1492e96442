package replication_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// TestWaitEndsPromptly: with a status interval far longer than the test, a read waiting for the
// server ends as soon as Next's context is cancelled or another goroutine closes the stream
// (the read's deadline is the next status update's; nothing else would end it).
func TestWaitEndsPromptly(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx := pgtest.Context(t, time.Minute)
		cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, TemporarySlot: true, StatusInterval: time.Hour}
		reads := watchReads(&cfg)
		s, err := replication.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		// Waits that would end at the status interval are given up after this.
		const limit = 20 * time.Second

		for i := range 3 { // the same stream, several times: each Next registers afresh
			cctx, ccancel := context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, ccancel)
			done := make(chan error, 1)
			go func() { _, err := s.Next(cctx); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Next %d with a cancelled context: %v", i, err)
				}
			case <-time.After(limit):
				t.Fatalf("Next %d still waits %s after its context was cancelled", i, limit)
			}
		}

		// A context that ends by its deadline ends the wait too.
		dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer dcancel()
		start := time.Now()
		if _, err := s.Next(dctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next with a deadline: %v", err)
		}
		if d := time.Since(start); d > limit {
			t.Fatalf("Next with a 20ms deadline returned after %s", d)
		}

		// Still usable: a transaction committed now comes out.
		pgtest.ExecAll(t, srv.ConnString(db), `INSERT INTO pub_t VALUES (1)`)
		wantTxn(t, next(ctx, t, s), "", []string{"1"})

		done := make(chan error, 1)
		go func() { _, err := s.Next(context.Background()); done <- err }()
		reads.waitReading(t) // Next waits for the server when Close comes
		go s.Close(ctx)
		select {
		case err := <-done:
			if !errors.Is(err, replication.ErrClosed) {
				t.Fatalf("Next while Close: %v; want ErrClosed", err)
			}
		case <-time.After(limit):
			t.Fatalf("Next still waits %s after Close", limit)
		}
	})
}

// TestLargeMessages: changes larger than the receive buffer (256 KiB) between small ones, in
// one transaction and in several, come out whole and in order.
func TestLargeMessages(t *testing.T) {
	forMajors(t, func(t *testing.T, srv *pgtest.Server, db string) {
		ctx := pgtest.Context(t, time.Minute)
		cs := srv.ConnString(db)
		pgtest.ExecAll(t, cs, `CREATE TABLE big_t (id int PRIMARY KEY, v text)`, `ALTER PUBLICATION pub ADD TABLE big_t`)
		s, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "s",
			Publications: []string{"pub"}, CreateSlot: true, TemporarySlot: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		// Values that the server compresses poorly (md5 chains), so that pgoutput sends each in full.
		value := func(id, kib int) string {
			return fmt.Sprintf(`(SELECT string_agg(md5('%d' || g), '') FROM generate_series(1, %d) g)`, id, kib*1024/32)
		}
		sizes := []int{1, 300, 1, 2048, 700, 1} // KiB
		var stmts []string
		for i, kib := range sizes {
			stmts = append(stmts, fmt.Sprintf(`INSERT INTO big_t VALUES (%d, %s)`, i, value(i, kib)))
		}
		pgtest.ExecAll(t, cs, "BEGIN; "+strings.Join(stmts, "; ")+"; COMMIT") // one transaction
		pgtest.ExecAll(t, cs, `DELETE FROM big_t`)
		pgtest.ExecAll(t, cs, stmts...) // one each
		check := func(x []string, txns int) {
			t.Helper()
			if len(x) != len(sizes) {
				t.Fatalf("%d inserts in %d transactions, want %d", len(x), txns, len(sizes))
			}
			for i, v := range x {
				if want := sizes[i] * 1024; len(v) != want {
					t.Fatalf("insert %d: %d bytes, want %d", i, len(v), want)
				}
			}
		}
		values := func(n int) []string {
			var out []string
			for range n {
				for c, err := range next(ctx, t, s).Changes() {
					if err != nil {
						t.Fatal(err)
					}
					if ins, ok := c.Msg.(*decoding.Insert); ok {
						out = append(out, string(ins.New[1].Data))
					}
				}
			}
			return out
		}
		check(values(1), 1)
		values(1) // the delete
		check(values(len(sizes)), len(sizes))
	})
}
