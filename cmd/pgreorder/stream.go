package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/jsonl"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func init() {
	register("stream", "stream a live slot as JSON lines", runStream)
}

// streamFlags are the flags of `pgreorder stream`.
type streamFlags struct {
	dsn, slot, workMem, dir, streaming, origin string
	publications                               []string
	createSlot, temporary, messages, twoPhase  bool
	binary                                     bool
	proto                                      int
	resume                                     string
	status                                     time.Duration
	verbose                                    bool
}

func runStream(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	var f streamFlags
	fs.StringVar(&f.dsn, "dsn", "", "connection string of the source database (replication=database is added)")
	fs.StringVar(&f.slot, "slot", "", "logical replication slot (pgoutput)")
	fs.Func("publication", "publication to stream (repeatable, or comma-separated)", func(s string) error {
		for p := range strings.SplitSeq(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				f.publications = append(f.publications, p)
			}
		}
		return nil
	})
	fs.BoolVar(&f.createSlot, "create-slot", false, "create the slot if it does not exist")
	fs.BoolVar(&f.temporary, "temporary", false, "with -create-slot: make it a temporary slot, dropped at exit")
	fs.StringVar(&f.workMem, "work-mem", "64MB", `memory limit of the reorder buffer ("64kB", "1MB", "0" spills everything)`)
	fs.StringVar(&f.dir, "spill-dir", "", "spill directory (default: the system temporary directory)")
	fs.StringVar(&f.streaming, "streaming", "", `pgoutput streaming: off, on or parallel (default: the best the server has)`)
	fs.IntVar(&f.proto, "proto", 0, "pgoutput proto_version (default: the highest the server speaks)")
	fs.BoolVar(&f.messages, "messages", true, "receive logical decoding messages")
	fs.BoolVar(&f.binary, "binary", false, "binary column values")
	fs.BoolVar(&f.twoPhase, "two-phase", false, "decode prepared transactions at PREPARE (turns two-phase on for the slot for good)")
	fs.StringVar(&f.origin, "origin", "", `origin filter: "any" or "none" (PostgreSQL 16+)`)
	fs.StringVar(&f.resume, "resume", "", "end LSN (X/X) of the last transaction already handled: start after it")
	fs.DurationVar(&f.status, "status-interval", replication.DefaultStatusInterval, "longest time between standby status updates")
	fs.BoolVar(&f.verbose, "v", false, "debug logging")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: pgreorder stream -dsn DSN -slot NAME -publication NAME [flags]\n\n"+
			"Streams committed transactions of a logical replication slot as JSON lines on stdout (the format of\n"+
			"`pgreorder replay`), acknowledging each once it is written. Progress goes to stderr. Ctrl-C stops.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 || f.dsn == "" || f.slot == "" || len(f.publications) == 0 {
		fs.Usage()
		return flag.ErrHelp
	}
	workMem, err := reorderbuffer.ParseWorkMem(f.workMem)
	if err != nil {
		return err
	}
	var skip decoding.LSN
	if f.resume != "" {
		if skip, err = decoding.ParseLSN(f.resume); err != nil {
			return err
		}
	}
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	s, err := replication.Start(ctx, replication.Config{
		ConnString:     f.dsn,
		Slot:           f.slot,
		Publications:   f.publications,
		CreateSlot:     f.createSlot,
		TemporarySlot:  f.temporary,
		ProtoVersion:   f.proto,
		Streaming:      f.streaming,
		Binary:         f.binary,
		Messages:       f.messages,
		TwoPhase:       f.twoPhase,
		Origin:         f.origin,
		StatusInterval: f.status,
		Buffer:         reorderbuffer.Config{WorkMem: workMem, Dir: f.dir, SkipThrough: skip},
		Logger:         log,
	})
	if err != nil {
		return err
	}
	out := bufio.NewWriterSize(os.Stdout, 64<<10)
	enc := jsonl.NewWriter(out)
	var txns int
	lastReport := time.Now()
	for {
		t, err := s.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				err = nil // Ctrl-C: a clean stop
			}
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			cerr := s.Close(closeCtx)
			cancel()
			logStreamStats(log, s, txns)
			log.Info("stopped", "acknowledged", s.Position().Flushed)
			return errors.Join(err, cerr)
		}
		if err := enc.WriteTxn(t); err != nil {
			s.Close(context.WithoutCancel(ctx))
			return err
		}
		// Written means flushed to stdout: whatever reads it has it before the slot moves on.
		if err := out.Flush(); err != nil {
			s.Close(context.WithoutCancel(ctx))
			return err
		}
		s.Ack(t)
		txns++
		if time.Since(lastReport) >= 30*time.Second {
			logStreamStats(log, s, txns)
			lastReport = time.Now()
		}
	}
}

func logStreamStats(log *slog.Logger, s *replication.Stream, txns int) {
	st := s.Stats()
	p := s.Position()
	log.Info("progress", "transactions", txns, "received", p.Received, "flushed", p.Flushed,
		"spill_txns", st.SpillTxns, "spill_bytes", st.SpillBytes, "stream_txns", st.StreamTxns,
		"stream_bytes", st.StreamBytes, "total_txns", st.TotalTxns, "total_bytes", st.TotalBytes,
		"memory_bytes", st.MemoryBytes, "peak_memory_bytes", st.PeakMemoryBytes)
}
