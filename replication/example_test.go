package replication_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// Negotiate shows what START_REPLICATION will carry against a given server version.
func ExampleConfig_Negotiate() {
	cfg := replication.Config{Slot: "cdc", Publications: []string{"orders"}, Messages: true}
	for _, major := range []int{13, 15, 17} {
		n, err := cfg.Negotiate(major)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("PostgreSQL %d: %s\n", major, strings.Join(n.PluginArgs, ", "))
	}
	// Output:
	// replication: option messages="true" is not supported by PostgreSQL 13
	// PostgreSQL 15: proto_version '3', publication_names '"orders"', streaming 'on', messages 'true'
	// PostgreSQL 17: proto_version '4', publication_names '"orders"', streaming 'parallel', messages 'true'
}

// A consumer: handle each transaction, make it durable together with its EndLSN, acknowledge
// it. On the next start, the saved position is the resume position. Lost connections are
// reconnected inside Next.
func ExampleStart() {
	ctx := context.Background()
	var saved decoding.LSN // load the consumer's durable position here (0 the first time)
	s, err := replication.Start(ctx, replication.Config{
		ConnString:   "host=db.example.com user=cdc dbname=shop",
		Slot:         "cdc",
		Publications: []string{"orders"},
		CreateSlot:   true,
		Buffer:       reorderbuffer.Config{SkipThrough: saved},
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		var check *replication.CheckError
		if errors.As(err, &check) {
			log.Fatalf("cannot stream: %s (fix: %s)", check.Problem, check.Fix)
		}
		log.Fatal(err)
	}
	defer s.Close(ctx)
	for {
		t, err := s.Next(ctx)
		if err != nil {
			log.Fatal(err) // not retryable: configuration, data loss, closed...
		}
		for c, err := range t.Changes() {
			if err != nil {
				log.Fatal(err)
			}
			_ = c // apply c.Msg (*decoding.Insert, *decoding.Update...) to c.Relation
		}
		// ...commit the changes and t.EndLSN durably, then:
		if err := s.Ack(t); err != nil {
			log.Fatal(err)
		}
	}
}

// A consumer that persists every position the slot confirms, idle ones included, so that a slot
// found ahead of its position means lost data rather than skipped WAL. The position is stored
// with the source system's identifier: another system's positions mean nothing.
func ExampleConfig_handOutAdvances() {
	ctx := context.Background()
	var saved decoding.LSN // load the position and the system id stored with it (0 and "" the first time)
	var savedSystem string
	s, err := replication.Start(ctx, replication.Config{
		ConnString:   "host=db.example.com user=cdc dbname=shop",
		Slot:         "cdc",
		Publications: []string{"orders"},
		Buffer:       reorderbuffer.Config{SkipThrough: saved, HandOutAdvances: true},
	})
	if errors.Is(err, replication.ErrSlotAhead) {
		log.Fatal(err) // acknowledged transactions are missing: resynchronize, or start with SkipThrough 0 to accept it
	}
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	if id := s.System().ID; savedSystem != "" && id != savedSystem {
		log.Fatalf("the position was saved for system %s; this is system %s", savedSystem, id)
	}
	for {
		t, err := s.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if t.Part != reorderbuffer.Advance { // an Advance has no changes: only a position
			for c, err := range t.Changes() {
				if err != nil {
					log.Fatal(err)
				}
				_ = c // apply c.Msg to c.Relation
			}
		}
		// ...store t.EndLSN (and s.System().ID) durably, with the changes if any, then:
		if err := s.Ack(t); err != nil {
			log.Fatal(err)
		}
	}
}

// An initial copy in the snapshot of the slot's creation, then the stream from that point.
func ExampleConn_CreateSlot() {
	ctx := context.Background()
	conn, err := replication.Connect(ctx, replication.Config{
		ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "cdc", Publications: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
	if err != nil {
		log.Fatal(err)
	}
	// On other connections, for each published table:
	//   BEGIN ISOLATION LEVEL REPEATABLE READ;
	//   SET TRANSACTION SNAPSHOT '<snap.Name>';
	//   COPY orders TO STDOUT; ...
	//   COMMIT;
	fmt.Println("copy in snapshot", snap.Name, "taken at", snap.ConsistentPoint)
	s, err := conn.StartStreaming(ctx) // the snapshot ends here
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	// for { t, err := s.Next(ctx); ... }: exactly the transactions committed after the copy
}

// A connection configured in code: TLS, a dialer, and a password that expires (an IAM
// authentication token), fetched again before every reconnection.
func ExampleConfig_beforeConnect() {
	pc, err := pgconn.ParseConfig("host=db.example.com user=cdc dbname=shop sslmode=verify-full")
	if err != nil {
		log.Fatal(err)
	}
	token := func(ctx context.Context) (string, error) { return "fresh-token", nil } // your cloud's SDK
	cfg := replication.Config{
		ConnConfig:   pc,
		Slot:         "cdc",
		Publications: []string{"orders"},
		BeforeConnect: func(ctx context.Context, c *pgconn.Config) error {
			var err error
			c.Password, err = token(ctx)
			return err
		},
		Reconnect: replication.ReconnectPolicy{MaxAttempts: 20},
	}
	s, err := replication.Start(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(context.Background())
}

// Acknowledging from another goroutine: transactions are written by a pipeline and
// acknowledged when the writer confirms them, while the consumer already waits for the next one.
// Each transaction's changes are read before Next is called again.
func ExampleStream_Ack() {
	ctx := context.Background()
	s, err := replication.Start(ctx, replication.Config{
		ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "cdc", Publications: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	written := make(chan *reorderbuffer.Txn, 100)
	go func() {
		for t := range written {
			// ...wait until the writer has t durably, then:
			if err := s.Ack(t); err != nil {
				log.Print(err)
			}
		}
	}()
	for {
		t, err := s.Next(ctx)
		if err != nil {
			close(written)
			log.Fatal(err)
		}
		for c, err := range t.Changes() {
			_, _ = c, err // hand a copy of each change (c.Msg.Clone()) to the writer
		}
		written <- t // its fields, such as EndLSN, stay valid
	}
}

// With reconnection off, the consumer decides: start again on retryable errors.
func ExampleRetryable() {
	ctx := context.Background()
	cfg := replication.Config{
		ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "cdc", Publications: []string{"orders"},
		Reconnect: replication.ReconnectPolicy{Disabled: true},
	}
	for {
		s, err := replication.Start(ctx, cfg)
		if err == nil {
			for {
				var t *reorderbuffer.Txn
				if t, err = s.Next(ctx); err != nil {
					break
				}
				// ...handle t...
				s.Ack(t)
			}
			cfg.Buffer.SkipThrough = s.Progress().Acked // everything acknowledged was durable
			s.Close(ctx)
		}
		if !replication.Retryable(err) {
			log.Fatal(err)
		}
	}
}
