package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
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
	resume, output                             string
	status                                     time.Duration
	verbose                                    bool
	out                                        outputFlags
}

const streamUsage = `usage: pgreorder stream -dsn DSN -slot NAME -publication NAME [flags]

Streams the committed transactions of a logical replication slot as JSON lines (-format) on stdout,
or durably to a file (-o), acknowledging each once it is written. Progress goes to stderr; Ctrl-C
stops.

On stdout each transaction is written whole (staged first), flushed, then acknowledged. If the
process is killed while writing and stdout is a file, the file can end in a torn line (no final
newline); cut it before appending again, and resume after the end_lsn of the last line:

    [ -n "$(tail -c 1 F)" ] && truncate -s -"$(tail -n 1 F | wc -c)" F

With -o FILE that is done for you: each transaction is written, fsynced and recorded (FILE.pos:
the file's length and the transaction's end LSN, replaced atomically) before it is acknowledged;
a restart with the same -o cuts FILE back to the recorded length (a torn or unrecorded last
transaction, which the server sends again) and resumes after the recorded LSN.

flags:
`

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
	fs.StringVar(&f.workMem, "work-mem", "64MB", workMemHelp)
	fs.StringVar(&f.dir, "spill-dir", "", "spill directory (default: the system temporary directory)")
	fs.StringVar(&f.streaming, "streaming", "", `pgoutput streaming: off, on or parallel (default: the best the server has)`)
	fs.IntVar(&f.proto, "proto", 0, "pgoutput proto_version, 1-4 (default: the highest the server speaks)")
	fs.BoolVar(&f.messages, "messages", true, "receive logical decoding messages")
	fs.BoolVar(&f.binary, "binary", false, "binary column values")
	fs.BoolVar(&f.twoPhase, "two-phase", false, "decode prepared transactions at PREPARE (turns two-phase on for the slot for good)")
	fs.StringVar(&f.origin, "origin", "", `origin filter: "any" or "none" (PostgreSQL 16+)`)
	fs.StringVar(&f.resume, "resume", "", "end LSN (X/X) of the last transaction already handled: start after it (not with -o)")
	fs.StringVar(&f.output, "o", "", "write durably to this file instead of stdout, and resume from it (see above)")
	fs.DurationVar(&f.status, "status-interval", replication.DefaultStatusInterval, "longest time between standby status updates")
	fs.BoolVar(&f.verbose, "v", false, "debug logging")
	f.out.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), streamUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := f.check(fs); err != nil {
		return err
	}
	workMem, err := parseWorkMem(f.workMem)
	if err != nil {
		return err
	}
	cfg, err := f.out.config()
	if err != nil {
		return err
	}
	var skip decoding.LSN
	if f.resume != "" {
		if skip, err = decoding.ParseLSN(f.resume); err != nil {
			return fmt.Errorf("-resume %q: want an LSN as PostgreSQL prints it, such as 0/16B3748", f.resume)
		}
	}
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	// The output: stdout, or a durable file that also gives the resume position.
	var write func(*reorderbuffer.Txn) error
	if f.output != "" {
		if cfg.TempDir == "" {
			cfg.TempDir = f.dir
		}
		file, err := format.OpenFile(f.output, cfg)
		if err != nil {
			return err
		}
		defer file.Close()
		skip = file.Resume()
		log.Info("output", "file", f.output, "bytes", file.Offset(), "resume_after", skip)
		write = file.WriteTxn
	} else {
		cfg.TempDir = f.dir
		w := format.NewWriter(os.Stdout, cfg)
		defer w.Close()
		write = w.WriteTxn
	}

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
	var txns int
	lastReport := time.Now()
	stop := func(err error) error {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		cerr := s.Close(closeCtx)
		cancel()
		logStreamStats(log, s, txns)
		log.Info("stopped", "acked", s.Position().Acked)
		return errors.Join(err, cerr)
	}
	for {
		t, err := s.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				err = nil // Ctrl-C: a clean stop
			}
			return stop(err)
		}
		// Written (flushed to stdout, or fsynced and recorded) before it is acknowledged: whatever
		// reads the output has it before the slot moves on.
		if err := write(t); err != nil {
			return stop(err)
		}
		if err := s.Ack(t); err != nil {
			return stop(err)
		}
		txns++
		if time.Since(lastReport) >= 30*time.Second {
			logStreamStats(log, s, txns)
			lastReport = time.Now()
		}
	}
}

// check reports missing and invalid flags, naming them and their valid values.
func (f *streamFlags) check(fs *flag.FlagSet) error {
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %s (every option is a flag; see pgreorder stream -h)", strings.Join(fs.Args(), " "))
	}
	var missing []string
	for _, m := range []struct {
		name  string
		unset bool
	}{{"-dsn", f.dsn == ""}, {"-slot", f.slot == ""}, {"-publication", len(f.publications) == 0}} {
		if m.unset {
			missing = append(missing, m.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (see pgreorder stream -h)", strings.Join(missing, ", "))
	}
	if err := parseProto(f.proto); err != nil {
		return err
	}
	switch f.streaming {
	case "", replication.StreamingOff, replication.StreamingOn, replication.StreamingParallel:
	default:
		return fmt.Errorf("-streaming %q: valid values are off, on and parallel", f.streaming)
	}
	switch f.origin {
	case "", "any", "none":
	default:
		return fmt.Errorf("-origin %q: valid values are any and none", f.origin)
	}
	if f.output != "" && f.resume != "" {
		return errors.New("-resume and -o both give the resume position: with -o it is read from the file's position file")
	}
	if f.temporary && !f.createSlot {
		return errors.New("-temporary needs -create-slot (it says how to create the slot)")
	}
	return nil
}

func logStreamStats(log *slog.Logger, s *replication.Stream, txns int) {
	st := s.Stats()
	p := s.Position()
	log.Info("progress", "transactions", txns, "received", p.Received, "acked", p.Acked, "flushed", p.Flushed,
		"spill_txns", st.SpillTxns, "spill_bytes", st.SpillBytes, "stream_txns", st.StreamTxns,
		"stream_bytes", st.StreamBytes, "total_txns", st.TotalTxns, "total_bytes", st.TotalBytes,
		"memory_bytes", st.MemoryBytes, "peak_memory_bytes", st.PeakMemoryBytes)
}
