package reorderbuffer

import (
	"errors"
	"io"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/heap"
	"github.com/pgreorder/pgreorder/spill"
)

// xact is a transaction the buffer holds: its records (in memory, then in its spill log), where
// its subtransactions and its schema descriptions sit among them, and what the server told
// about it so far. Once committed it is handed out inside a Txn, which owns it until released.
//
// Records are the pgoutput messages as received, without the leading xid of in-stream changes
// (it only matters for the subtransaction list). Their order is the order of arrival: records
// [0, log.Size()) are in the spill log, the rest in mem.
type xact struct {
	node   heap.Node[*xact]
	mem    memlog
	log    *spill.Log    // nil until first spilled
	subs   *subxacts     // nil until a subtransaction writes
	schema []schemaEntry // Relation and Type messages among the records, in order
	meta   *xactMeta     // nil unless the transaction has an origin or is two-phase

	bytes   int64 // pgoutput bytes received for it
	changes int64 // of its records, those that are not schema descriptions
	xid     uint32

	streamed    bool // arrived as a stream
	prepared    bool // PREPARE received; held until COMMIT PREPARED or ROLLBACK PREPARED
	pinned      bool // holds a pin of the flush position at its PREPARE (see progress)
	everSpilled bool
	lent        bool // handed out: no longer evicted
	overStream  bool // a Begin arrived while a streamed part of the same xid was open

	inc *xactParts // with Config.Incremental only
}

// xactParts is what a transaction handed out in parts (Config.Incremental) keeps besides.
type xactParts struct {
	parts     int                // parts handed out (queued or lent) since it began
	partBytes int64              // bytes received since the last part
	handed    *subxacts          // subtransactions whose first change was handed out, in order
	described []decoding.Message // descriptions handed out, in order
	quiet     bool               // commits at or before the skip position: no parts
}

// described returns the descriptions t handed out in earlier parts.
func (t *xact) described() []decoding.Message {
	if t.inc == nil {
		return nil
	}
	return t.inc.described
}

// xactMeta holds what only some transactions have, to keep xact small: a buffer may hold 100k
// open transactions.
type xactMeta struct {
	origin     string
	originLSN  decoding.LSN
	gid        string
	prepareLSN decoding.LSN
	base       *schema // prepared: the schema in effect before the PREPARE (shared)

	// replaces is the held prepared transaction this one, the same transaction sent again
	// after a restart, takes the place of (see Buffer.open).
	replaces *xact
}

// replaced returns the held prepared transaction t takes the place of, or nil.
func (t *xact) replaced() *xact {
	if t.meta == nil {
		return nil
	}
	return t.meta.replaces
}

// replace makes t take the place of old (nil: of none).
func (t *xact) replace(old *xact) {
	if old != nil || t.meta != nil {
		t.metadata().replaces = old
	}
}

func (t *xact) metadata() *xactMeta {
	if t.meta == nil {
		t.meta = &xactMeta{}
	}
	return t.meta
}

// noteSub records that subtransaction sub writes the next record, if it is the first time.
func (t *xact) noteSub(sub uint32) {
	if t.subs == nil {
		t.subs = &subxacts{}
	}
	if !t.subs.contains(sub) {
		t.subs.addMem(sub, t.mem.end())
	}
}

// spillTo appends t's in-memory records to its spill log (which must exist), moving the
// positions of subtransactions and schema descriptions along, and empties mem, offering its
// chunks to recycle. It returns the bytes written and the capacity of the chunks not recycled.
func (t *xact) spillTo(recycle func([]byte) bool) (written, released int64, err error) {
	before := t.log.Size()
	// The log frames records as memlog does (a uvarint length, then the bytes), so each chunk
	// goes to the log whole, and the record at memlog position pos lands at before+pos.
	if t.subs != nil {
		for _, m := range t.subs.mem {
			t.subs.addSpilled(m.xid, before+m.pos)
		}
	}
	for k := range t.schema {
		if !t.schema[k].spilled {
			t.schema[k].pos, t.schema[k].spilled = before+t.schema[k].pos, true
		}
	}
	for _, c := range t.mem.chunks {
		if err = t.log.AppendFramed(c.b); err != nil {
			return 0, 0, err
		}
	}
	if t.log.Size() != before+t.mem.end() {
		return 0, 0, errorf("internal error: the spill log grew by %d for %d record bytes", t.log.Size()-before, t.mem.end())
	}
	if t.subs != nil {
		t.subs.mem, t.subs.memMin, t.subs.memMax = t.subs.mem[:0], t.subs.memMin[:0], t.subs.memMax[:0]
	}
	return t.log.Size() - before, t.mem.reset(recycle), nil
}

// abortSub cuts t back to where subtransaction sub first wrote, dropping sub and every
// subtransaction that appeared after it, and the schema descriptions among the records cut. It
// reports whether sub had written (a subtransaction with no records is not in the list: nothing
// to do) and returns the capacity of the chunks not recycled.
func (t *xact) abortSub(sub uint32, recycle func([]byte) bool) (found bool, released int64, err error) {
	if t.subs == nil {
		return false, 0, nil
	}
	if i := t.subs.findMem(sub); i >= 0 {
		pos := t.subs.mem[i].pos
		released = t.mem.truncate(pos, recycle)
		t.subs.cutMem(i)
		t.cutSchema(func(e schemaEntry) bool { return !e.spilled && e.pos >= pos })
		return true, released, nil
	}
	blk, j, off := t.subs.findSpilled(sub)
	if blk < 0 {
		return false, 0, nil
	}
	if err := t.log.Truncate(off); err != nil {
		return true, 0, err
	}
	released = t.mem.reset(recycle)
	t.subs.cutSpilled(blk, j)
	t.cutSchema(func(e schemaEntry) bool { return !e.spilled || e.pos >= off })
	return true, released, nil
}

// cutSchema drops the schema entries from the first one cut reports, on: entries are in
// record order, so every later one is cut too.
func (t *xact) cutSchema(cut func(schemaEntry) bool) {
	for i, e := range t.schema {
		if cut(e) {
			clear(t.schema[i:])
			t.schema = t.schema[:i]
			return
		}
	}
}

// free lets go of t's records: memory chunks are offered to recycle (the capacity of those not
// kept is returned), the spill log is removed.
func (t *xact) free(recycle func([]byte) bool) (released int64, err error) {
	released = t.mem.reset(recycle)
	t.subs = nil
	t.schema = nil
	if t.inc != nil {
		t.inc.partBytes = 0
	}
	if t.log != nil {
		err = t.log.Remove()
		t.log = nil
	}
	return released, err
}

// records reads a transaction's records in order: the spill log's, then memory's. It checks
// before every step that the transaction was not released, so a reader that outlives the
// transaction's data gets an error instead of reading freed memory. The spill log is read with
// the handed-out transaction's own reader (src), which it rewinds and leaves open.
type records struct {
	t        *xact
	released *bool
	r        *spill.Reader
	inMem    bool
	chunk    int // memory: next record at t.mem.chunks[chunk][off:]
	off      int
}

func newRecords(t *xact, src *spill.Reader, released *bool) records {
	rs := records{t: t, released: released}
	if src != nil {
		src.Rewind()
		rs.r = src
	} else {
		rs.inMem = true
	}
	return rs
}

// next returns the next record, valid until the next call, or io.EOF after the last one.
func (rs *records) next() ([]byte, error) {
	if *rs.released {
		return nil, ErrReleased
	}
	if rs.inMem {
		// Most records: one with a length of one byte, in the chunk in hand.
		if rs.chunk < len(rs.t.mem.chunks) {
			c, off := rs.t.mem.chunks[rs.chunk].b, rs.off
			if off < len(c) {
				if n := int(c[off]); n < 0x80 && n < len(c)-off {
					end := off + 1 + n
					rs.off = end
					return c[off+1 : end : end], nil
				}
			}
		}
	} else {
		rec, err := rs.r.Next()
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, io.EOF) {
			return nil, err
		}
		rs.r = nil
		rs.inMem = true
	}
	rec, ok := rs.t.mem.at(&rs.chunk, &rs.off)
	if !ok {
		return nil, io.EOF
	}
	return rec, nil
}

// close ends the reading; the spill reader stays with its transaction.
func (rs *records) close() { rs.r = nil }
