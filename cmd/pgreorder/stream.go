package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
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
	workMem, err := parseWorkMem(f.workMem)
	if err != nil {
		return err
	}
	var skip decoding.LSN
	if f.resume != "" {
		if skip, err = parseLSN(f.resume); err != nil {
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
	enc := newTxnEncoder()
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
		if err := enc.write(out, t); err != nil {
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

// parseLSN parses X/X.
func parseLSN(s string) (decoding.LSN, error) {
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, fmt.Errorf("invalid LSN %q", s)
	}
	return decoding.LSN(uint64(hi)<<32 | uint64(lo)), nil
}

// parseWorkMem parses a memory size as PostgreSQL writes it: a number with an optional unit B, kB,
// MB, GB or TB (powers of 1024); "0" means spill everything.
func parseWorkMem(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	mult := map[string]int64{"": 1, "B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}[strings.TrimSpace(t[i:])]
	if mult == 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("invalid size %q (units: B, kB, MB, GB, TB)", s)
	}
	if n == 0 {
		return reorderbuffer.SpillEverything, nil
	}
	return n * mult, nil
}

// txnEncoder writes committed transactions in the JSON-lines format of `pgreorder replay`.
// TODO(lead's JSON package): swap for the shared renderer once it lands, so both commands print
// byte-identical lines.
type txnEncoder struct {
	rels map[uint32]*decoding.Relation
	b    []byte
}

func newTxnEncoder() *txnEncoder { return &txnEncoder{rels: map[uint32]*decoding.Relation{}} }

func (e *txnEncoder) write(w *bufio.Writer, t *reorderbuffer.Txn) error {
	b := e.b[:0]
	if t.NonTransactional {
		for m, err := range t.Changes() {
			if err != nil {
				return err
			}
			if lm, ok := m.(*decoding.LogicalMessage); ok {
				b = append(b, `{"op":"message","transactional":false,"lsn":"`...)
				b = append(b, lm.LSN.String()...)
				b = append(b, `","prefix":`...)
				b = appendJSONString(b, lm.Prefix)
				b = append(b, `,"content":"`...)
				b = base64.StdEncoding.AppendEncode(b, lm.Content)
				b = append(b, "\"}\n"...)
			}
		}
		e.b = b
		_, err := w.Write(b)
		return err
	}
	b = append(b, `{"xid":`...)
	b = strconv.AppendUint(b, uint64(t.Xid), 10)
	b = append(b, `,"commit_lsn":"`...)
	b = append(b, t.CommitLSN.String()...)
	b = append(b, `","end_lsn":"`...)
	b = append(b, t.EndLSN.String()...)
	b = append(b, `","commit_time":"`...)
	b = t.CommitTime.AppendFormat(b, "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, '"')
	if t.GID != "" {
		b = append(b, `,"gid":`...)
		b = appendJSONString(b, t.GID)
	}
	b = append(b, `,"changes":[`...)
	first := true
	sep := func() {
		if !first {
			b = append(b, ',')
		}
		first = false
	}
	for m, err := range t.Changes() {
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *decoding.Relation:
			r := *m
			r.Columns = append([]decoding.RelationColumn(nil), m.Columns...)
			e.rels[m.RelationID] = &r
		case *decoding.Insert:
			sep()
			b = append(b, `{"op":"insert","relation":`...)
			b = e.appendRel(b, m.RelationID)
			b = append(b, `,"new":`...)
			b = e.appendTuple(b, m.RelationID, m.New)
			b = append(b, '}')
		case *decoding.Update:
			sep()
			b = append(b, `{"op":"update","relation":`...)
			b = e.appendRel(b, m.RelationID)
			if m.OldKind != 0 {
				b = append(b, `,"old":`...)
				b = e.appendTuple(b, m.RelationID, m.Old)
			}
			b = append(b, `,"new":`...)
			b = e.appendTuple(b, m.RelationID, m.New)
			b = append(b, '}')
		case *decoding.Delete:
			sep()
			b = append(b, `{"op":"delete","relation":`...)
			b = e.appendRel(b, m.RelationID)
			b = append(b, `,"old":`...)
			b = e.appendTuple(b, m.RelationID, m.Old)
			b = append(b, '}')
		case *decoding.Truncate:
			sep()
			b = append(b, `{"op":"truncate","relations":[`...)
			for i, id := range m.RelationIDs {
				if i > 0 {
					b = append(b, ',')
				}
				b = e.appendRel(b, id)
			}
			b = append(b, `],"cascade":`...)
			b = strconv.AppendBool(b, m.Options&decoding.TruncateCascade != 0)
			b = append(b, `,"restart_identity":`...)
			b = strconv.AppendBool(b, m.Options&decoding.TruncateRestartIdentity != 0)
			b = append(b, '}')
		case *decoding.LogicalMessage:
			sep()
			b = append(b, `{"op":"message","transactional":true,"prefix":`...)
			b = appendJSONString(b, m.Prefix)
			b = append(b, `,"content":"`...)
			b = base64.StdEncoding.AppendEncode(b, m.Content)
			b = append(b, `"}`...)
		}
	}
	b = append(b, "]}\n"...)
	e.b = b
	_, err := w.Write(b)
	return err
}

func (e *txnEncoder) appendRel(b []byte, id uint32) []byte {
	r, ok := e.rels[id]
	if !ok {
		return appendJSONString(b, fmt.Sprintf("relation %d", id))
	}
	ns := r.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	return appendJSONString(b, ns+"."+r.Name)
}

func (e *txnEncoder) appendTuple(b []byte, id uint32, tup decoding.Tuple) []byte {
	r := e.rels[id]
	b = append(b, '{')
	for i, c := range tup {
		if i > 0 {
			b = append(b, ',')
		}
		name := fmt.Sprintf("column%d", i+1)
		if r != nil && i < len(r.Columns) {
			name = r.Columns[i].Name
		}
		b = appendJSONString(b, name)
		b = append(b, ':')
		switch c.Kind {
		case decoding.ColumnNull:
			b = append(b, "null"...)
		case decoding.ColumnUnchanged:
			b = append(b, `{"unchanged_toast":true}`...)
		case decoding.ColumnBinary:
			b = append(b, `{"binary":"`...)
			b = base64.StdEncoding.AppendEncode(b, c.Data)
			b = append(b, `"}`...)
		default:
			b = appendJSONString(b, string(c.Data))
		}
	}
	return append(b, '}')
}

func appendJSONString(b []byte, s string) []byte {
	j, _ := json.Marshal(s)
	return append(b, j...)
}
