package reorderbuffer

import (
	"errors"
	"io"
	"iter"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

// Txn is a committed transaction handed out by Buffer.Next, a non-transactional logical message
// in its place in the stream, a part of a transaction (Config.Incremental), or an idle advance
// of the position (Advance, with Config.HandOutAdvances).
//
// Its exported fields are plain values and stay valid for good. Its changes, and the relations
// and types they refer to, can be read until the transaction is released by the next call to
// Buffer.Next or by Buffer.Close.
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

	b        *Buffer
	data     *xact // nil once released
	view     view
	seq      uint64 // in the buffer's acknowledgement queue
	pinned   bool   // a committed prepared transaction pins the flush position at its PREPARE until acknowledged
	released bool
}

// Changes yields the transaction's messages in the order the server sent them: Relation and
// Type messages (schema, before the changes that need them), Insert, Update, Delete, Truncate
// and transactional logical messages. Records are read back from the spill log, then from
// memory, one at a time, so memory stays bounded whatever the size of the transaction. Changes
// may be called again to read the transaction from the start, but not while another iteration
// of the same transaction is in progress.
//
// A yielded message, and every byte slice and tuple in it, is only valid until the next
// iteration step: the buffer reuses the memory for the next message. Call the message's Clone
// method to keep one longer.
//
// Iteration stops after the first error. Reading a transaction released by Buffer.Next or
// Buffer.Close, or calling either inside the loop, yields ErrReleased.
func (x *Txn) Changes() iter.Seq2[decoding.Message, error] {
	return func(yield func(decoding.Message, error) bool) {
		if x.released {
			yield(nil, ErrReleased)
			return
		}
		p := &decoding.Parser{Options: x.b.cfg.Decoding}
		x.view.local = nil // reading from the start
		// In parts, a streamed transaction's records keep the writer's xid.
		inStream := x.data.streamed && x.b.cfg.Incremental
		rs := newRecords(x.data, func() bool { return x.released })
		defer rs.close()
		for {
			rec, err := rs.next()
			if errors.Is(err, io.EOF) {
				return
			}
			var m decoding.Message
			if err == nil {
				m, err = p.Parse(rec, inStream)
			}
			if err != nil {
				yield(nil, err)
				return
			}
			x.view.read(m)
			if !yield(m, nil) {
				return
			}
		}
	}
}

// Relation returns the relation with the given OID as the stream described it at the current
// point of reading the changes: the description the last yielded change refers to. It reports
// false for a relation never described, and once the transaction is released.
func (x *Txn) Relation(id uint32) (*decoding.Relation, bool) {
	if x.released {
		return nil, false
	}
	return x.view.relation(id)
}

// Type returns the data type with the given OID as described by the stream's Type messages at
// the current point of reading the changes (only types that are not built in are described). It
// reports false for a type never described, and once the transaction is released.
func (x *Txn) Type(oid uint32) (*decoding.DataType, bool) {
	if x.released {
		return nil, false
	}
	return x.view.dataType(oid)
}
