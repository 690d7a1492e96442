// Command cdc-jsonl DSN SLOT PUBLICATION OUT copies the published tables, then streams every later
// change, as Debezium JSON lines in OUT, each change exactly once whatever kills it (kill -9
// included): OUT.pos holds the position with OUT's length, and a restart cuts OUT back to it.
package main

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/replication"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	out, err := changefeed.OpenJSONLines(os.Args[4], changefeed.JSONLinesConfig{Format: format.Config{Kind: format.KindDebezium}})
	if err != nil {
		log.Fatal(err)
	}
	cfg := changefeed.Config{Replication: replication.Config{ConnString: os.Args[1], Slot: os.Args[2], Publications: os.Args[3:4]}}
	if err := changefeed.Run(ctx, cfg, out, out.Handle); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
