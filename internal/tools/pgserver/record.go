package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
)

// Variant is one way of reading the changes: a pgoutput protocol version and its options.
type Variant struct {
	Name         string // "plain", "stream-v2", ...: the capture file's stem
	ProtoVersion int
	Streaming    string // pgoutput's streaming option: "off", "on" or "parallel"
	TwoPhase     bool   // two_phase on (its own slot: reading once with it turns it on for good)
	MinMajor     int    // oldest server major that supports it
}

// Streamed reports whether the variant reads with streaming on.
func (v Variant) Streamed() bool { return v.Streaming != "off" }

// Variants are the captures Record makes by default (those the server supports). "plain" is the
// oracle: the server reorders, and a consumer of a streamed variant must emit exactly its
// transactions.
var Variants = []Variant{
	{Name: "plain", ProtoVersion: 1, Streaming: "off", MinMajor: 15},
	{Name: "stream-v2", ProtoVersion: 2, Streaming: "on", MinMajor: 15},
	{Name: "stream-v3-2pc", ProtoVersion: 3, Streaming: "on", TwoPhase: true, MinMajor: 15},
	{Name: "stream-v4-parallel", ProtoVersion: 4, Streaming: "parallel", MinMajor: 16},
}

// RecordOptions configures Record. The zero value records every supported variant at 64kB.
type RecordOptions struct {
	Variants []Variant // nil: every entry of Variants the server supports
	// WorkMem is logical_decoding_work_mem for the streamed reads (a session SET, which the SQL
	// decoding functions obey); "" means "64kB", the smallest the server accepts.
	WorkMem string
	// Immediate sets debug_logical_replication_streaming = immediate (16+) for the streamed
	// reads: every change is streamed as soon as it is decoded.
	Immediate bool
	// Name prefixes the publication and slot names; "" means "pgreorder_rec_<pid>".
	Name string
}

// Capture is what one variant's slot gave for the workload.
type Capture struct {
	Variant Variant
	Header  string           // comment text: server, slot, options, workload
	Records []capture.Record // in the order the server returned them; Data is owned
}

// ErrUnsupported is returned when a requested variant needs a newer server.
var ErrUnsupported = errors.New("pgserver: variant not supported by this server")

// Record captures a workload, as PostgreSQL itself would send it, for each variant. On the
// database connString names it runs the workload's setup part, creates a publication FOR ALL
// TABLES and one temporary pgoutput slot per variant back to back, runs the workload part and
// then reads every slot with pg_logical_slot_peek_binary_changes. The slots go away with
// Record's connection, and the publication is dropped on return. Every session of the workload
// must end outside a transaction block. Sessions run with synchronous_commit on, because the
// decoding functions read only WAL that has been flushed.
func Record(ctx context.Context, connString string, w *Workload, opts RecordOptions) (_ []Capture, err error) {
	ctl, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return nil, fmt.Errorf("pgserver: record: %w", err)
	}
	defer ctl.Close(context.Background())
	info, err := queryRow(ctx, ctl, "SELECT current_setting('server_version_num'), version(), current_database()")
	if err != nil {
		return nil, fmt.Errorf("pgserver: record: %w", err)
	}
	num, _ := strconv.Atoi(info[0])
	major := num / 10000
	variants := opts.Variants
	if variants == nil {
		for _, v := range Variants {
			if major >= v.MinMajor {
				variants = append(variants, v)
			}
		}
	}
	for _, v := range variants {
		if major < v.MinMajor {
			return nil, fmt.Errorf("%w: %s needs PostgreSQL %d, server is %d", ErrUnsupported, v.Name, v.MinMajor, major)
		}
	}
	if opts.Immediate && major < 16 {
		return nil, fmt.Errorf("%w: debug_logical_replication_streaming needs PostgreSQL 16, server is %d", ErrUnsupported, major)
	}
	workMem := opts.WorkMem
	if workMem == "" {
		workMem = "64kB"
	}
	name := opts.Name
	if name == "" {
		name = "pgreorder_rec_" + strconv.Itoa(os.Getpid())
	}

	sessions := map[string]*pgconn.PgConn{}
	defer func() {
		for _, c := range sessions {
			c.Close(context.Background())
		}
	}()
	if err := runSteps(ctx, connString, sessions, w.Setup); err != nil {
		return nil, err
	}
	pub := name + "_pub"
	if _, err := ctl.Exec(ctx, "CREATE PUBLICATION "+pgsession.QuoteIdent(pub)+" FOR ALL TABLES").ReadAll(); err != nil {
		return nil, fmt.Errorf("pgserver: record: %w", err)
	}
	defer func() {
		if _, derr := ctl.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgsession.QuoteIdent(pub)).ReadAll(); derr != nil && err == nil {
			err = fmt.Errorf("pgserver: record: %w", derr)
		}
	}()
	slots := make([]string, len(variants))
	// The slots are temporary, but a temporary slot goes away only once the server has ended the
	// backend of the connection that made it, after that connection closed: a Record that
	// follows at once, with the same names, could find them. They are dropped here instead.
	var made []string
	defer func() {
		for _, slot := range made {
			q := "SELECT pg_catalog.pg_drop_replication_slot(" + pgsession.QuoteLiteral(slot) + ")"
			if _, derr := ctl.Exec(context.Background(), q).ReadAll(); derr != nil && err == nil {
				err = fmt.Errorf("pgserver: record: dropping slot %s: %w", slot, derr)
			}
		}
	}()
	for i, v := range variants {
		slots[i] = name + "_" + strings.ReplaceAll(v.Name, "-", "_")
		q := fmt.Sprintf("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', true, %t)", pgsession.QuoteLiteral(slots[i]), v.TwoPhase)
		if _, err := ctl.Exec(ctx, q).ReadAll(); err != nil {
			return nil, fmt.Errorf("pgserver: record: creating slot %s: %w", slots[i], err)
		}
		made = append(made, slots[i])
	}
	if err := runSteps(ctx, connString, sessions, w.Workload); err != nil {
		return nil, err
	}
	for name, c := range sessions {
		if c.TxStatus() != 'I' {
			return nil, fmt.Errorf("%w: session %s ends inside a transaction block", ErrWorkload, name)
		}
	}

	var out []Capture
	for i, v := range variants {
		var set []string
		if v.Streamed() {
			set = append(set, "SET logical_decoding_work_mem = "+pgsession.QuoteLiteral(workMem))
			if opts.Immediate {
				set = append(set, "SET debug_logical_replication_streaming = immediate")
			}
		} else {
			set = append(set, "RESET logical_decoding_work_mem")
			if major >= 16 {
				set = append(set, "RESET debug_logical_replication_streaming")
			}
		}
		for _, q := range set {
			if _, err := ctl.Exec(ctx, q).ReadAll(); err != nil {
				return nil, fmt.Errorf("pgserver: record: %w", err)
			}
		}
		peekOpts := []string{"proto_version", strconv.Itoa(v.ProtoVersion), "publication_names", pub, "messages", "true"}
		if v.Streamed() {
			peekOpts = append(peekOpts, "streaming", v.Streaming)
		}
		if v.TwoPhase {
			peekOpts = append(peekOpts, "two_phase", "true")
		}
		args := make([]string, len(peekOpts))
		for j, o := range peekOpts {
			args[j] = pgsession.QuoteLiteral(o)
		}
		peek := fmt.Sprintf("pg_logical_slot_peek_binary_changes(%s, NULL, NULL, %s)", pgsession.QuoteLiteral(slots[i]), strings.Join(args, ", "))
		recs, err := peekRecords(ctx, ctl, "SELECT lsn::text, xid::text, data FROM "+peek)
		if err != nil {
			return nil, fmt.Errorf("pgserver: record: %s: %w", v.Name, err)
		}
		eff, err := queryRow(ctx, ctl, "SELECT current_setting('logical_decoding_work_mem')")
		if err != nil {
			return nil, fmt.Errorf("pgserver: record: %w", err)
		}
		var h strings.Builder
		fmt.Fprintf(&h, "pgreorder record: %s capture\n", v.Name)
		fmt.Fprintf(&h, "server: %s\n", info[1])
		fmt.Fprintf(&h, "slot: temporary pgoutput slot, two_phase %t, created back to back with the slots of %d other variant(s) in database %s\n", v.TwoPhase, len(variants)-1, info[2])
		fmt.Fprintf(&h, "read: SELECT lsn, xid, data FROM %s\n", strings.Replace(peek, pgsession.QuoteLiteral(slots[i]), "slot", 1))
		fmt.Fprintf(&h, "session: logical_decoding_work_mem = %s", eff[0])
		if v.Streamed() && opts.Immediate {
			h.WriteString(", debug_logical_replication_streaming = immediate")
		}
		fmt.Fprintf(&h, "\nmessages: %d\ncolumns: lsn<TAB>xid<TAB>hex(data)\nworkload:\n", len(recs))
		h.WriteString(indent(strings.TrimRight(w.Text, "\n"), "    "))
		out = append(out, Capture{Variant: v, Header: h.String(), Records: recs})
	}
	return out, nil
}

func indent(text, prefix string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(prefix+l, " \t")
	}
	return strings.Join(lines, "\n")
}

func runSteps(ctx context.Context, connString string, sessions map[string]*pgconn.PgConn, steps []Step) error {
	for _, st := range steps {
		c := sessions[st.Session]
		if c == nil {
			var err error
			c, err = pgconn.Connect(ctx, connString)
			if err != nil {
				return fmt.Errorf("pgserver: record: session %s: %w", st.Session, err)
			}
			sessions[st.Session] = c
			// The decoding functions read only flushed WAL: commits must not be left to the
			// WAL writer (a workload that sets synchronous_commit off takes that risk).
			if _, err := c.Exec(ctx, "SET synchronous_commit = on").ReadAll(); err != nil {
				return fmt.Errorf("pgserver: record: session %s: %w", st.Session, err)
			}
		}
		if _, err := c.Exec(ctx, st.SQL).ReadAll(); err != nil {
			return fmt.Errorf("pgserver: record: workload line %d (session %s): %w", st.Line, st.Session, err)
		}
	}
	return nil
}

func queryRow(ctx context.Context, conn *pgconn.PgConn, sql string) ([]string, error) {
	res := conn.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	if len(res.Rows) != 1 {
		return nil, fmt.Errorf("%q returned %d rows", sql, len(res.Rows))
	}
	row := make([]string, len(res.Rows[0]))
	for i, v := range res.Rows[0] {
		row[i] = string(v)
	}
	return row, nil
}

// peekRecords reads lsn (text), xid (text) and data (binary) rows without holding the whole
// result twice.
func peekRecords(ctx context.Context, conn *pgconn.PgConn, sql string) ([]capture.Record, error) {
	rr := conn.ExecParams(ctx, sql, nil, nil, nil, []int16{0, 0, 1})
	var recs []capture.Record
	for rr.NextRow() {
		v := rr.Values()
		lsn, err := decoding.ParseLSN(string(v[0]))
		if err != nil {
			rr.Close()
			return nil, fmt.Errorf("lsn %q: %w", v[0], err)
		}
		var xid uint64
		if v[1] != nil {
			if xid, err = strconv.ParseUint(string(v[1]), 10, 32); err != nil {
				rr.Close()
				return nil, fmt.Errorf("xid %q: %w", v[1], err)
			}
		}
		recs = append(recs, capture.Record{LSN: lsn, Xid: uint32(xid), Data: append([]byte(nil), v[2]...)})
	}
	if _, err := rr.Close(); err != nil {
		return nil, err
	}
	return recs, nil
}
