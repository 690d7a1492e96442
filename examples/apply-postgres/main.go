// Command apply-postgres replicates a publication into another PostgreSQL database with package
// apply: each source transaction is applied in one target transaction that also records its end
// LSN in a progress table, acknowledged to the source only after that commit, and resumed from the
// progress table after a crash or a dropped connection, without loss or duplicates.
//
//	apply-postgres -source 'host=... dbname=src' -target 'host=... dbname=dst' -slot app -publication pub -create-slot
//
// The target's tables must exist with the same names and columns. -mode eager applies large
// transactions while they run on the source; -mode parallel also applies small ones on several
// connections at once. The pgreorder command's apply subcommand is the full-featured version.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "apply-postgres:", err)
		os.Exit(1)
	}
}

// run parses the flags and replicates until ctx is done (a clean stop: nil) or a change cannot be
// applied.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("apply-postgres", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg apply.Config
	fs.StringVar(&cfg.Source.ConnString, "source", "", "source database connection string")
	fs.StringVar(&cfg.Target, "target", "", "target database connection string")
	fs.StringVar(&cfg.Source.Slot, "slot", "", "replication slot on the source")
	pubs := fs.String("publication", "", "publication(s) on the source, comma-separated")
	fs.BoolVar(&cfg.Source.CreateSlot, "create-slot", false, "create the slot if it does not exist")
	mode := fs.String("mode", "buffered", "buffered, eager or parallel")
	fs.IntVar(&cfg.Workers, "workers", 0, "worker connections (eager, parallel)")
	workMem := fs.String("work-mem", "64MB", "memory for transaction data (64kB, 16MB, ...)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pubs != "" {
		cfg.Source.Publications = strings.Split(*pubs, ",")
	}
	var err error
	if cfg.Mode, err = apply.ParseMode(*mode); err != nil {
		return err
	}
	if cfg.Source.Buffer.WorkMem, err = reorderbuffer.ParseWorkMem(*workMem); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	err = apply.Run(ctx, cfg)
	if errors.Is(err, apply.ErrInvalidConfig) {
		fs.Usage()
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}
