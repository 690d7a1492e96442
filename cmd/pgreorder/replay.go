package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spillcompress"
)

func init() {
	register("replay", "reorder a capture file and print committed transactions as JSON lines", runReplay)
}

// workMemHelp describes -work-mem in both commands.
const workMemHelp = "memory limit for transaction data: a size with a unit (64kB, 4MB, 1GB; " +
	"a bare number is in kB, as in postgresql.conf), none (spill every transaction to disk) or unlimited"

// spillCompressionHelp describes -spill-compression in both commands.
const spillCompressionHelp = "compression of spill files: none, s2 (a quarter to a fifth of the bytes), lz4 or zstd"

// parseSpillCompression parses -spill-compression.
func parseSpillCompression(s string) (spill.Compressor, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "lz4":
		return spillcompress.LZ4(), nil
	case "s2":
		return spillcompress.S2(), nil
	case "zstd":
		return spillcompress.Zstd(), nil
	case "none", "off", "":
		return nil, nil
	}
	return nil, fmt.Errorf("-spill-compression %q: want none (the default), s2, lz4 or zstd", s)
}

// parseWorkMem parses -work-mem as reorderbuffer.ParseWorkMem does (a size of 0 is refused:
// it is easy to mean either "no limit" or "nothing in memory" by it; "none" says the latter),
// naming the flag in errors.
func parseWorkMem(s string) (int64, error) {
	v, err := reorderbuffer.ParseWorkMem(s)
	if err != nil {
		return 0, fmt.Errorf("-work-mem %q: %v; want a size with a unit (64kB, 4MB, 1GB; a bare number is in kB), "+
			"none (spill every transaction to disk) or unlimited", s, err)
	}
	return v, nil
}

// parseProto checks -proto: 0 (decide from the stream, or the highest the server speaks) or 1-4.
func parseProto(v int) error {
	if v < 0 || v > 4 {
		return fmt.Errorf("-proto %d: valid values are 1-4 (pgoutput protocol versions), or 0 for the default", v)
	}
	return nil
}

// outputFlags are the flags that choose the output format, shared by replay and stream.
type outputFlags struct {
	format, server, database string
	values                   valueFlags
}

func (o *outputFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.format, "format", "txn", "output format: txn (one JSON object per transaction) or "+
		"debezium (one Debezium-style change event per change, typed values); see docs/formats.md")
	fs.StringVar(&o.server, "source-name", "pgreorder", "debezium format: source.name, the logical name of the source server")
	fs.StringVar(&o.database, "source-db", "", "debezium format: source.db, the source database's name")
	o.values.register(fs, "debezium format: ")
}

func (o *outputFlags) config() (format.Config, error) {
	kind, err := format.ParseKind(o.format)
	if err != nil {
		return format.Config{}, fmt.Errorf("-format: %w", err)
	}
	cfg := format.Config{Kind: kind, Server: o.server, Database: o.database, Version: shortVersion()}
	if err := o.values.apply(&cfg); err != nil {
		return format.Config{}, err
	}
	return cfg, nil
}

// valueFlags choose how Debezium events write numeric and interval values.
type valueFlags struct {
	decimal, interval string
}

func (v *valueFlags) register(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&v.decimal, "decimal-handling", "precise", prefix+"numeric values: precise (Kafka Connect's Decimal, as Debezium), "+
		"string (PostgreSQL's text) or double")
	fs.StringVar(&v.interval, "interval-handling", "numeric", prefix+"interval values: numeric (microseconds, as Debezium) or string (ISO 8601)")
}

func (v *valueFlags) apply(cfg *format.Config) error {
	d, err := format.ParseDecimalHandling(v.decimal)
	if err != nil {
		return fmt.Errorf("-decimal-handling %q: valid values are precise, string and double", v.decimal)
	}
	i, err := format.ParseIntervalHandling(v.interval)
	if err != nil {
		return fmt.Errorf("-interval-handling %q: valid values are numeric and string", v.interval)
	}
	cfg.Decimal, cfg.Interval = d, i
	return nil
}

func runReplay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	workMem := fs.String("work-mem", "64MB", workMemHelp)
	dir := fs.String("spill-dir", "", "directory for spill files (default: the system temp dir)")
	compression := fs.String("spill-compression", "none", spillCompressionHelp)
	proto := fs.Int("proto", 0, "protocol version the capture was made with, 1-4 (0 = accept 1-4)")
	var out outputFlags
	out.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: pgreorder replay [flags] FILE\n\n"+
			"Reads a capture (lsn<TAB>xid<TAB>hex per line, as written by pgreorder record, plain or\n"+
			"gzip-compressed; - for stdin), reorders it and prints the committed transactions as JSON lines\n"+
			"on stdout (-format), statistics on stderr.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() == 0:
		return errors.New("missing FILE: the capture to replay (- for stdin); see pgreorder replay -h")
	case fs.NArg() > 1:
		return fmt.Errorf("one FILE expected, got %d: %s", fs.NArg(), strings.Join(fs.Args(), " "))
	}
	limit, err := parseWorkMem(*workMem)
	if err != nil {
		return err
	}
	if err := parseProto(*proto); err != nil {
		return err
	}
	comp, err := parseSpillCompression(*compression)
	if err != nil {
		return err
	}
	cfg, err := out.config()
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
	bw := bufio.NewWriterSize(os.Stdout, 64<<10)
	stats, err := replay(ctx, in, bw, reorderbuffer.Config{
		WorkMem:         limit,
		Dir:             *dir,
		Decoding:        decoding.Options{ProtoVersion: *proto},
		SpillCompressor: comp,
	}, cfg)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	fmt.Fprintf(os.Stderr, "%s\n", formatStats(stats))
	return err
}

// replay feeds a capture (plain or gzip) through a Buffer and writes the committed transactions
// in the format out names.
func replay(ctx context.Context, in io.Reader, out io.Writer, cfg reorderbuffer.Config, fc format.Config) (reorderbuffer.Stats, error) {
	buf, err := reorderbuffer.New(cfg)
	if err != nil {
		return reorderbuffer.Stats{}, err
	}
	defer buf.Close()
	if fc.TempDir == "" {
		fc.TempDir = cfg.Dir
	}
	w := format.NewWriter(out, fc)
	defer w.Close()
	r := capture.NewReader(in)
	drain := func() error {
		for x, ok := buf.Next(); ok; x, ok = buf.Next() {
			if err := w.WriteTxn(x); err != nil {
				return err
			}
			if err := buf.Ack(x); err != nil {
				return err
			}
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
		r.Release() // Add copied what it keeps
		if err := drain(); err != nil {
			return buf.Stats(), fmt.Errorf("line %d: %w", r.Line(), err)
		}
	}
	return buf.Stats(), drain()
}

func formatStats(s reorderbuffer.Stats) string {
	return fmt.Sprintf("stats: total_txns=%d total_bytes=%d stream_txns=%d stream_count=%d stream_bytes=%d "+
		"spill_txns=%d spill_count=%d spill_bytes=%d spill_written_bytes=%d peak_memory_bytes=%d aborted_txns=%d aborted_subxacts=%d open_txns=%d",
		s.TotalTxns, s.TotalBytes, s.StreamTxns, s.StreamCount, s.StreamBytes,
		s.SpillTxns, s.SpillCount, s.SpillBytes, s.SpillWrittenBytes, s.PeakMemoryBytes, s.AbortedTxns, s.AbortedSubxacts, s.OpenTxns)
}
