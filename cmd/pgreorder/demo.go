package main

import (
	"bytes"
	"compress/gzip"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

func init() {
	register("demo", "run a workload on a throwaway server and show the reordered output", runDemo)
}

// demoCapture is a real capture of the demo workload (PostgreSQL 15, proto_version 2, streaming
// on, logical_decoding_work_mem 64kB, -rows 600), replayed when no server can be started. Remake it
// with `PGREORDER_PG_VERSIONS=15 pgreorder demo -rows 600 -record cmd/pgreorder/testdata/demo.capture.gz`.
//
//go:embed testdata/demo.capture.gz
var demoCapture []byte

// demoCaptureOptions are the decoding options the embedded capture was recorded with.
var demoCaptureOptions = decoding.Options{ProtoVersion: 2, AbortInfo: decoding.AbortInfoNever}

// demoMarker is the prefix of the transactional logical message that ends the workload.
const demoMarker = "pgreorder-demo-done"

type demoFlags struct {
	workMem string
	rows    int
	chunks  int
	capture bool
	record  string
}

func runDemo(ctx context.Context, args []string) error {
	return demo(ctx, os.Stdout, args)
}

// demo runs the demo command, printing to out (what it changes on the system goes to stderr).
func demo(ctx context.Context, out io.Writer, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var f demoFlags
	fs.StringVar(&f.workMem, "work-mem", "256kB", "memory limit of pgreorder's buffer (the server streams at 64kB)")
	fs.IntVar(&f.rows, "rows", 2000, "rows per savepoint in the large transaction")
	fs.IntVar(&f.chunks, "savepoints", 10, "savepoints in the large transaction (every third is rolled back)")
	fs.BoolVar(&f.capture, "capture", false, "replay the embedded capture even if a server could be started")
	fs.StringVar(&f.record, "record", "", "also record the workload's stream into this gzip capture file")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: pgreorder demo [flags]\n\n"+
			"Starts a throwaway PostgreSQL server (when one is installed), runs a large transaction that rolls back\n"+
			"some savepoints while small transactions commit around it, streams it through pgreorder with a small\n"+
			"memory limit and prints what arrives. Without a server it replays a recorded capture instead.\n"+
			"What starting the server changes on the system (a folder under the temporary directory; as root, the\n"+
			"system user \"pgreorder\" if absent) is said on stderr first.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 || f.rows <= 0 || f.chunks <= 0 {
		fs.Usage()
		return &usageError{flag.ErrHelp}
	}
	workMem, err := reorderbuffer.ParseWorkMem(f.workMem)
	if err != nil {
		return err
	}
	if !f.capture {
		srv, why := demoServer(ctx, out)
		if srv != nil {
			defer srv.Stop()
			return demoLive(ctx, out, srv, f, workMem)
		}
		fmt.Fprintf(out, "No PostgreSQL server could be started (%s).\n", why)
	}
	fmt.Fprintf(out, "Replaying the embedded capture of a real run instead (PostgreSQL 15, streaming on, 64kB).\n\n")
	return demoReplay(out, workMem)
}

// demoServer starts the newest installed PostgreSQL, or says why it could not.
func demoServer(ctx context.Context, out io.Writer) (*pgserver.Server, string) {
	installs := pgserver.FindInstalls()
	if len(installs) == 0 {
		return nil, "none installed; " + pgserver.HowToInstall
	}
	var reasons []string
	for i := len(installs) - 1; i >= 0; i-- {
		in := installs[i]
		fmt.Fprintf(out, "Starting a throwaway %s...\n", in)
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		srv, err := pgserver.Start(sctx, in, pgserver.Options{CreateUser: true, Log: systemLog("demo")})
		cancel()
		if err == nil {
			return srv, ""
		}
		msg := err.Error()
		if i := strings.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		reasons = append(reasons, msg)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, strings.Join(reasons, "; ")
}

// demoPrinter prints one line per transaction, the buffer's progress in between, and checks the
// large transaction.
type demoPrinter struct {
	out      io.Writer
	workMem  int64
	bigRows  int // rows of demo_big received
	done     bool
	lastLine string // the last progress line
	lastTime time.Time
}

func newDemoPrinter(out io.Writer, workMem int64) *demoPrinter {
	return &demoPrinter{out: out, workMem: workMem}
}

func (p *demoPrinter) print(t *reorderbuffer.Txn) error {
	counts := map[string]int{}
	var order []string
	count := func(k string) {
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	for c, err := range t.Changes() {
		if err != nil {
			return err
		}
		m := c.Msg
		if _, ok := m.(decoding.RowChange); ok {
			var name string // the relation a row change comes with
			if c.Relation != nil {
				name = c.Relation.Name
			}
			count(strings.ToLower(m.Type().String()) + " " + name)
			if name == "demo_big" && m.Type() == decoding.MsgInsert {
				p.bigRows++
			}
			continue
		}
		switch m := m.(type) {
		case *decoding.Truncate:
			count("truncate")
		case *decoding.LogicalMessage:
			if m.Prefix == demoMarker {
				p.done = true
			}
			count("message " + m.Prefix)
		}
	}
	kind := "whole   "
	if t.Streamed {
		kind = "streamed"
	}
	if t.NonTransactional {
		kind = "message "
	}
	parts := make([]string, len(order))
	for i, k := range order {
		parts[i] = fmt.Sprintf("%d × %s", counts[k], k)
	}
	fmt.Fprintf(p.out, "  xid %-6d commit %-11s %s  %s\n", t.Xid, t.CommitLSN, kind, strings.Join(parts, ", "))
	return nil
}

// progress prints a line with what the buffer holds and has spilled when that changed since the
// last line; with throttle set, at most every half second.
func (p *demoPrinter) progress(st reorderbuffer.Stats, throttle bool) {
	line := fmt.Sprintf("  ... %s in %s so far; %s open; %s in memory, %s spilled to disk\n",
		demoBytes(st.StreamBytes), plural(st.StreamCount, "stream block"), plural(int64(st.OpenTxns), "transaction"),
		demoBytes(st.MemoryBytes), demoBytes(st.SpillBytes))
	if line == p.lastLine || (throttle && time.Since(p.lastTime) < 500*time.Millisecond) {
		return
	}
	p.lastLine, p.lastTime = line, time.Now()
	fmt.Fprint(p.out, line)
}

// stats prints the final statistics and what became of the rolled-back transactions.
func (p *demoPrinter) stats(st reorderbuffer.Stats) {
	limit := demoBytes(p.workMem)
	if p.workMem < 0 {
		limit = "0 (spill everything)"
	}
	fmt.Fprintf(p.out, "\nStatistics (memory limit %s):\n", limit)
	fmt.Fprintf(p.out, "  transactions      %d committed, %d aborted, %d streamed (%s, %s)\n",
		st.TotalTxns, st.AbortedTxns, st.StreamTxns, plural(st.StreamCount, "stream block"), demoBytes(st.StreamBytes))
	fmt.Fprintf(p.out, "  rolled back       %s cut a transaction back\n", plural(st.AbortedSubxacts, "subtransaction abort"))
	fmt.Fprintf(p.out, "  spilled           %s, %s, %s\n", plural(st.SpillTxns, "transaction"), plural(st.SpillCount, "time"), demoBytes(st.SpillBytes))
	fmt.Fprintf(p.out, "  memory            peak %s, now %s (changes held, and free chunks kept for reuse); %s of bookkeeping besides\n",
		demoBytes(st.PeakMemoryBytes), demoBytes(st.MemoryBytes), demoBytes(st.OverheadBytes))
	if st.AbortedTxns > 0 {
		fmt.Fprintf(p.out, "\nThe large transaction that rolled back was streamed while it ran, then dropped at its Stream Abort:\n"+
			"none of its rows reached the output.\n")
	} else {
		fmt.Fprintf(p.out, "\nThe large transaction that rolled back never reached pgreorder, hence \"0 aborted\": the server\n"+
			"decoded it only after its rollback, and PostgreSQL 18 does not stream a transaction it already knows\n"+
			"is aborted (15 to 17 stream it and then send a Stream Abort).\n")
	}
}

func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func demoBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// demoLive runs the workload on srv and streams it.
func demoLive(ctx context.Context, out io.Writer, srv *pgserver.Server, f demoFlags, workMem int64) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	dsn := srv.ConnString("postgres")
	setup, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer setup.Close(context.WithoutCancel(ctx))
	for _, sql := range []string{
		`CREATE TABLE demo_big (id int PRIMARY KEY, savepoint int NOT NULL, payload text NOT NULL)`,
		`CREATE TABLE demo_small (id serial PRIMARY KEY, note text NOT NULL)`,
		`CREATE PUBLICATION demo FOR TABLE demo_big, demo_small`,
	} {
		if _, err := setup.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	if f.record != "" {
		if _, err := setup.Exec(ctx, `SELECT pg_create_logical_replication_slot('demo_record', 'pgoutput')`); err != nil {
			return err
		}
	}
	s, err := replication.Start(ctx, replication.Config{
		ConnString:    srv.ReplicationConnString("postgres"),
		Slot:          "demo",
		Publications:  []string{"demo"},
		CreateSlot:    true,
		TemporarySlot: true,
		Messages:      true,
		Buffer:        reorderbuffer.Config{WorkMem: workMem},
	})
	if err != nil {
		return err
	}
	defer s.Close(context.WithoutCancel(ctx))
	n := s.Negotiated()
	fmt.Fprintf(out, "Streaming slot %q: proto_version %d, streaming %s; server logical_decoding_work_mem 64kB.\n\n",
		"demo", n.ProtoVersion, n.Streaming)

	kept := 0
	for i := range f.chunks {
		if i%3 != 1 {
			kept += f.rows
		}
	}
	fmt.Fprintf(out, "Workload: one transaction inserts %d rows (~%s) under %d savepoints and rolls back every third;\n"+
		"meanwhile a second connection commits %d small transactions, and opens a large one that it rolls\n"+
		"back once pgreorder has received part of it.\n\n",
		f.rows*f.chunks, demoBytes(int64(f.rows*f.chunks*230)), f.chunks, f.chunks+1)

	// The workload rolls the second large transaction back once it has been streamed, or after
	// 30 seconds if the server does not stream it. The first one is streamed before it, unless it
	// is too small (about 230 bytes per row against the server's 64kB).
	wantStreamed := int64(2)
	if f.rows*f.chunks*230 < 64<<10 {
		wantStreamed = 1
	}
	streamed := make(chan struct{})
	werr := make(chan error, 1)
	go func() { werr <- demoWorkload(ctx, dsn, f, streamed) }()

	p := newDemoPrinter(out, workMem)
	fmt.Fprintln(out, "Committed transactions, in commit order (\"...\" lines: what pgreorder holds meanwhile):")
	for !p.done {
		// A short wait, so that progress shows while the large transaction streams in.
		nctx, ncancel := context.WithTimeout(ctx, 200*time.Millisecond)
		t, err := s.Next(nctx)
		ncancel()
		st := s.Stats()
		if st.StreamTxns >= wantStreamed && streamed != nil {
			close(streamed)
			streamed = nil
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				p.progress(st, true)
				continue
			}
			select {
			case e := <-werr:
				if e != nil {
					return fmt.Errorf("workload: %w", e)
				}
			default:
			}
			return err
		}
		p.progress(st, false)
		if err := p.print(t); err != nil {
			return err
		}
		if err := s.Ack(t); err != nil {
			return err
		}
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("workload: %w", err)
	}
	p.stats(s.Stats())
	var inTable int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM demo_big`).Scan(&inTable); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nThe large transaction arrived whole after its commit: %d rows received, %d in the table.\n", p.bigRows, inTable)
	if p.bigRows != inTable || inTable != kept {
		return fmt.Errorf("demo: received %d rows of demo_big, the table has %d, expected %d", p.bigRows, inTable, kept)
	}
	if f.record != "" {
		if err := demoRecord(ctx, setup, f.record); err != nil {
			return err
		}
		fmt.Fprintf(out, "Recorded the stream to %s.\n", f.record)
	}
	return nil
}

// demoWorkload runs the large transaction on one connection and the small ones on another,
// interleaved so that small transactions commit while the large one is open. The second large
// transaction is rolled back once streamed is closed, or after 30 seconds.
func demoWorkload(ctx context.Context, dsn string, f demoFlags, streamed <-chan struct{}) error {
	big, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer big.Close(context.WithoutCancel(ctx))
	small, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer small.Close(context.WithoutCancel(ctx))
	exec := func(c *pgx.Conn, sql string, args ...any) error {
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		return nil
	}
	if err := exec(big, `BEGIN`); err != nil {
		return err
	}
	for i := range f.chunks {
		if err := exec(big, fmt.Sprintf(`SAVEPOINT s%d`, i)); err != nil {
			return err
		}
		if err := exec(big, `INSERT INTO demo_big SELECT g, $1::int, md5(g::text) || repeat('.', 190)
			FROM generate_series($2::int, $3::int) g`, i, i*f.rows+1, (i+1)*f.rows); err != nil {
			return err
		}
		end := fmt.Sprintf(`RELEASE SAVEPOINT s%d`, i)
		if i%3 == 1 {
			end = fmt.Sprintf(`ROLLBACK TO SAVEPOINT s%d`, i)
		}
		if err := exec(big, end); err != nil {
			return err
		}
		if err := exec(small, `INSERT INTO demo_small (note) VALUES ($1)`, fmt.Sprintf("small transaction %d", i+1)); err != nil {
			return err
		}
	}
	// A large transaction that rolls back entirely: streamed while it runs, then dropped.
	if err := exec(small, `BEGIN`); err != nil {
		return err
	}
	if err := exec(small, `INSERT INTO demo_small (note) SELECT 'rolled back ' || g FROM generate_series(1, 3000) g`); err != nil {
		return err
	}
	select {
	case <-streamed:
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := exec(small, `ROLLBACK`); err != nil {
		return err
	}
	if err := exec(big, `COMMIT`); err != nil {
		return err
	}
	if err := exec(small, `INSERT INTO demo_small (note) VALUES ('after the large commit')`); err != nil {
		return err
	}
	return exec(small, `SELECT pg_logical_emit_message(true, $1, 'done')`, demoMarker)
}

// demoRecord writes the stream of the demo_record slot as a gzip capture.
func demoRecord(ctx context.Context, conn *pgx.Conn, path string) error {
	rows, err := conn.Query(ctx, `SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_get_binary_changes(
		'demo_record', NULL, NULL, 'proto_version', '2', 'publication_names', 'demo', 'streaming', 'on', 'messages', 'true')`)
	if err != nil {
		return err
	}
	defer rows.Close()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	w := capture.NewWriter(zw)
	if err := w.Comment("pgreorder demo workload; proto_version 2, streaming on, logical_decoding_work_mem 64kB"); err != nil {
		return err
	}
	for rows.Next() {
		var lsn string
		var xid int64
		var data []byte
		if err := rows.Scan(&lsn, &xid, &data); err != nil {
			return err
		}
		l, err := decoding.ParseLSN(lsn)
		if err != nil {
			return err
		}
		if err := w.Write(capture.Record{LSN: l, Xid: uint32(xid), Data: data}); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// demoReplay feeds the embedded capture through a Buffer.
func demoReplay(out io.Writer, workMem int64) error {
	zr, err := gzip.NewReader(bytes.NewReader(demoCapture))
	if err != nil {
		return fmt.Errorf("demo: embedded capture: %w", err)
	}
	buf, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: workMem, Decoding: demoCaptureOptions})
	if err != nil {
		return err
	}
	defer buf.Close()
	p := newDemoPrinter(out, workMem)
	fmt.Fprintln(out, "Committed transactions, in commit order (\"...\" lines: what pgreorder holds meanwhile):")
	r := capture.NewReader(zr)
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("demo: embedded capture: %w", err)
		}
		if err := buf.Add(rec.LSN, rec.Data); err != nil {
			return fmt.Errorf("demo: embedded capture line %d: %w", r.Line(), err)
		}
		for t, ok := buf.Next(); ok; t, ok = buf.Next() {
			p.progress(buf.Stats(), false)
			if err := p.print(t); err != nil {
				return err
			}
			if err := buf.Ack(t); err != nil {
				return err
			}
		}
	}
	p.stats(buf.Stats())
	if !p.done {
		return errors.New("demo: the embedded capture is incomplete")
	}
	fmt.Fprintf(out, "\nThe large transaction arrived whole after its commit: %d rows received.\n", p.bigRows)
	return nil
}
