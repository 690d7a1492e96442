package kafkasink_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/replication"
)

// A publication's tables copied, then every later transaction, into Kafka exactly once: the
// Sink is the feed's position store (its units are Kafka transactions) and its handler.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sink, err := kafkasink.Open(kafkasink.Config{
		Brokers:     []string{"kafka-1.example.com:9092", "kafka-2.example.com:9092"},
		TopicPrefix: "shop", // events on shop.public.orders, positions on shop.offsets
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close()
	err = changefeed.Run(ctx, changefeed.Config{Replication: replication.Config{
		ConnString: "host=db.example.com user=cdc dbname=shop", Slot: "shop_kafka", Publications: []string{"orders"}}},
		sink, sink.Handle)
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err) // ErrFenced: another pgreorder of the slot took over
	}
}

// Open checks the configuration and connects to nothing: the brokers are reached when the feed
// loads its position.
func ExampleOpen() {
	_, err := kafkasink.Open(kafkasink.Config{})
	fmt.Println(errors.Is(err, kafkasink.ErrInvalidConfig), err)
	_, err = kafkasink.Open(kafkasink.Config{Brokers: []string{"localhost:9092"}, TopicPrefix: "shop/eu"})
	fmt.Println(errors.Is(err, kafkasink.ErrInvalidConfig), err)

	sink, err := kafkasink.Open(kafkasink.Config{Brokers: []string{"localhost:9092"}})
	if err != nil {
		panic(err)
	}
	fmt.Printf("transactional id before the feed loads: %q\n", sink.TransactionalID())
	fmt.Println(sink.Close(), sink.Close()) // safe twice
	// Output:
	// true kafkasink: invalid configuration: Brokers is required
	// true kafkasink: invalid configuration: TopicPrefix is not valid: topic name "shop/eu": only ASCII letters, digits, '.', '_' and '-'
	// transactional id before the feed loads: ""
	// <nil> <nil>
}
