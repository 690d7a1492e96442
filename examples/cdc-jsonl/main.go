// Command cdc-jsonl is the smallest correct pgreorder consumer: it appends each committed
// transaction of a publication to a JSON-lines file, makes it durable, and only then
// acknowledges it.
//
//	cdc-jsonl -dsn 'host=/tmp dbname=app' -slot cdc -publication pub -create-slot -out changes.jsonl
//
// The file is a format.File: after each transaction it is fsynced, and a small position file
// next to it (changes.jsonl.pos) records, atomically, the file's length and the transaction's end
// LSN. On start the output is cut back to that length (which removes a torn line, or a
// transaction written but not recorded, that a crash left) and the stream resumes after that
// LSN: a crash at any point neither loses a transaction nor writes one twice, and resuming costs
// the same whatever the size of the file or of its last line.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

type config struct {
	dsn, slot, out string
	publications   []string
	createSlot     bool
	format         format.Kind
	log            *slog.Logger
	// afterWrite, when set, runs after a transaction is written and made durable, before its Ack
	// (tests inject crashes there).
	afterWrite func(t *reorderbuffer.Txn) error
}

func main() {
	var c config
	flag.StringVar(&c.dsn, "dsn", "", "source database connection string")
	flag.StringVar(&c.slot, "slot", "", "replication slot")
	pub := flag.String("publication", "", "publication(s), comma-separated")
	flag.BoolVar(&c.createSlot, "create-slot", false, "create the slot if it does not exist")
	flag.StringVar(&c.out, "out", "changes.jsonl", "output file (appended to; its position file is OUT.pos)")
	kind := flag.String("format", "txn", "output format: txn or debezium")
	flag.Parse()
	if c.dsn == "" || c.slot == "" || *pub == "" {
		flag.Usage()
		os.Exit(2)
	}
	c.publications = strings.Split(*pub, ",")
	c.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	k, err := format.ParseKind(*kind)
	if err != nil {
		c.log.Error("bad -format", "err", err)
		os.Exit(2)
	}
	c.format = k
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil && ctx.Err() == nil {
		c.log.Error("stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) (err error) {
	out, err := format.OpenFile(c.out, format.Config{Kind: c.format})
	if err != nil {
		return err
	}
	defer out.Close()
	s, err := replication.Start(ctx, replication.Config{
		ConnString:   c.dsn,
		Slot:         c.slot,
		Publications: c.publications,
		CreateSlot:   c.createSlot,
		Messages:     true,
		Buffer:       reorderbuffer.Config{SkipThrough: out.Resume()},
		Logger:       c.log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := s.Close(context.WithoutCancel(ctx)); err == nil {
			err = cerr
		}
	}()
	for {
		t, err := s.Next(ctx)
		if err != nil {
			return err
		}
		// 1. write, fsync and record the position  2. acknowledge: never the other way round.
		if err := out.WriteTxn(t); err != nil {
			return err
		}
		if c.afterWrite != nil {
			if err := c.afterWrite(t); err != nil {
				return err
			}
		}
		if err := s.Ack(t); err != nil {
			return err
		}
	}
}
