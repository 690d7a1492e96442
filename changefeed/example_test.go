package changefeed_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sync"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/replication"
)

// A Batch is a pgvalue.Source, as a streamed transaction and a copied chunk are.
var _ pgvalue.Source = (*changefeed.Batch)(nil)

// The whole consumer: the published tables copied, then every later change, each printed with
// its table, column names and Go values; the position in a file, to resume from; Prometheus
// metrics. examples/changefeed is this program, tested against PostgreSQL 15 and 18.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	store, err := changefeed.OpenFile("cdc.pos") // slot, server, copy done, end LSN; fsynced, replaced atomically
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex // the copy's chunks are handled by several workers at once
	feed, err := changefeed.New(changefeed.Config{
		Replication: replication.Config{ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "cdc",
			Publications: []string{"orders"}}, // text values: in binary, an enum would be a []byte
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}, store, func(ctx context.Context, b *changefeed.Batch) error {
		var out []byte
		for ch, err := range pgvalue.NewDecoder(nil).Changes(b) { // copied rows are inserts
			if err != nil {
				return err
			}
			out = fmt.Appendf(out, "%s %s\n", b.Kind, ch) // "snapshot Insert public.orders"
			for c := range ch.New.Columns() {
				v, err := c.Value() // int32, string, time.Time, pgtype.Numeric...
				if errors.Is(err, pgvalue.ErrUnchanged) {
					continue // an unchanged TOASTed value: not sent
				} else if err != nil {
					return err
				}
				out = fmt.Appendf(out, "  %s = %T %v\n", c.Name, v, v)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		_, err := os.Stdout.Write(out) // a FileStore keeps no output: what was printed before a crash
		return err                     // and not stored yet is printed again
	})
	if err != nil {
		log.Fatal(err)
	}
	srv, err := metrics.Serve("127.0.0.1:9187", feed, metrics.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close(ctx)
	if err := feed.Run(ctx); !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// With a TableStore, what the handler writes in Tx(b) commits in the transaction that stores the
// batch's position: a consumer that writes into that database holds every change exactly once.
// A copy cut short is discarded at the Reset that starts the next copy.
func ExampleTx() {
	ctx := context.Background()
	store, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: "host=warehouse.example.com dbname=dw"})
	if err != nil {
		log.Fatal(err)
	}
	err = changefeed.Run(ctx, changefeed.Config{Replication: replication.Config{
		ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "dw", Publications: []string{"orders"}}},
		store, func(ctx context.Context, b *changefeed.Batch) error {
			tx := changefeed.Tx(b)
			if b.Kind == changefeed.Reset {
				_, err := tx.Exec(ctx, "TRUNCATE orders_log") // waits for a dead run's transactions
				return err
			}
			for ch, err := range pgvalue.NewDecoder(nil).Changes(b) {
				if err != nil {
					return err
				}
				if ch.Op == decoding.MsgTruncate {
					continue
				}
				row := ch.New
				if !row.Present() {
					row = ch.Old
				}
				vals, err := row.Values()
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "INSERT INTO orders_log (op, row) VALUES ($1, $2)", ch.Op.String(), vals); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
}

// Debezium JSON lines in a file, exactly once: the published tables copied ("r" events), then
// every later change; killed at any moment (kill -9 included) and started again, the file holds
// each change once. examples/cdc-jsonl is this program, and its test kills it.
func ExampleOpenJSONLines() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	out, err := changefeed.OpenJSONLines("changes.jsonl", changefeed.JSONLinesConfig{
		Format: format.Config{Kind: format.KindDebezium}}) // and changes.jsonl.pos, the position
	if err != nil {
		log.Fatal(err)
	}
	err = changefeed.Run(ctx, changefeed.Config{Replication: replication.Config{
		ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "cdc", Publications: []string{"orders"}},
	}, out, out.Handle)
	if err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// A slot streamed to standard output from where it is, with no copy and nothing stored: the slot's
// confirmed position is the position (at least once), as `pgreorder stream` does without -o.
func ExampleSlotStore() {
	w := format.NewWriter(os.Stdout, format.Config{})
	defer w.Close()
	err := changefeed.Run(context.Background(), changefeed.Config{Start: changefeed.StartStream,
		Replication: replication.Config{ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "tail",
			Publications: []string{"orders"}, CreateSlot: true}},
		changefeed.SlotStore{}, func(ctx context.Context, b *changefeed.Batch) error {
			if b.Kind != changefeed.Transaction {
				return nil // Reset: nothing to undo on a terminal
			}
			return w.WriteTxn(b.Txn) // acknowledged once written
		})
	if err != nil {
		log.Fatal(err)
	}
}
