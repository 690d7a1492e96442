package format

import (
	"errors"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Event is one Debezium-style change event, as Events hands them out: the same event as a line
// of the debezium format (without the newline), and the key a Kafka record of it has.
type Event struct {
	// Op is the event's op: 'c', 'u', 'd', 't', 'm', or 'r' for a copied row.
	Op byte
	// Relation is the table of a row or truncate event, nil for a logical message.
	Relation *decoding.Relation
	// Message is the logical decoding message of an 'm' event.
	Message *decoding.LogicalMessage
	// Key is the event's key as Debezium's JSON converter writes it (schemas off): the replica
	// identity columns of the row, typed as in the value ({"id":1}) — the new row's for an
	// update, the old row's for a delete; {"prefix":"…"} for a message; nil for a truncate and
	// for a table whose replica identity has no columns (REPLICA IDENTITY NOTHING).
	Key []byte
	// Value is the event, a JSON object.
	Value []byte
}

// Events encodes changes as Debezium-style events one at a time, for outputs that keep each
// event apart (a Kafka record per event): the encoding is the debezium format's, of Config's
// Values, Server, Database, Version and Now (Kind, StageBytes and TempDir do not apply). An
// event is built in memory whole, its size that of its row; a transaction never is.
//
// Events is not safe for concurrent use.
type Events struct {
	w *Writer
}

// NewEvents returns an Events encoding as cfg says.
func NewEvents(cfg Config) *Events {
	cfg.Kind = KindDebezium
	w := newWriter(nil, cfg)
	w.enc.w = &w.ebuf
	return &Events{w: w}
}

// Txn encodes x's changes (which must not have been read yet) and calls emit with each event in
// order, and returns the number of events. The Event and its bytes are valid until emit returns.
// The first error of emit, or of reading or encoding x, stops Txn and is returned.
func (ev *Events) Txn(x *reorderbuffer.Txn, emit func(Event) error) (int64, error) {
	if x == nil {
		return 0, errors.New("format: nil transaction")
	}
	return ev.run(txnSource(x), emit)
}

// Rows encodes the rows of an initial copy (a snapshot.Chunk: a Source of inserts) as 'r' events,
// with source.snapshot "true" and no transaction block, as Debezium's snapshot events.
func (ev *Events) Rows(src pgvalue.Source, emit func(Event) error) (int64, error) {
	if src == nil {
		return 0, errors.New("format: nil source")
	}
	return ev.run(&dbzTxn{Source: src, snapshot: true}, emit)
}

func (ev *Events) run(x *dbzTxn, emit func(Event) error) (int64, error) {
	w := ev.w
	w.event = emit
	defer func() { w.event = nil }()
	w.enc.buf, w.enc.err = w.enc.buf[:0], nil
	w.ebuf.b = w.ebuf.b[:0]
	n, err := w.debezium(x)
	w.enc.buf = w.enc.buf[:0]
	w.ebuf.b = w.ebuf.b[:0]
	if cap(w.ebuf.b) > 4*flushAt {
		w.ebuf.b = nil // a huge row: do not keep its buffer
	}
	if cap(w.enc.buf) > 4*flushAt {
		w.enc.buf = nil
	}
	if err != nil {
		return n, err
	}
	w.changes += n
	return n, nil
}

// eventSink collects the bytes of one event.
type eventSink struct{ b []byte }

func (s *eventSink) Write(p []byte) (int, error) {
	s.b = append(s.b, p...)
	return len(p), nil
}

// emitEvent hands the event just written (and its key, encoded after it) to w.event.
func (w *Writer) emitEvent(x *dbzTxn, r *decoding.Relation, op byte, key decoding.Tuple, m *decoding.LogicalMessage) error {
	e := &w.enc
	e.flush()
	if e.err != nil {
		return e.err
	}
	vlen := len(w.ebuf.b) - 1 // without the newline
	switch {
	case m != nil:
		e.raw(`{"prefix":`)
		e.name(m.Prefix)
		e.byte('}')
	case key != nil && op != 't':
		row, err := w.vals.Row(x, r, key)
		if err != nil {
			return err
		}
		n := 0
		for c := range row.Columns() {
			if !c.Key {
				continue
			}
			if n == 0 {
				e.byte('{')
			} else {
				e.byte(',')
			}
			n++
			e.name(c.Name)
			e.byte(':')
			if err := w.dbzValue(c); err != nil {
				return err
			}
			e.maybeFlush()
		}
		if n > 0 {
			e.byte('}')
		}
	}
	e.flush()
	if e.err != nil {
		return e.err
	}
	event := Event{Op: op, Relation: r, Message: m, Value: w.ebuf.b[:vlen]}
	if len(w.ebuf.b) > vlen+1 {
		event.Key = w.ebuf.b[vlen+1:]
	}
	err := w.event(event)
	w.ebuf.b = w.ebuf.b[:0]
	return err
}
