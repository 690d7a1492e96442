package format

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Kind names an output format.
type Kind string

// The output formats.
const (
	// KindTxn is one JSON object per transaction (the default).
	KindTxn Kind = "txn"
	// KindDebezium is one Debezium-style change event per change.
	KindDebezium Kind = "debezium"
)

// Kinds lists the output formats.
var Kinds = []Kind{KindTxn, KindDebezium}

// ParseKind returns the format named s ("" means KindTxn).
func ParseKind(s string) (Kind, error) {
	if s == "" {
		return KindTxn, nil
	}
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return "", fmt.Errorf("%w %q (valid: %s)", ErrUnknownKind, s, strings.Join(names, ", "))
}

var (
	// ErrUnknownKind is returned for a format name that is not one of Kinds.
	ErrUnknownKind = errors.New("format: unknown output format")
	// ErrUnknownRelation is returned for a change whose relation the stream never described.
	ErrUnknownRelation = pgvalue.ErrUnknownRelation
	// ErrDuplicateColumn is returned for a relation with two columns of the same name, which would
	// make a JSON object with duplicate keys. PostgreSQL never sends one.
	ErrDuplicateColumn = errors.New("format: relation has two columns of the same name")
	// ErrClosed is returned by a Writer or File after Close.
	ErrClosed = errors.New("format: closed")
)

// DefaultStageBytes is the default for Config.StageBytes.
const DefaultStageBytes = 1 << 20

// Config configures a Writer or Events. The zero value writes the txn format, stages up to 1 MiB
// of a transaction in memory and the rest in os.TempDir().
type Config struct {
	// Kind is the format; "" means KindTxn.
	Kind Kind

	// Values decodes column values into typed JSON values (Debezium). nil means
	// pgvalue.NewDecoder(nil): the built-in types. Register custom types in its Map.
	Values *pgvalue.Decoder

	// StageBytes is how much of a transaction a Writer holds in memory before it stages the rest in
	// a temporary file; 0 means DefaultStageBytes.
	StageBytes int

	// TempDir is where a Writer stages large transactions; "" means os.TempDir(). The staging file
	// is removed from the directory as soon as it is created, so it never outlives the process.
	TempDir string

	// Debezium: the source block of every event.
	Server   string // source.name, the logical name of the source server; "" means "pgreorder"
	Database string // source.db, the source database's name
	Version  string // source.version, the producer's version

	// Debezium: how numeric and interval values are written (Debezium's decimal.handling.mode and
	// interval.handling.mode); the zero values are Debezium's defaults.
	Decimal  DecimalHandling
	Interval IntervalHandling

	// Tables tells Events what pgoutput does not send of a table: its primary key, NOT NULL
	// columns, defaults and enum labels (package catalog reads them from the source). With it,
	// event keys are the primary key's columns whatever the replica identity, as Debezium's;
	// without it, the replica identity's columns (all of them for REPLICA IDENTITY FULL). A
	// Writer does not use it.
	Tables Tables
	// KeySchema and ValueSchema make Events write the key and the value with Kafka Connect's
	// schema, {"schema":…,"payload":…}, as Kafka's JsonConverter with schemas.enable=true (what a
	// Kafka Connect sink needs). A Writer does not use them.
	KeySchema, ValueSchema bool
	// SchemaName returns the prefix of the Connect schema names of a relation's events (PREFIX.Key,
	// PREFIX.Value, PREFIX.Envelope): Debezium uses the table's topic name. nil means
	// TopicName(Server, schema, table).
	SchemaName func(*decoding.Relation) string

	// Now gives the ts_ms of Debezium events (when the event was written); nil means time.Now.
	Now func() time.Time
}

// Writer writes committed transactions in one of the formats, each transaction whole or not at
// all: its output is staged (in memory up to Config.StageBytes, then in a private temporary
// file) while the transaction's changes are read, and copied to the destination only once all of
// them were read and encoded. A transaction that fails (a spill read error, a change for an
// unknown relation) leaves nothing in the output. Only an error of the destination itself, or
// the process dying during the copy, can leave part of a transaction there: package changefeed's
// JSONLines is output that survives that.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	cfg     Config
	stage   *stage
	enc     encoder
	vals    *pgvalue.Decoder
	now     func() time.Time
	checked map[*decoding.Relation]error
	tables  map[*decoding.Relation]*dbzTable // Debezium: what each relation's events need
	ctx     context.Context                  // Events: the context of the call, for Tables
	order   map[uint32]int64                 // Debezium: events per table in the transaction
	changes int64
	event   func(Event) error // Events: called with each Debezium event once encoded
	ebuf    eventSink
	hdr     [1]Header
	kindErr error
	closed  bool
}

// NewWriter returns a Writer to out. It writes each transaction to out with one Write call when it is
// staged in memory, in pieces of 64 KiB when it was staged in a file. Close it to release the
// staging file.
func NewWriter(out io.Writer, cfg Config) *Writer {
	limit := cfg.StageBytes
	if limit <= 0 {
		limit = DefaultStageBytes
	}
	return newWriter(&stage{out: out, limit: limit, dir: cfg.TempDir}, cfg)
}

func newWriter(s *stage, cfg Config) *Writer {
	if cfg.Kind == "" {
		cfg.Kind = KindTxn
	}
	w := &Writer{cfg: cfg, stage: s, vals: cfg.Values, now: cfg.Now}
	_, w.kindErr = ParseKind(string(cfg.Kind))
	if w.vals == nil {
		w.vals = pgvalue.NewDecoder(nil)
	}
	if w.now == nil {
		w.now = time.Now
	}
	if cfg.Server == "" {
		w.cfg.Server = "pgreorder"
	}
	w.enc.w = s
	return w
}

// Changes returns the number of changes written (rows, truncates and logical messages).
func (w *Writer) Changes() int64 { return w.changes }

// WriteTxn reads x's changes and writes x, whole or not at all. x's changes must not have been
// read yet.
func (w *Writer) WriteTxn(x *reorderbuffer.Txn) error {
	if w.closed {
		return ErrClosed
	}
	if x == nil {
		return errors.New("format: nil transaction")
	}
	return w.write(func() (int64, error) {
		if w.cfg.Kind == KindDebezium {
			return w.debezium(txnSource(x))
		}
		return w.txn(x)
	})
}

// WriteRows reads the rows of src, a chunk of an initial copy (its messages are inserts, as a
// *snapshot.Chunk's or a changefeed Snapshot batch's), and writes them, whole or not at all. The
// debezium format writes an "r" event per row (snapshot "true", no transaction block, and the
// snapshot's LSN when src has a ConsistentPoint method, as those two have); the txn format writes
// one line for the chunk, {"snapshot_lsn":"X/X","changes":[…]}, its changes inserts as in a
// transaction's line (snapshot_lsn is "0/0" when src has no ConsistentPoint).
func (w *Writer) WriteRows(src pgvalue.Source) error {
	if w.closed {
		return ErrClosed
	}
	if src == nil {
		return errors.New("format: nil source")
	}
	var lsn decoding.LSN
	if p, ok := src.(interface{ ConsistentPoint() decoding.LSN }); ok {
		lsn = p.ConsistentPoint()
	}
	return w.write(func() (int64, error) {
		if w.cfg.Kind == KindDebezium {
			return w.debezium(&dbzTxn{Source: src, snapshot: true, commitLSN: uint64(lsn)})
		}
		return w.rows(src, lsn)
	})
}

// write stages what encode writes and copies it to the destination if encode succeeds.
func (w *Writer) write(encode func() (int64, error)) error {
	if w.closed {
		return ErrClosed
	}
	if w.kindErr != nil {
		return w.kindErr
	}
	w.enc.buf, w.enc.err = w.enc.buf[:0], nil
	n, err := encode()
	if err == nil {
		w.enc.flush()
		err = w.enc.err
	}
	if err != nil {
		w.enc.buf = w.enc.buf[:0]
		return errors.Join(err, w.stage.abort())
	}
	if err := w.stage.commit(); err != nil {
		return err
	}
	w.changes += n
	if cap(w.enc.buf) > 4*flushAt {
		w.enc.buf = nil // a huge name or message: do not keep its buffer
	}
	return nil
}

// Close releases the staging file. It is safe to call twice.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	if w.stage == nil {
		return nil
	}
	return w.stage.close()
}

// checkColumns returns ErrDuplicateColumn for a relation with two columns of the same name.
func (w *Writer) checkColumns(r *decoding.Relation) error {
	if err, ok := w.checked[r]; ok {
		return err
	}
	if w.checked == nil || len(w.checked) > 1024 {
		w.checked = map[*decoding.Relation]error{}
	}
	var err error
	seen := make(map[string]bool, len(r.Columns))
	for _, c := range r.Columns {
		if seen[c.Name] {
			err = fmt.Errorf("%w: %s.%s has two columns %q", ErrDuplicateColumn, r.Namespace, r.Name, c.Name)
			break
		}
		seen[c.Name] = true
	}
	w.checked[r] = err
	return err
}

// stage holds a transaction in memory, then in a temporary file, until commit copies it to out.
type stage struct {
	out   io.Writer
	limit int
	dir   string
	mem   []byte
	f     *os.File
	size  int64 // bytes in f
	copy  []byte
}

func (s *stage) Write(p []byte) (int, error) {
	if s.size == 0 && len(s.mem)+len(p) <= s.limit {
		s.mem = append(s.mem, p...)
		return len(p), nil
	}
	if s.f == nil {
		f, err := os.CreateTemp(s.dir, "pgreorder-stage-*")
		if err != nil {
			return 0, fmt.Errorf("format: staging a large transaction: %w", err)
		}
		os.Remove(f.Name()) // private: gone with the process (where the system allows it)
		s.f = f
	}
	if len(s.mem) > 0 {
		if _, err := s.f.Write(s.mem); err != nil {
			return 0, fmt.Errorf("format: staging a large transaction: %w", err)
		}
		s.size += int64(len(s.mem))
		s.mem = s.mem[:0]
	}
	n, err := s.f.Write(p)
	s.size += int64(n)
	if err != nil {
		err = fmt.Errorf("format: staging a large transaction: %w", err)
	}
	return n, err
}

func (s *stage) commit() error {
	defer s.abort()
	if s.size > 0 {
		if _, err := s.f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if s.copy == nil {
			s.copy = make([]byte, flushAt)
		}
		// Not io.CopyN: it would hand the file to out.ReadFrom, whose buffer we do not control.
		for left := s.size; left > 0; {
			n, err := s.f.Read(s.copy[:min(int64(len(s.copy)), left)])
			if n > 0 {
				if _, werr := s.out.Write(s.copy[:n]); werr != nil {
					return werr
				}
				left -= int64(n)
			}
			if err != nil && left > 0 {
				return fmt.Errorf("format: reading the staged transaction back: %w", err)
			}
		}
		return nil
	}
	if len(s.mem) == 0 {
		return nil
	}
	_, err := s.out.Write(s.mem)
	return err
}

func (s *stage) abort() error {
	s.mem = s.mem[:0]
	if s.size > 0 {
		s.size = 0
		if err := s.f.Truncate(0); err != nil {
			return err
		}
		if _, err := s.f.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	return nil
}

func (s *stage) close() error {
	s.mem = nil
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}
