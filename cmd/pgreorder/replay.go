package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/capture"
	"github.com/pgreorder/pgreorder/internal/jsonl"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

func init() {
	register("replay", "reorder a capture file and print committed transactions as JSON lines", runReplay)
}

func runReplay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	workMem := fs.String("work-mem", "64MB", "memory limit for transaction data (kB, MB, GB; 0 = spill everything; unlimited)")
	dir := fs.String("spill-dir", "", "directory for spill files (default: the system temp dir)")
	proto := fs.Int("proto", 0, "protocol version the capture was made with (0 = accept 1-4)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: pgreorder replay [flags] FILE\n\n"+
			"Reads a capture (lsn<TAB>xid<TAB>hex per line, as written by pgreorder record; - for stdin),\n"+
			"reorders it and prints one JSON object per committed transaction on stdout,\n"+
			"statistics on stderr.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return flag.ErrHelp
	}
	limit, err := reorderbuffer.ParseWorkMem(*workMem)
	if err != nil {
		return err
	}
	var in io.Reader = os.Stdin
	if name := fs.Arg(0); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	out := bufio.NewWriterSize(os.Stdout, 64<<10)
	stats, err := replay(ctx, in, out, reorderbuffer.Config{
		WorkMem:  limit,
		Dir:      *dir,
		Decoding: decoding.Options{ProtoVersion: *proto},
	})
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	fmt.Fprintf(os.Stderr, "%s\n", formatStats(stats))
	return err
}

// replay feeds a capture through a Buffer and writes the committed transactions as JSON lines.
func replay(ctx context.Context, in io.Reader, out io.Writer, cfg reorderbuffer.Config) (reorderbuffer.Stats, error) {
	buf, err := reorderbuffer.New(cfg)
	if err != nil {
		return reorderbuffer.Stats{}, err
	}
	defer buf.Close()
	w := jsonl.NewWriter(out)
	r := capture.NewReader(in)
	drain := func() error {
		for x, ok := buf.Next(); ok; x, ok = buf.Next() {
			if err := w.WriteTxn(x); err != nil {
				return err
			}
			buf.Ack(x)
		}
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return buf.Stats(), err
		}
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return buf.Stats(), err
		}
		if err := buf.Add(rec.LSN, rec.Data); err != nil {
			return buf.Stats(), fmt.Errorf("line %d: %w", r.Line(), err)
		}
		if err := drain(); err != nil {
			return buf.Stats(), fmt.Errorf("line %d: %w", r.Line(), err)
		}
	}
	return buf.Stats(), drain()
}

func formatStats(s reorderbuffer.Stats) string {
	return fmt.Sprintf("stats: total_txns=%d total_bytes=%d stream_txns=%d stream_count=%d stream_bytes=%d "+
		"spill_txns=%d spill_count=%d spill_bytes=%d peak_memory_bytes=%d aborted_txns=%d aborted_subxacts=%d open_txns=%d",
		s.TotalTxns, s.TotalBytes, s.StreamTxns, s.StreamCount, s.StreamBytes,
		s.SpillTxns, s.SpillCount, s.SpillBytes, s.PeakMemoryBytes, s.AbortedTxns, s.AbortedSubxacts, s.OpenTxns)
}
