package reorderbuffer

import (
	"errors"
	"io"
	"iter"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/ilist"
	"github.com/pgreorder/pgreorder/spill"
)

// Txn is a committed transaction handed out by Buffer.Next, a non-transactional logical message
// in its place in the stream, a part of a transaction (Config.Incremental), or an idle advance
// of the position (Advance, with Config.HandOutAdvances).
//
// Its exported fields are plain values and stay valid for good. Its changes, and the relations
// and types they refer to, can be read until the transaction is released by the next call to
// Buffer.Next or by Buffer.Close. A Txn owns what reading them needs (its records, its spill
// log's reader, the schema it resolves against, and until then the parser the Buffer lends to
// the one transaction handed out), so it may be read on another goroutine while the Buffer goes
// on being used.
type Txn struct {
	Xid        uint32       // top-level transaction id; 0 for a non-transactional message
	CommitLSN  decoding.LSN // LSN of the commit record (COMMIT PREPARED's for a two-phase transaction)
	EndLSN     decoding.LSN // end of the commit record: what to acknowledge to the server
	CommitTime time.Time    // commit time reported by the server
	Origin     string       // replication origin of the transaction, if the server sent one
	OriginLSN  decoding.LSN // the origin's commit LSN (0 for streamed transactions: pgoutput sends 0)
	GID        string       // global identifier of a two-phase transaction, "" otherwise
	Streamed   bool         // the transaction arrived as a stream (it was larger than the server's work mem)

	// NonTransactional marks a non-transactional logical message (pg_logical_emit_message with
	// transactional = false); Changes yields just that message and CommitLSN = EndLSN = its LSN.
	NonTransactional bool

	// Part says whether this is a whole transaction or, with Config.Incremental, which part of
	// one, or an Advance. Only Whole and PartCommit carry the commit fields (CommitLSN, EndLSN,
	// CommitTime, GID, Origin) and are acknowledged, and Advance, which carries only EndLSN (and
	// CommitLSN, equal to it).
	Part PartKind
	// SubXid is the subtransaction to undo, for PartSubAbort.
	SubXid uint32

	b           *Buffer                      // for Ack only: reading the changes never touches the Buffer
	keep        func(relationID uint32) bool // Filter's: the relations whose rows Changes yields; nil keeps all
	opts        decoding.Options
	incremental bool
	data        *xact            // nil once released
	src         *spill.Reader    // the spill log's reader, opened by Next (nil if not spilled)
	parser      *decoding.Parser // the Buffer's, lent by Next with the transaction
	view        view
	seq         uint64 // in the buffer's acknowledgement queue
	pinned      bool   // a committed prepared transaction pins the flush position at its PREPARE until acknowledged
	released    bool
	kept        bool             // under b.keptMu: kept (Keep) and not yet released
	keptLinks   ilist.Links[Txn] // on the Buffer's list of kept transactions, under b.keptMu
}

// Changes yields the transaction's messages in the order the server sent them, each with the
// schema in effect at its position (decoding.Change): Relation and Type messages (schema, before
// the changes that need them), Insert, Update, Delete, Truncate and transactional logical
// messages. An Insert, Update or Delete comes with its relation (Change.Relation), a Truncate's
// relations and the columns' data types resolve through Change.Schema. Records are read back
// from the spill log, then from memory, one at a time, so memory stays bounded whatever the size
// of the transaction. Changes may be called again to read the transaction from the start, but
// not while another iteration of the same transaction is in progress.
//
// The iteration touches nothing of the Buffer: it may run on another goroutine while the Buffer
// is used, until the Next or Close that releases the transaction.
//
// A yielded message, every byte slice and tuple in it, Change.Schema and Change.Raw (the record
// the message was parsed from: the server's message, in the in-stream form for a streamed
// transaction handed out in parts, without the writer's xid for one handed out whole) are only valid until the next iteration step: the buffer reuses the
// memory for the next message. Call the message's
// Clone method to keep one longer. Change.Relation, and the descriptions Change.Schema returns,
// stay valid for good.
//
// Iteration stops after the first error. Reading a transaction released by Buffer.Next or
// Buffer.Close, or calling either inside the loop, yields ErrReleased.
func (x *Txn) Changes() iter.Seq2[decoding.Change, error] {
	return func(yield func(decoding.Change, error) bool) {
		if x.released {
			yield(decoding.Change{}, ErrReleased)
			return
		}
		p, inStream, rs := x.read()
		defer rs.close()
		for {
			rec, err := rs.next()
			var m decoding.Message
			if err == nil {
				m, err = p.Parse(rec, inStream)
			} else if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				yield(decoding.Change{}, err)
				return
			}
			var rel *decoding.Relation
			switch v := m.(type) { // the row changes' concrete types: no interface conversion
			case *decoding.Insert:
				if x.keep != nil && !x.keep(v.RelationID) {
					continue
				}
				rel = x.view.rowRelation(v.RelationID)
			case *decoding.Update:
				if x.keep != nil && !x.keep(v.RelationID) {
					continue
				}
				rel = x.view.rowRelation(v.RelationID)
			case *decoding.Delete:
				if x.keep != nil && !x.keep(v.RelationID) {
					continue
				}
				rel = x.view.rowRelation(v.RelationID)
			case *decoding.Truncate:
				if x.keep != nil {
					if m = x.keepTruncate(v); m == nil {
						continue
					}
					if m != v {
						rec = nil // the server's message names relations this one does not
					}
				}
			default:
				x.view.read(m)
				rel = decoding.RelationOf(&x.view, m)
			}
			if !yield(decoding.Change{Msg: m, Relation: rel, Schema: &x.view, Raw: rec, InStream: inStream}, nil) {
				return
			}
		}
	}
}

// read starts reading the transaction from the start, for Changes and Heads: the parser to use,
// whether the records are in the in-stream form, and the records, to close when done.
func (x *Txn) read() (p *decoding.Parser, inStream bool, rs records) {
	if p = x.parser; p == nil {
		p = &decoding.Parser{Options: x.opts}
	}
	x.view.reset()
	// In parts, a streamed transaction's records keep the writer's xid.
	return p, x.data.streamed && x.incremental, newRecords(x.data, x.src, &x.released)
}

// Head is one message of a transaction as Heads yields it: a row change read only as far as
// its header, any other message parsed.
type Head struct {
	// Change is the message as Changes yields it, with the same lifetimes, except that Msg is
	// nil for an Insert, Update or Delete: their tuples are not parsed. Relation, Schema, Raw and
	// InStream are set as Changes sets them, Raw is the whole record.
	decoding.Change
	// Type is the message's type.
	Type decoding.MessageType
	// RelationID is the relation an Insert, Update or Delete changes (0 for other messages).
	RelationID uint32
}

// Heads yields what Changes yields, in the same order and with the same filter, but reads an
// Insert, Update or Delete only as far as its relation: a consumer that needs to know which
// relations the changes name (to route or schedule them), and hands the records on to be parsed
// where they are applied, reads each record once. The other messages (Truncate, Relation and
// Type descriptions, logical messages) are parsed as Changes parses them. The header checks
// only the bytes it reads; a record is parsed in full, and checked, by whoever parses Raw. The
// rules of Changes hold: one iteration of a transaction at a time, valid until the step moves on.
func (x *Txn) Heads() iter.Seq2[Head, error] {
	return func(yield func(Head, error) bool) {
		if x.released {
			yield(Head{}, ErrReleased)
			return
		}
		p, inStream, rs := x.read()
		defer rs.close()
		for {
			rec, err := rs.next()
			var h decoding.Header
			if err == nil {
				h, err = decoding.ParseHeader(rec, inStream)
			} else if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				yield(Head{}, err)
				return
			}
			if h.Type == decoding.MsgInsert || h.Type == decoding.MsgUpdate || h.Type == decoding.MsgDelete {
				if x.keep != nil && !x.keep(h.RelationID) {
					continue
				}
				if !yield(Head{Change: decoding.Change{Relation: x.view.rowRelation(h.RelationID), Schema: &x.view, Raw: rec,
					InStream: inStream}, Type: h.Type, RelationID: h.RelationID}, nil) {
					return
				}
				continue
			}
			m, err := p.Parse(rec, inStream)
			if err != nil {
				yield(Head{}, err)
				return
			}
			var rel *decoding.Relation
			if t, ok := m.(*decoding.Truncate); ok {
				if x.keep != nil {
					if m = x.keepTruncate(t); m == nil {
						continue
					}
					if m != t {
						rec = nil // as in Changes
					}
				}
			} else {
				x.view.read(m)
				rel = decoding.RelationOf(&x.view, m)
			}
			c := decoding.Change{Msg: m, Relation: rel, Schema: &x.view, Raw: rec, InStream: inStream}
			if !yield(Head{Change: c, Type: h.Type}, nil) {
				return
			}
		}
	}
}

// Filter makes Changes (and Heads) yield only the row changes (Insert, Update, Delete, and a Truncate's
// relations) of the relations keep reports true for; schema descriptions and logical messages
// are yielded whatever keep says. A Truncate of several relations, some of them filtered out, is
// yielded with the others only, and with no Raw record. nil yields everything again. It is the
// consumer's, like Changes: not to be called while an iteration is in progress.
func (x *Txn) Filter(keep func(relationID uint32) bool) { x.keep = keep }

// keepTruncate returns t, a Truncate of the relations keep keeps only, or nil if it keeps none.
func (x *Txn) keepTruncate(t *decoding.Truncate) decoding.Message {
	n := 0
	for _, id := range t.RelationIDs {
		if x.keep(id) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(t.RelationIDs):
		return t
	}
	out := &decoding.Truncate{Xid: t.Xid, Options: t.Options, RelationIDs: make([]uint32, 0, n)}
	for _, id := range t.RelationIDs {
		if x.keep(id) {
			out.RelationIDs = append(out.RelationIDs, id)
		}
	}
	return out
}

// Described returns the relations the transaction's own Relation messages describe, in the
// order they came, without reading its changes: the relations a server describes again, or for
// the first time, before the first change of each in its session. A part of a transaction
// (Config.Incremental) lists the descriptions received so far.
func (x *Txn) Described() []*decoding.Relation {
	if x.released || x.data == nil {
		return nil
	}
	var out []*decoding.Relation
	for _, e := range x.data.schema {
		if r, ok := e.msg.(*decoding.Relation); ok {
			out = append(out, r)
		}
	}
	for _, m := range x.data.described() {
		if r, ok := m.(*decoding.Relation); ok {
			out = append(out, r)
		}
	}
	return out
}
