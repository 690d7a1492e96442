package metrics_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// A snapshot's one-line summary, as a progress line prints it.
func ExampleReading_String() {
	rd := metrics.Reading{
		Stats: reorderbuffer.Stats{
			TotalTxns: 12345, TotalChanges: 1_210_000,
			MemoryBytes: 12 << 20, PeakMemoryBytes: 64 << 20,
			SpillBytesNow: 300 << 20, SpillBytes: 3 << 29,
		},
		Activity:         replication.Activity{Acked: 12340, Unacked: 2},
		LagBytes:         4 << 20,
		Lag:              3200 * time.Millisecond,
		OldestUnackedAge: 1500 * time.Millisecond,
		TxnsPerSecond:    850,
		ChangesPerSecond: 42_100,
	}
	fmt.Println(rd)
	rd = metrics.Reading{Stats: rd.Stats, Activity: replication.Activity{Acked: 12345, CaughtUp: true}, Reconnects: 1}
	fmt.Println(rd)
	// Output:
	// received 12.3k txns, 1.21M changes | acked 12.3k, 2 unacked (oldest 1.5s) | lag 4.00 MiB, 3.2s | 850 txn/s, 42.1k changes/s | memory 12.0 MiB, peak 64.0 MiB | spilled 300 MiB now, 1.50 GiB total
	// received 12.3k txns, 1.21M changes | acked 12.3k | caught up | 0 txn/s, 0 changes/s | memory 12.0 MiB, peak 64.0 MiB | spilled 300 MiB now, 1.50 GiB total | reconnects 1
}

// A consumer that serves its stream's metrics on :9187/metrics and logs a summary every minute.
// With a registry of its own, register the collector there instead (prometheus.MustRegister(c)).
func ExampleNew() {
	ctx := context.Background()
	s, err := replication.Start(ctx, replication.Config{
		ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "cdc", Publications: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	c, err := metrics.New(s, metrics.Options{Labels: map[string]string{"slot": "cdc"}})
	if err != nil {
		log.Fatal(err)
	}
	h, err := metrics.Handler(c)
	if err != nil {
		log.Fatal(err)
	}
	go http.ListenAndServe(":9187", h) // or metrics.Listen, which serves /metrics only
	go func() {
		for range time.Tick(time.Minute) {
			log.Print(c.Reading()) // safe while the consumer works
		}
	}()
	for {
		t, err := s.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		// ...handle t durably, then:
		if err := s.Ack(t); err != nil {
			log.Fatal(err)
		}
	}
}
