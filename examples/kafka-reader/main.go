// Command kafka-reader prints what a read_committed consumer sees on the topics of a pgreorder
// topic prefix: one line per record, with its topic, partition, offset, key, headers (if any)
// and value (null for a tombstone).
//
//	kafka-reader -brokers 127.0.0.1:9092 -topic-prefix app
//
// It reads every topic whose name starts with PREFIX and a dot, matched by a regular expression
// so that a topic created while it runs is read too, within a second; PREFIX.offsets, the source
// positions, only with -offsets. The isolation level is read_committed: records of aborted
// transactions are never printed. It stops after -n records, or at Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kafka-reader:", err)
		os.Exit(1)
	}
}

// topicChars are the characters of a Kafka topic name.
var topicChars = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// run reads the topics that args name and prints their records to stdout. It returns nil once
// it printed -n records, or when ctx is done.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kafka-reader", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the error is returned; -h prints the flags to stdout
	brokers := fs.String("brokers", "", "Kafka seed brokers, `host:port,...` (required)")
	prefix := fs.String("topic-prefix", "pgreorder", "read the topics `PREFIX`.*, as pgreorder kafka -kafka-topic-prefix names them")
	offsets := fs.Bool("offsets", false, "read PREFIX.offsets too, the source positions")
	fromStart := fs.Bool("from-start", true, "read each partition from its first record (false: only what is written once it is found)")
	n := fs.Int("n", 0, "stop after `N` records (0: at Ctrl-C)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, "usage: kafka-reader -brokers HOST:PORT,... [-topic-prefix PREFIX] [flags]")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	} else if err != nil {
		return fmt.Errorf("%v (see kafka-reader -h)", err)
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q: every option is a flag (see kafka-reader -h)", fs.Arg(0))
	case strings.Trim(*brokers, ", ") == "":
		return errors.New("missing -brokers: name a broker, such as -brokers 127.0.0.1:9092")
	case !topicChars.MatchString(*prefix):
		return fmt.Errorf("-topic-prefix %q: want the prefix pgreorder kafka was given (letters, digits, '.', '_', '-')", *prefix)
	case *n < 0:
		return fmt.Errorf("-n %d: want a number of records, or 0 to read until Ctrl-C", *n)
	}

	start := kgo.NewOffset().AtStart()
	if !*fromStart {
		start = kgo.NewOffset().AtEnd()
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(*brokers, ",")...),
		kgo.ConsumeRegex(),
		kgo.ConsumeTopics("^" + regexp.QuoteMeta(*prefix+".")),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(start),
		// A topic created while it runs is found, and read, within a second: the metadata is
		// refreshed twice a second, and a fetch waiting for records ends as often, to take in the
		// new partitions.
		kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.MetadataMaxAge(500 * time.Millisecond),
		kgo.FetchMaxWait(500 * time.Millisecond),
	}
	if !*offsets {
		opts = append(opts, kgo.ConsumeExcludeTopics("^"+regexp.QuoteMeta(*prefix+".offsets")+"$"))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("-brokers %q: %w", *brokers, err)
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("-brokers %s: no broker answers: %w", *brokers, err)
	}

	for printed := 0; *n == 0 || printed < *n; {
		fetches := cl.PollRecords(ctx, *n-printed) // at most what -n leaves; all there is with -n 0
		if ctx.Err() != nil {
			return nil // Ctrl-C
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return fmt.Errorf("reading %s partition %d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		for r := range fetches.RecordsAll() {
			if _, err := io.WriteString(stdout, line(r)); err != nil {
				return err
			}
			printed++
		}
	}
	return nil
}

// line formats a record:
//
//	topic=app.public.t partition=0 offset=5 key={"id":1} headers=NAME:VALUE,... value=null
func line(r *kgo.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "topic=%s partition=%d offset=%d key=%s", r.Topic, r.Partition, r.Offset, orNull(r.Key))
	for i, h := range r.Headers {
		sep := ","
		if i == 0 {
			sep = " headers="
		}
		fmt.Fprintf(&b, "%s%s:%s", sep, h.Key, h.Value)
	}
	fmt.Fprintf(&b, " value=%s\n", orNull(r.Value))
	return b.String()
}

// orNull returns b as a string, or "null" for a nil key or value (a tombstone's).
func orNull(b []byte) string {
	if b == nil {
		return "null"
	}
	return string(b)
}
