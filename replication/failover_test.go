package replication_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// TestFailoverConfig: Failover is refused with a *ConfigError naming the field, together with
// TemporarySlot (no server needed) and on servers before PostgreSQL 17.
func TestFailoverConfig(t *testing.T) {
	cfg := replication.Config{Slot: "s", Publications: []string{"pub"}, Failover: true, TemporarySlot: true}
	_, err := cfg.Negotiate(17)
	var ce *replication.ConfigError
	if !errors.As(err, &ce) || ce.Field.Path != "Failover" || !errors.Is(err, replication.ErrInvalidConfig) {
		t.Fatalf("Failover with TemporarySlot: %v; want a *ConfigError about Failover", err)
	}
	for _, major := range installedMajors(t) {
		if major >= 17 {
			continue
		}
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			ctx := pgtest.Context(t, time.Minute)
			_, err := replication.Start(ctx, replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "fo",
				Publications: []string{"pub"}, CreateSlot: true, Failover: true})
			var ce *replication.ConfigError
			if !errors.As(err, &ce) || ce.Field.Path != "Failover" || !strings.Contains(err.Error(), "PostgreSQL 17") {
				t.Fatalf("Failover on PostgreSQL %d: %v; want a *ConfigError about Failover", major, err)
			}
			if n := pgtest.Count(t, srv.ConnString(db), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fo'"); n != 0 {
				t.Fatal("the slot was created")
			}
		})
	}
}

// TestFailoverWarnings: with Failover, a primary without a standby that keeps slots gets a
// warning naming synchronized_standby_slots, and an existing slot without failover is altered
// to have it, logged once; Reconnect logs neither again.
func TestFailoverWarnings(t *testing.T) {
	for _, major := range installedMajors(t, 17, 18) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			setupPub(t, srv, db)
			pgtest.ExecAll(t, srv.ConnString(db), "SELECT pg_create_logical_replication_slot('fo', 'pgoutput')")
			ctx := pgtest.Context(t, time.Minute)
			rec := newLogRecorder()
			cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: "fo", Publications: []string{"pub"},
				Failover: true, Logger: rec.logger()}
			for range 2 {
				s, err := replication.Start(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				s.Close(ctx)
			}
			if w := rec.find(slog.LevelWarn, "may not survive a failover"); len(w) != 2 || !strings.Contains(w[0], "setting=synchronized_standby_slots") {
				rec.dump(t)
				t.Fatalf("warnings %q; want one per Start about synchronized_standby_slots", w)
			}
			if got := rec.find(slog.LevelInfo, "enabled failover"); len(got) != 1 {
				rec.dump(t)
				t.Fatalf("enabling failover logged %d times; want once", len(got))
			}
			if v := pgtest.QueryText(t, srv.ConnString(db), "SELECT failover::text FROM pg_replication_slots WHERE slot_name = 'fo'"); v != "true" {
				t.Fatalf("slot failover = %q after Start with Failover", v)
			}

			// A Start that waits for the slot, held by another stream, checks the settings and
			// logs their warnings once, not at each of its attempts.
			holder, err := replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			rec2 := newLogRecorder()
			cfg2 := cfg
			cfg2.Logger = rec2.logger()
			type started struct {
				s   *replication.Stream
				err error
			}
			done := make(chan started, 1)
			go func() {
				s, err := replication.Start(ctx, cfg2)
				done <- started{s, err}
			}()
			for len(rec2.find(slog.LevelWarn, "slot in use")) == 0 { // the first refusal, then a wait
				if ctx.Err() != nil {
					t.Fatal("the second Start never met the slot in use")
				}
				time.Sleep(10 * time.Millisecond)
			}
			holder.Close(ctx)
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			r.s.Close(ctx)
			if w := rec2.find(slog.LevelWarn, "may not survive a failover"); len(w) != 1 {
				rec2.dump(t)
				t.Fatalf("a Start that waited for the slot logged %d failover warnings; want 1", len(w))
			}

			// Reconnect runs the checks and logs neither the warnings nor the publication again.
			if len(rec.find(slog.LevelInfo, "publication")) == 0 {
				t.Fatal("Start logged no publication line")
			}
			rec3 := newLogRecorder()
			cfg3 := cfg
			cfg3.Logger = rec3.logger()
			c, err := replication.Reconnect(ctx, cfg3)
			if err != nil {
				t.Fatal(err)
			}
			c.Close(ctx)
			if w, p := rec3.find(slog.LevelWarn, "may not survive a failover"), rec3.find(slog.LevelInfo, "publication"); len(w) != 0 || len(p) != 0 {
				rec3.dump(t)
				t.Fatalf("Reconnect logged %d failover warnings and %d publication lines; want none", len(w), len(p))
			}
		})
	}
}

// failoverConsumer reads a Stream on its own goroutine, acknowledging each transaction, and
// keeps the ids its inserts carry, in order.
type failoverConsumer struct {
	mu   sync.Mutex
	ids  []int
	err  error
	done chan struct{}
}

func consume(ctx context.Context, t *testing.T, s *replication.Stream) *failoverConsumer {
	c := &failoverConsumer{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			x, err := s.Next(ctx)
			if err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
			var got []int
			for _, id := range ids(t, x) {
				n, _ := strconv.Atoi(id)
				got = append(got, n)
			}
			c.mu.Lock()
			c.ids = append(c.ids, got...)
			c.mu.Unlock()
			if err := s.Ack(x); err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
		}
	}()
	return c
}

func (c *failoverConsumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

// failoverWorkload commits transactions of ids from *next on connString, every third one large
// enough to be streamed (more than logical_decoding_work_mem, 64kB), until n transactions are
// committed, and returns the ids committed.
func failoverWorkload(t *testing.T, connString string, next *int, n int) []int {
	t.Helper()
	var out []int
	for i := range n {
		rows := 3
		if i%3 == 0 {
			rows = 1500
		}
		lo := *next
		*next += rows
		pgtest.ExecAll(t, connString, fmt.Sprintf("INSERT INTO pub_t SELECT g FROM generate_series(%d, %d) g", lo, *next-1))
		for id := lo; id < *next; id++ {
			out = append(out, id)
		}
	}
	return out
}

// TestFailover: a Stream on a slot created with Failover, connected through a connection string
// that names a primary and its standby, continues on the standby once it is promoted and the
// primary stopped: every committed transaction arrives exactly once, also those committed while
// it reconnects, and a transaction that was being streamed when the primary stopped, never
// committed, does not. A slot created without failover, read at the same time, does not exist on
// the promoted standby: that stream ends with an error that says so and names Failover.
func TestFailover(t *testing.T) {
	for _, major := range installedMajors(t, 17, 18) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			pair := pgtest.NewPair(t, major)
			primary := pair.Primary.ConnString(pair.DB)
			pgtest.ExecAll(t, primary, "CREATE TABLE pub_t (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE pub_t")
			ctx := pgtest.Context(t, 2*time.Minute)
			rec := newLogRecorder()
			t.Cleanup(func() {
				if t.Failed() {
					rec.dump(t)
				}
			})
			cfg := replication.Config{ConnString: pair.ConnString(), Slot: "fo", Publications: []string{"pub"},
				CreateSlot: true, Failover: true, Logger: rec.logger(), StatusInterval: 100 * time.Millisecond,
				Reconnect: replication.ReconnectPolicy{MaxDelay: 500 * time.Millisecond}}
			plainCfg := cfg
			plainCfg.Slot, plainCfg.Failover, plainCfg.Logger = "plain", false, nil
			s, err := replication.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			plain, err := replication.Start(ctx, plainCfg)
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close(ctx)
			if w := rec.find(slog.LevelWarn, "failover"); len(w) != 0 {
				t.Fatalf("warnings on a primary set up for failover: %q", w)
			}
			if v := pgtest.QueryText(t, primary, "SELECT string_agg(slot_name || ' ' || failover::text, ',' ORDER BY slot_name) "+
				"FROM pg_replication_slots WHERE slot_type = 'logical'"); v != "fo true,plain false" {
				t.Fatalf("slots %q; want fo with failover and plain without", v)
			}
			c, pc := consume(ctx, t, s), consume(ctx, t, plain)
			// The standby keeps a copy of the slot before transactions are open (an open
			// transaction holds the slot's restart_lsn back, and the copy stays temporary until
			// that passes the position the standby reserves).
			pair.WaitSynced(t, "fo")

			next := 1
			want := failoverWorkload(t, primary, &next, 9)
			// A large transaction is streamed, and still open when the primary stops.
			open := pgtest.Connect(t, primary)
			pgtest.MustExec(t, open, fmt.Sprintf("BEGIN; INSERT INTO pub_t SELECT g FROM generate_series(%d, %d) g", 1_000_000, 1_002_000))
			pgtest.Eventually(t, time.Minute, "the consumers to receive the first transactions", func() bool {
				return c.count() == len(want) && pc.count() == len(want)
			})
			pair.WaitSynced(t, "fo")
			pair.Failover(t)

			promoted := pair.Standby.ConnString(pair.DB)
			want = append(want, failoverWorkload(t, promoted, &next, 6)...)
			pgtest.Eventually(t, time.Minute, "the stream to continue on the promoted standby", func() bool { return c.count() >= len(want) })
			select {
			case <-pc.done:
			case <-ctx.Done():
				t.Fatal("the stream on the slot without failover did not end")
			}
			// Nothing more arrives: a marker transaction is the next one.
			pgtest.ExecAll(t, promoted, "INSERT INTO pub_t VALUES (0)")
			want = append(want, 0)
			pgtest.Eventually(t, time.Minute, "the marker", func() bool { return c.count() >= len(want) })
			c.mu.Lock()
			got, cerr := slices.Clone(c.ids), c.err
			c.mu.Unlock()
			if cerr != nil {
				t.Fatalf("stream on the failover slot: %v", cerr)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("received %d ids, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
			}
			if s.System().Timeline < 2 || rec.find(slog.LevelInfo, "promoted standby") == nil {
				t.Fatalf("timeline %d after the failover; want it logged and above 1", s.System().Timeline)
			}

			pc.mu.Lock()
			perr := pc.err
			pc.mu.Unlock()
			wantCheck(t, perr, "slot", replication.ErrSlotNotFound, "not created for failover")
			var named interface {
				Named(replication.FieldNamer) string
			}
			if !errors.As(perr, &named) || !strings.Contains(named.Named(func(f replication.Field) string { return "-" + strings.ToLower(f.Path) }), "-failover") {
				t.Fatalf("the error does not name the Failover field: %v", perr)
			}
			// Starting again on the promoted standby says the same, from the timeline.
			plainCfg.CreateSlot = false
			_, err = replication.Start(ctx, plainCfg)
			wantCheck(t, err, "slot", replication.ErrSlotNotFound, "not created for failover")
		})
	}
}

func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
