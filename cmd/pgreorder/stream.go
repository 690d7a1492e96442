package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func init() {
	register("stream", "stream a live slot as JSON lines", runStream)
}

// streamFlags are the flags of `pgreorder stream`.
type streamFlags struct {
	sourceFlags   // -source, -slot, -publication
	spillFlags    // -work-mem, -spill-dir, -spill-compression
	pgoutputFlags // -streaming, -proto, -messages, -binary, -two-phase, -origin-filter
	monitorFlags  // -status-interval, -progress, -metrics-addr, -v

	createSlot, temporary  bool
	resume, output         string
	slotWait, startTimeout time.Duration
	fileMode               iofs.FileMode
	streamingOpt           replication.Streaming    // -streaming, parsed by check
	originFilterOpt        replication.OriginFilter // -origin-filter, parsed by check
	out                    outputFlags
}

// register defines the flags of stream.
func (f *streamFlags) register(fs *flag.FlagSet) {
	f.sourceFlags.register(fs, "logical replication slot (pgoutput)")
	fs.BoolVar(&f.createSlot, "create-slot", false, "create the slot if it does not exist")
	fs.BoolVar(&f.temporary, "temporary", false, "with -create-slot: make it a temporary slot, dropped at exit")
	f.spillFlags.register(fs)
	f.pgoutputFlags.register(fs, "receive logical decoding messages",
		"decode prepared transactions at PREPARE (turns two-phase on for the slot for good)")
	fs.StringVar(&f.resume, "resume", "", "end LSN (X/X) of the last transaction already handled: start after it (not with -o)")
	fs.StringVar(&f.output, "o", "", "write durably to this file instead of stdout, and resume from it (see above)")
	f.fileMode = changefeed.DefaultFileMode
	fs.Func("file-mode", "with -o, permissions of FILE and FILE.pos when created, in octal, less the umask (default 0600)", func(s string) error {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m == 0 || m > 0o777 {
			return fmt.Errorf("want permissions in octal, such as 0600 or 0640")
		}
		f.fileMode = iofs.FileMode(m)
		return nil
	})
	f.monitorFlags.register(fs, replication.DefaultStatusInterval)
	durationVar(fs, &f.slotWait, "slot-wait", replication.DefaultSlotWait, "how long to wait for another connection "+
		"streaming from the slot (a running consumer, or the walsender of one that died) before stopping with an error naming it (0: do not wait; -1: no limit)")
	startTimeoutVar(fs, &f.startTimeout, "stream", "the source")
	f.out.register(fs)
}

const streamUsage = `usage: pgreorder stream -source DSN -slot NAME -publication NAME [flags]

Streams the committed transactions of a logical replication slot as JSON lines (-format) on stdout,
or durably to a file (-o), acknowledging each once it is written. Progress goes to stderr (one line
every -progress while there is something to report: received, acknowledged, lag, rates, memory,
spilled); with -metrics-addr, Prometheus metrics are served on http://ADDR/metrics. Ctrl-C stops.

On stdout each transaction is written whole (staged first), flushed, then acknowledged. If the
process is killed while writing and stdout is a file, the file can end in a torn line (no final
newline); cut it before appending again, and resume after the end_lsn of the last line:

    [ -n "$(tail -c 1 F)" ] && truncate -s -"$(tail -n 1 F | wc -c)" F

With -o FILE that is done for you, exactly once: each transaction is written and fsynced, and only
then its position stored (FILE.pos: the slot, the server's system identifier, the transaction's end
LSN and FILE's length, replaced atomically) and the transaction acknowledged; a restart with the
same -o cuts FILE back to the stored length (a torn or unstored last transaction, which the server
sends again) and resumes after the stored LSN, and refuses a FILE.pos of another server or of a
slot that is gone. FILE and FILE.pos are created readable by their owner only (-file-mode), and
never through a symbolic link: in a directory other users may write to, a link or another user's
file under either name stops the command instead of being written through.

Passwords: a password in a connection string on the command line is visible to every local user
(ps, /proc). Give it in the PGPASSWORD environment variable or in a password file (~/.pgpass, or
PGPASSFILE / passfile=FILE) instead. Messages print connection strings with passwords as xxxxx.
Flags, the most used first:
`

func runStream(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	var f streamFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), streamUsage)
		printFlags(fs.Output(), fs, streamGroups)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := f.check(fs); err != nil {
		return err
	}
	workMem, err := parseWorkMem(f.workMem)
	if err != nil {
		return err
	}
	comp, err := parseSpillCompression(f.compression)
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

	// The output: stdout (the slot is the only position: at least once), or a file that is its
	// own position store (exactly once).
	var (
		store changefeed.Store = changefeed.SlotStore{}
		write func(ctx context.Context, b *changefeed.Batch) error
		txns  int
	)
	if f.output != "" {
		if cfg.TempDir == "" {
			cfg.TempDir = f.dir
		}
		out, err := changefeed.OpenJSONLines(f.output, changefeed.JSONLinesConfig{Format: cfg, FileMode: f.fileMode})
		if err != nil {
			return err
		}
		store, write = out, out.Handle
		log.Info("output", "file", f.output)
	} else {
		cfg.TempDir = f.dir
		w := format.NewWriter(os.Stdout, cfg)
		defer w.Close()
		write = func(_ context.Context, b *changefeed.Batch) error { return w.WriteTxn(b.Txn) }
	}
	feed, err := changefeed.New(changefeed.Config{
		Start: changefeed.StartStream,
		Replication: replication.Config{
			ConnString:     f.source,
			Slot:           f.slot,
			Publications:   f.publications,
			CreateSlot:     f.createSlot,
			TemporarySlot:  f.temporary,
			Failover:       f.failover,
			ProtoVersion:   f.proto,
			Streaming:      f.streamingOpt,
			Binary:         f.binary,
			Messages:       f.messages,
			TwoPhase:       f.twoPhase,
			OriginFilter:   f.originFilterOpt,
			StatusInterval: f.status,
			Reconnect:      replication.ReconnectPolicy{SlotWait: cliSlotWait(f.slotWait)},
			Buffer:         reorderbuffer.Config{WorkMem: workMem, Dir: f.dir, SkipThrough: skip, SpillCompressor: comp},
		},
		Logger:       log,
		StartTimeout: cliSlotWait(f.startTimeout),
	}, store, func(ctx context.Context, b *changefeed.Batch) error {
		if b.Kind == changefeed.Transaction || f.output != "" {
			// Written (flushed to stdout, or fsynced, then its position stored) before it is
			// acknowledged: whatever reads the output has it before the slot moves on.
			if err := write(ctx, b); err != nil {
				return err
			}
		}
		if b.Kind == changefeed.Transaction {
			txns++
		}
		return nil
	})
	if err != nil {
		store.Close()
		return err
	}
	stopMonitoring, err := monitor(feed, f.metricsAddr, f.progress, log, nil)
	if err != nil {
		store.Close()
		return err
	}
	err = feed.Run(ctx)
	if ctx.Err() != nil {
		err = nil // Ctrl-C: a clean stop
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	merr := stopMonitoring(closeCtx)
	cancel()
	if feed.Progress().Start != 0 { // it streamed: what it did
		logStreamStats(log, feed, txns)
		log.Info("stopped", "acked", feed.Progress().Acked)
	}
	return errors.Join(err, merr)
}

// monitor starts the metrics server (-metrics-addr) and the progress line (-progress), and
// returns what stops both. kafka, when not nil, is served beside the stream's metrics.
func monitor(s metrics.Source, metricsAddr string, progress time.Duration, log *slog.Logger,
	kafka *metrics.KafkaCollector) (stop func(context.Context) error, err error) {
	if metricsAddr == "" && progress <= 0 {
		return func(context.Context) error { return nil }, nil
	}
	c, err := metrics.New(s, metrics.Options{})
	if err != nil {
		return nil, err
	}
	var srv *metrics.Server
	if metricsAddr != "" {
		h, err := metrics.Handler(c)
		if kafka != nil {
			h, err = metrics.Handler(c, kafka)
		}
		if err != nil {
			return nil, err
		}
		if srv, err = metrics.Listen(metricsAddr, h); err != nil {
			return nil, fmt.Errorf("-metrics-addr: %w", err)
		}
		log.Info("serving metrics", "url", "http://"+srv.Addr()+"/metrics")
	}
	return monitoring(srv, progress, func(done <-chan struct{}) {
		printProgress(done, os.Stderr, progress, c.Reading)
	}), nil
}

// monitoring runs print (the progress line) in a goroutine of its own when progress is set, and
// returns what stops it and then srv (the metrics server, if any).
func monitoring(srv *metrics.Server, progress time.Duration, print func(done <-chan struct{})) func(context.Context) error {
	done := make(chan struct{})
	finished := make(chan struct{})
	if progress > 0 {
		go func() {
			defer close(finished)
			print(done)
		}()
	} else {
		close(finished)
	}
	return func(ctx context.Context) error {
		close(done)
		<-finished
		if srv != nil {
			return srv.Close(ctx)
		}
		return nil
	}
}

// printProgress writes a progress line to w every interval until done is closed, when there is
// something to report: the counters moved since the last line, or the stream is not caught up (a
// lag that grows, a consumer or connection that is stuck). An idle stream that is caught up
// prints nothing after the line that says so.
func printProgress(done <-chan struct{}, w io.Writer, every time.Duration, read func() metrics.Reading) {
	t := time.NewTicker(every)
	defer t.Stop()
	var last metrics.Reading
	printed := false
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		rd := read()
		if printed && !progressed(last, rd) {
			continue
		}
		fmt.Fprintf(w, "%s %s\n", rd.Time.Format(time.TimeOnly), rd)
		last, printed = rd, true
	}
}

// progressed reports whether cur is worth a progress line after prev was printed.
func progressed(prev, cur metrics.Reading) bool {
	p, c := prev.Stats, cur.Stats
	return !cur.Activity.CaughtUp || !prev.Activity.CaughtUp ||
		c.TotalTxns != p.TotalTxns || c.TotalChanges != p.TotalChanges || c.SpillBytes != p.SpillBytes ||
		c.SpillBytesNow != p.SpillBytesNow || cur.Activity.Acked != prev.Activity.Acked ||
		cur.LagBytes != prev.LagBytes || cur.Reconnects != prev.Reconnects
}

// check reports missing and invalid flags, naming them and their valid values.
func (f *streamFlags) check(fs *flag.FlagSet) error {
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %s (every option is a flag; see pgreorder stream -h)", strings.Join(fs.Args(), " "))
	}
	if missing := f.sourceFlags.missing(); len(missing) > 0 {
		return fmt.Errorf("missing %s (see pgreorder stream -h)", strings.Join(missing, ", "))
	}
	var err error
	if f.streamingOpt, f.originFilterOpt, err = f.pgoutputFlags.parse(); err != nil {
		return err
	}
	if f.output != "" && f.resume != "" {
		return errors.New("-resume and -o both give the resume position: with -o it is read from the file's position file")
	}
	if err := f.monitorFlags.check(); err != nil {
		return err
	}
	if f.temporary && f.output != "" {
		return errors.New("-temporary and -o: FILE.pos would keep a position of a slot the server drops at exit; " +
			"drop -temporary to resume from FILE, or -o to stream a temporary slot to stdout")
	}
	if f.temporary && !f.createSlot {
		return errors.New("-temporary needs -create-slot (it says how to create the slot)")
	}
	return nil
}

func logStreamStats(log *slog.Logger, s interface {
	Stats() reorderbuffer.Stats
	Progress() replication.Progress
}, txns int) {
	log.Info("progress", streamStatsAttrs(s.Stats(), s.Progress(), txns)...)
}

// streamStatsAttrs are the attributes of the final progress line of stream.
func streamStatsAttrs(st reorderbuffer.Stats, p replication.Progress, txns int) []any {
	return []any{"transactions", txns, "received", p.Received, "acked", p.Acked, "flushed", p.Flushed,
		"spill_txns", st.SpillTxns, "spill_bytes", st.SpillBytes, "stream_txns", st.StreamTxns,
		"stream_bytes", st.StreamBytes, "total_txns", st.TotalTxns, "total_bytes", st.TotalBytes,
		"memory_bytes", st.MemoryBytes, "peak_memory_bytes", st.PeakMemoryBytes}
}
