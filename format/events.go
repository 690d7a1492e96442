package format

import (
	"context"
	"errors"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Event is one Debezium change event, as Events hands them out: the value of a Kafka record
// (the debezium format's line, without the newline, optionally with its Connect schema), its key
// and its headers.
type Event struct {
	// Op is the event's op: 'c', 'u', 'd', 't', 'm', or 'r' for a copied row.
	Op byte
	// Relation is the table of a row or truncate event, nil for a logical message.
	Relation *decoding.Relation
	// Message is the logical decoding message of an 'm' event.
	Message *decoding.LogicalMessage
	// Key is the event's key as Kafka's JSON converter writes it: the key columns of the row
	// (Config.Tables: the primary key, else a unique index of NOT NULL columns; without it, the
	// replica identity's columns), typed as in the value ({"id":1}) — the new row's for a create
	// or update, the old row's for a delete; {"prefix":"…"} for a message; nil for a truncate and
	// for a table without key. With Config.KeySchema it is {"schema":…,"payload":…}.
	Key []byte
	// Value is the event, a JSON object.
	Value []byte
	// Headers are the record's headers: a change of key is a delete of the old key with header
	// HeaderNewKey, then a create of the new key with HeaderOldKey, each holding the other key's
	// JSON (without a schema), as Debezium writes them.
	Headers []Header
}

// Header is a Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Events encodes changes as Debezium change events one at a time, for outputs that keep each
// event apart (a Kafka record per event): the encoding is the debezium format's, of Config's
// Values, Server, Database, Version, Decimal, Interval and Now, plus what only Events does: keys
// (Tables), a change of key as a delete and a create, and Connect schemas (KeySchema,
// ValueSchema, SchemaName). Kind, StageBytes and TempDir do not apply. An event is built in
// memory whole, its size that of its row; a transaction never is.
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
// The first error of emit, or of reading or encoding x, stops Txn and is returned. ctx bounds the
// lookups of Config.Tables.
func (ev *Events) Txn(ctx context.Context, x *reorderbuffer.Txn, emit func(Event) error) (int64, error) {
	if x == nil {
		return 0, errors.New("format: nil transaction")
	}
	return ev.run(ctx, txnSource(x), emit)
}

// Rows encodes the rows of an initial copy (a snapshot.Chunk: a Source of inserts) as 'r' events,
// with source.snapshot "true" and no transaction block, as Debezium's snapshot events. When src
// has a method ConsistentPoint() decoding.LSN (a snapshot.Chunk, a changefeed.Batch), it is the
// events' source.lsn, as Debezium gives the snapshot's position.
func (ev *Events) Rows(ctx context.Context, src pgvalue.Source, emit func(Event) error) (int64, error) {
	if src == nil {
		return 0, errors.New("format: nil source")
	}
	x := &dbzTxn{Source: src, snapshot: true}
	if p, ok := src.(interface{ ConsistentPoint() decoding.LSN }); ok {
		x.commitLSN = uint64(p.ConsistentPoint())
	}
	return ev.run(ctx, x, emit)
}

func (ev *Events) run(ctx context.Context, x *dbzTxn, emit func(Event) error) (int64, error) {
	w := ev.w
	w.event, w.ctx = emit, ctx
	defer func() { w.event, w.ctx = nil, nil }()
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

// emitEvent hands the event just written to w.event, with its key (of tuple key, taking what it
// lacks from alt) and header h (none when h.Key is "").
func (w *Writer) emitEvent(x *dbzTxn, t *dbzTable, op byte, key, alt decoding.Tuple, h Header, m *decoding.LogicalMessage) error {
	e := &w.enc
	e.flush()
	if e.err != nil {
		return e.err
	}
	vlen := len(w.ebuf.b) - 1 // without the newline
	keyed := m != nil || op != 't' && key != nil && t.key != nil
	if keyed && w.cfg.KeySchema {
		e.raw(`{"schema":`)
		if m != nil {
			e.raw(messageKeySchema)
		} else {
			e.buf = append(e.buf, w.keySchema(t)...)
		}
		e.raw(`,"payload":`)
	}
	switch {
	case m != nil:
		e.raw(`{"prefix":`)
		e.name(m.Prefix)
		e.byte('}')
	case keyed:
		if err := w.keyObject(x, t, key, alt); err != nil {
			return err
		}
	}
	if keyed && w.cfg.KeySchema {
		e.byte('}')
	}
	e.flush()
	if e.err != nil {
		return e.err
	}
	event := Event{Op: op, Message: m, Value: w.ebuf.b[:vlen]}
	if t != nil {
		event.Relation = t.rel
	}
	if len(w.ebuf.b) > vlen+1 {
		event.Key = w.ebuf.b[vlen+1:]
	}
	if h.Key != "" {
		w.hdr[0] = h
		event.Headers = w.hdr[:]
	}
	err := w.event(event)
	w.ebuf.b = w.ebuf.b[:0]
	return err
}
