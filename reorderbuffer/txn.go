package reorderbuffer

import (
	"iter"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/heap"
	"github.com/pgreorder/pgreorder/spill"
)

// txn is a transaction the buffer holds: its records (in memory, then in its spill log), the
// positions of its subtransactions, and what the server told about it so far.
type txn struct {
	node heap.Node[*txn]
	mem  memlog
	log  *spill.Log // nil until first spilled
	subs *subxacts  // nil until a subtransaction writes
	meta *txnMeta   // nil unless the transaction has an origin or is two-phase

	bytes int64 // pgoutput bytes received for it
	xid   uint32

	streamed, prepared, hasSchema, everSpilled, lent bool
}

// txnMeta holds what only some transactions have, to keep txn small: a buffer may hold 100k
// open transactions.
type txnMeta struct {
	origin     string
	originLSN  LSN
	gid        string
	prepareLSN LSN
}

func (t *txn) metadata() *txnMeta {
	if t.meta == nil {
		t.meta = &txnMeta{}
	}
	return t.meta
}

// Txn is a committed transaction handed out by Buffer.Next, or a non-transactional logical
// message in its place in the stream.
//
// Its fields stay valid for good. Its changes can be read with Changes until the next call to
// Buffer.Next or Buffer.Close, which release them.
type Txn struct {
	Xid        uint32    // top-level transaction id; 0 for a non-transactional message
	CommitLSN  LSN       // LSN of the commit record (COMMIT PREPARED's for a two-phase transaction)
	EndLSN     LSN       // end of the commit record: what to acknowledge to the server
	CommitTime time.Time // commit time reported by the server
	Origin     string    // replication origin of the transaction, if the server sent one
	OriginLSN  LSN       // the origin's commit LSN (0 for streamed transactions: pgoutput sends 0)
	GID        string    // global identifier of a two-phase transaction, "" otherwise
	Streamed   bool      // the transaction arrived as a stream (it was larger than the server's work mem)

	// NonTransactional marks a non-transactional logical message (pg_logical_emit_message with
	// transactional = false); Changes yields just that message and CommitLSN = EndLSN = its LSN.
	NonTransactional bool

	b                     *Buffer
	t                     *txn
	pin                   LSN // a committed prepared transaction pins the flush position at its PREPARE until acknowledged
	read, released, acked bool
}

// Changes yields the transaction's messages in the order the server sent them: Relation and
// Type messages (schema, before the changes that need it), Insert, Update, Delete, Truncate and
// transactional logical messages. Records are read back from the spill log, then from memory,
// one at a time, so memory stays bounded whatever the size of the transaction.
//
// A yielded message, and every byte slice in it, is valid only until the next iteration step.
// Iteration stops after the first error; reading a released transaction yields ErrReleased.
func (x *Txn) Changes() iter.Seq2[decoding.Message, error] {
	return x.changes()
}

// Relation returns the relation with the given OID as known at the current point of reading the
// changes: use it to name the table and columns of an Insert, Update or Delete.
func (x *Txn) Relation(id uint32) (*decoding.Relation, bool) {
	return x.b.rels.Relation(id)
}

// Type returns the data type with the given OID as described by the stream's Type messages at
// the current point of reading the changes (only types that are not built in are described).
func (x *Txn) Type(oid uint32) (*decoding.DataType, bool) {
	return x.b.rels.Type(oid)
}

func (x *Txn) changes() iter.Seq2[decoding.Message, error] {
	return func(yield func(decoding.Message, error) bool) {
		if x.released {
			yield(nil, ErrReleased)
			return
		}
		b, t := x.b, x.t
		err := b.eachRecord(t, func(rec []byte) error {
			m, err := b.out.Parse(rec, false)
			if err != nil {
				return err
			}
			switch m := m.(type) {
			case *decoding.Relation, *decoding.DataType:
				b.rels.Apply(m)
			}
			if !yield(m, nil) {
				return errStop
			}
			return nil
		})
		switch {
		case err == nil:
			x.read = true
		case err != errStop:
			yield(nil, err)
		}
	}
}
