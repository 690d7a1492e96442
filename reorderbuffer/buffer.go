package reorderbuffer

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/heap"
	"github.com/pgreorder/pgreorder/internal/ilist"
	"github.com/pgreorder/pgreorder/spill"
)

// Buffer reorders one pgoutput stream. It is not safe for concurrent use: drive it from one
// goroutine, or under one lock (see the package documentation for the loop). The transactions it
// hands out may be read on other goroutines meanwhile.
type Buffer struct {
	cfg  Config
	dec  *decoding.Decoder
	ctl  decoding.Parser // control messages on input
	skip decoding.LSN    // transactions ending at or before it are dropped

	store *spill.Store
	xacts map[uint32]*xact
	evict *heap.Heap[*xact] // transactions with records in memory, not lent, most bytes on top
	cur   *xact             // receiving changes: inside a stream block, or between Begin and Commit
	pool  pool

	queue []*Txn // committed (or parts), not yet handed out by Next, in commit order
	qmem  []*Txn // queue's first backing array, kept while small: reused once queue empties
	lent  *Txn   // handed out by the last Next; released by the next Next or Close
	// read parses the changes of the lent transaction, which borrows it (only one is lent at
	// a time, and it must be read before the next Next): a Parser's messages and column
	// buffers are then allocated once, not once per transaction.
	read   *decoding.Parser
	schema *schema
	seen   schema // the last description of each relation and type received, for sharing copies
	prog   progress

	// Transactions the consumer kept (Txn.Keep) and let go of (Txn.Release, on any goroutine):
	// what they hold is freed on the Buffer's goroutine, at its next Add, Next or Close.
	keptMu   sync.Mutex
	kept     ilist.List[Txn] // kept transactions (Txn.Keep), under keptMu
	returned []*Txn          // under keptMu: released, not yet freed
	spare    []*Txn          // the Buffer's: returned's previous backing array
	anyBack  atomic.Bool     // returned is not empty
	keptDone bool            // under keptMu: Close let go of every kept transaction

	stats Stats
	err   error
	done  bool

	partMax int64 // in parts: hand out what a transaction received once it is this many bytes

	noAccounting bool // benchmarks only: measure what memory accounting costs
}

// New returns a Buffer. It opens its spill store in Config.Dir, which removes the spill files
// that dead processes left there; files of its own appear only when a transaction is spilled.
func New(cfg Config) (*Buffer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Buffer{
		cfg:     cfg,
		dec:     decoding.NewDecoder(cfg.Decoding),
		ctl:     decoding.Parser{Options: cfg.Decoding},
		skip:    cfg.SkipThrough,
		xacts:   make(map[uint32]*xact),
		pool:    newPool(cfg.limit(), cfg.Memory),
		schema:  &schema{},
		prog:    newProgress(cfg.SkipThrough, cfg.HandOutAdvances),
		partMax: partSize(cfg.limit()),
		qmem:    make([]*Txn, 0, 8),
		kept:    ilist.New(keptLinks),
		evict: heap.New(func(x, y *xact) bool { return x.mem.bytes() > y.mem.bytes() },
			func(t *xact) *heap.Node[*xact] { return &t.node }),
	}
	b.queue = b.qmem
	dir := cfg.Dir
	if dir == "" {
		dir = os.TempDir()
	}
	st, err := spill.Open(spill.Options{Dir: dir, FS: cfg.FS, MaxOpenFiles: cfg.MaxOpenFiles, Compressor: cfg.SpillCompressor})
	if err != nil {
		return nil, fmt.Errorf("reorderbuffer: opening spill store: %w", err)
	}
	b.store = st
	return b, nil
}

// Add feeds one pgoutput message: the payload of an XLogData message and its start LSN (which
// may be 0; the buffer relies on the LSNs inside the messages). data is not retained: what the
// buffer keeps, it copies, so the caller may reuse data as soon as Add returns.
//
// Committed transactions that become ready are handed out by Next. After an error every later
// call returns an error wrapping ErrFailed.
func (b *Buffer) Add(lsn decoding.LSN, data []byte) error {
	if b.anyBack.Load() {
		b.freeReturned()
	}
	if b.err == nil && !b.done && b.addRow(data) {
		b.prog.receive(lsn)
		return nil
	}
	if err := b.usable(); err != nil {
		return err
	}
	if err := b.add(lsn, data); err != nil {
		var typ decoding.MessageType
		if len(data) > 0 {
			typ = decoding.MessageType(data[0])
		}
		b.err = &InputError{LSN: lsn, Type: typ, Err: err}
		return b.err
	}
	b.prog.receive(lsn)
	return nil
}

// usable returns the error every input call must return before doing anything.
func (b *Buffer) usable() error {
	if b.done {
		return ErrClosed
	}
	if b.err != nil {
		return fmt.Errorf("%w: %w", ErrFailed, b.err)
	}
	return nil
}

// Keepalive records the walEnd of a primary keepalive message: the server has sent everything
// before it. When nothing is pending, the flush position advances to it so that an idle slot
// does not hold back WAL; with Config.HandOutAdvances, only through an Advance (QueueAdvance).
func (b *Buffer) Keepalive(walEnd decoding.LSN) {
	b.prog.keepalive = max(b.prog.keepalive, walEnd)
	b.prog.receive(walEnd)
}

// QueueAdvance queues an Advance to the last keepalive position for Next to hand out, and
// reports whether it did: with Config.HandOutAdvances, when nothing is queued, every transaction
// handed out is acknowledged, none is being received, and the keepalive position is past the
// acknowledged prefix. The consumer persists the Advance's EndLSN and acknowledges it; until then
// no other Advance is queued. The buffer has no clock: the caller decides how often an idle
// position is worth persisting (package replication does it at most once per status interval).
// Without HandOutAdvances it does nothing.
func (b *Buffer) QueueAdvance() bool {
	if !b.cfg.HandOutAdvances || b.usable() != nil || len(b.queue) > 0 {
		return false
	}
	pos, ok := b.prog.idleAdvance(b.dec.InTransaction())
	if !ok {
		return false
	}
	base := b.schema
	base.shared++
	x := &Txn{EndLSN: pos, CommitLSN: pos, Part: Advance, b: b, data: &xact{}, view: view{base: base, shared: base}}
	x.seq = b.prog.enqueue(pos)
	b.queue = append(b.queue, x)
	return true
}

func (b *Buffer) add(lsn decoding.LSN, data []byte) error {
	h, err := b.dec.Accept(data)
	if err != nil {
		return err
	}
	if h.InStream {
		b.stats.StreamBytes += int64(len(data))
	}
	switch h.Type {
	case decoding.MsgInsert, decoding.MsgUpdate, decoding.MsgDelete, decoding.MsgTruncate:
		return b.record(h, data, false)
	case decoding.MsgRelation, decoding.MsgDataType:
		return b.record(h, data, true)
	case decoding.MsgLogicalMessage:
		if h.Transactional {
			return b.record(h, data, false)
		}
		m, err := b.ctl.Parse(data, h.InStream)
		if err != nil {
			return err
		}
		return b.nonTransactional(m.(*decoding.LogicalMessage), data)

	case decoding.MsgBegin, decoding.MsgBeginPrepare: // the GID comes again with Prepare
		old := b.xacts[h.Xid]
		overStream := old != nil && old.streamed && !old.prepared
		before := false // committed (or prepared) at or before the skip position
		if overStream || b.cfg.Incremental {
			m, err := b.ctl.Parse(data, false)
			if err != nil {
				return err
			}
			final := decoding.LSN(0) // the commit (or prepare) LSN
			if begin, ok := m.(*decoding.Begin); ok {
				final = begin.FinalLSN
			} else {
				final = m.(*decoding.BeginPrepare).PrepareLSN
			}
			before = final < b.skip
			// One session never sends a transaction both streamed and whole: a new session
			// was fed without Restart. Harmless only if the consumer has the transaction.
			if overStream && !before {
				return fmt.Errorf("%w: transaction %d (commit %s) begins whole while a streamed part of it is open: "+
					"a new replication session was fed without Buffer.Restart", ErrProtocol, h.Xid, final)
			}
		}
		t := b.open(h.Xid)
		t.overStream = overStream
		if b.cfg.Incremental && h.Type == decoding.MsgBegin {
			// Handing it out in parts would only make the consumer undo them.
			t.inc.quiet = before
		}
		b.cur = t
	case decoding.MsgOrigin:
		m, err := b.ctl.Parse(data, false)
		if err != nil {
			return err
		}
		if b.cur != nil {
			o := m.(*decoding.Origin)
			meta := b.cur.metadata()
			meta.origin, meta.originLSN = o.Name, o.CommitLSN
		}
	case decoding.MsgCommit:
		m, err := b.ctl.Parse(data, false)
		if err != nil {
			return err
		}
		c := m.(*decoding.Commit)
		t := b.cur
		b.cur = nil
		if t == nil { // the decoder rejects a Commit without Begin; be defensive anyway
			return fmt.Errorf("%w: Commit outside any transaction", ErrProtocol)
		}
		if t.overStream && c.EndLSN > b.skip { // the skip position falls inside its commit record
			return fmt.Errorf("%w: transaction %d (end %s) arrived whole while a streamed part of it was open: "+
				"a new replication session was fed without Buffer.Restart", ErrProtocol, t.xid, c.EndLSN)
		}
		return b.finish(t, c.CommitLSN, c.EndLSN, c.CommitTime, "")
	case decoding.MsgPrepare:
		m, err := b.ctl.Parse(data, false)
		if err != nil {
			return err
		}
		p := m.(*decoding.Prepare)
		t := b.cur
		b.cur = nil
		if t == nil {
			return fmt.Errorf("%w: Prepare outside any transaction", ErrProtocol)
		}
		return b.hold(t, p.GID, p.PrepareLSN, p.EndLSN)

	case decoding.MsgStreamStart:
		t := b.xacts[h.Xid]
		switch {
		case h.FirstSegment:
			// The server decodes a transaction again from its start after a restart.
			t = b.open(h.Xid)
			t.streamed = true
			b.stats.StreamTxns++
		case t == nil:
			return &MissingError{Xid: h.Xid, LSN: lsn, What: "a stream continues, but its first segment was never received"}
		case t.prepared:
			return fmt.Errorf("%w: stream of transaction %d continues after its PREPARE", ErrProtocol, h.Xid)
		}
		b.stats.StreamCount++
		b.cur = t
	case decoding.MsgStreamStop:
		if t := b.cur; t != nil && b.partable(t) && t.inc.partBytes > 0 {
			b.cut(t)
		}
		b.cur = nil
	case decoding.MsgStreamAbort:
		t := b.xacts[h.Xid]
		switch {
		case t == nil || t.prepared:
			// PostgreSQL sends aborts for transactions that never streamed; nothing to do. A
			// prepared transaction ends with COMMIT PREPARED or ROLLBACK PREPARED only.
		case h.SubXid == h.Xid:
			b.stats.AbortedTxns++
			b.undo(t)
			return b.drop(t)
		default:
			return b.abortSub(t, h.SubXid)
		}
	case decoding.MsgStreamCommit:
		m, err := b.ctl.Parse(data, false)
		if err != nil {
			return err
		}
		c := m.(*decoding.StreamCommit)
		t := b.xacts[c.Xid]
		if t == nil || !t.streamed || t.prepared {
			return b.missing(c.Xid, "", c.CommitLSN, c.EndLSN, "Stream Commit")
		}
		return b.finish(t, c.CommitLSN, c.EndLSN, c.CommitTime, "")
	case decoding.MsgStreamPrepare:
		m, err := b.ctl.Parse(data, false)
		if err != nil {
			return err
		}
		p := m.(*decoding.StreamPrepare)
		t := b.xacts[p.Xid]
		if t == nil || !t.streamed || t.prepared {
			return b.missing(p.Xid, p.GID, p.PrepareLSN, p.EndLSN, "Stream Prepare")
		}
		return b.hold(t, p.GID, p.PrepareLSN, p.EndLSN)
	case decoding.MsgCommitPrepared:
		m, err := b.ctl.Parse(data, false)
		if err != nil {
			return err
		}
		c := m.(*decoding.CommitPrepared)
		t := b.xacts[c.Xid]
		if t == nil || !t.prepared {
			return b.missing(c.Xid, c.GID, c.CommitLSN, c.EndLSN, "COMMIT PREPARED")
		}
		return b.finish(t, c.CommitLSN, c.EndLSN, c.CommitTime, c.GID)
	case decoding.MsgRollbackPrepared:
		m, err := b.ctl.Parse(data, false)
		if err != nil {
			return err
		}
		r := m.(*decoding.RollbackPrepared)
		b.prog.receive(r.RollbackEndLSN)
		if t := b.xacts[r.Xid]; t != nil && t.prepared {
			b.stats.AbortedTxns++
			b.undo(t)
			return b.drop(t)
		}
		// Prepared before the resume position and rolled back after it: nothing was handed out.
	default:
		return fmt.Errorf("%w: unexpected message type %v", ErrProtocol, h.Type)
	}
	return nil
}

// missing handles the end of a transaction the buffer does not hold: harmless when the
// transaction ends at or before the skip position (the consumer has it), data lost upstream of
// the buffer otherwise.
func (b *Buffer) missing(xid uint32, gid string, lsn, end decoding.LSN, what string) error {
	if end <= b.skip {
		b.stats.SkippedTxns++
		b.prog.receive(end)
		return nil
	}
	return &MissingError{Xid: xid, GID: gid, LSN: lsn, What: what + " of a transaction whose changes were never received"}
}

// open starts holding a transaction, replacing an older one with the same xid (the server sends
// a transaction again from its start after a restart). A held prepared transaction stays held
// while it is received again: when the replacement reaches its PREPARE it is dropped and the held
// one kept, and if it is dropped earlier (a Restart while it is received again) the held one is
// simply back. Either way the pin that keeps the flush position before the PREPARE never lapses.
func (b *Buffer) open(xid uint32) *xact {
	t := &xact{xid: xid}
	if b.cfg.Incremental {
		t.inc = &xactParts{}
	}
	if old := b.xacts[xid]; old != nil {
		switch {
		case old.prepared:
			delete(b.xacts, xid)
			t.replace(old)
		default:
			t.replace(old.replaced())
			old.replace(nil)
			b.stats.RestartedTxns++
			b.undo(old)
			b.dropErr(old)
		}
	}
	b.xacts[xid] = t
	return t
}

// dropErr drops t, keeping an error for the next call (open has no error to return; the
// removal of a spill log is the only thing that can fail).
func (b *Buffer) dropErr(t *xact) {
	if err := b.drop(t); err != nil && b.err == nil {
		b.err = err
	}
}

// settle lets go of the held prepared transaction t replaces, if any, when t ends otherwise
// than by a PREPARE (which the server would not do for the same transaction).
func (b *Buffer) settle(t *xact) error {
	old := t.replaced()
	if old == nil {
		return nil
	}
	t.replace(nil)
	b.stats.RestartedTxns++
	return b.drop(old)
}

// addRow is add of a row change (Insert, Update, Delete), the bulk of a stream, when the
// decoder accepts it and its record fits in the last chunk of the transaction receiving changes:
// what record does then, without the rest of add and record. It reports false, having changed
// nothing, for anything else, which add takes (a row change the decoder accepted, accepted again
// there: it changes no decoder state).
func (b *Buffer) addRow(data []byte) bool {
	t := b.cur
	if t == nil || len(data) == 0 {
		return false
	}
	switch decoding.MessageType(data[0]) {
	case decoding.MsgInsert, decoding.MsgUpdate, decoding.MsgDelete:
	default:
		return false
	}
	h, err := b.dec.Accept(data)
	if err != nil {
		return false
	}
	head, body, err := b.split(h, data)
	if err != nil || t.mem.chunkFor(len(head)+len(body), b.pool.chunkMax) > 0 {
		return false
	}
	if h.InStream {
		b.stats.StreamBytes += int64(len(data))
	}
	b.put(t, h, data, head, body, nil, nil) // no new chunk: it cannot fail
	return true
}

// record appends a change (or schema message) to the transaction receiving changes.
func (b *Buffer) record(h decoding.Header, data []byte, schema bool) error {
	t := b.cur
	if t == nil { // the decoder rejects changes outside a transaction; be defensive anyway
		return fmt.Errorf("%w: change outside any transaction", ErrProtocol)
	}
	var desc decoding.Message
	if schema {
		m, err := decoding.Parse(data, h.InStream, b.cfg.Decoding)
		if err != nil {
			return err
		}
		// The in-stream xid names the change that needed the description; what is handed
		// out is read back from records without it.
		switch v := m.(type) {
		case *decoding.Relation:
			v.Xid = 0
		case *decoding.DataType:
			v.Xid = 0
		}
		// Every streamed transaction describes again each relation it uses: keep one copy of
		// each description, shared by the transactions that carry it.
		if b.seen.describes(m) {
			m = b.seen.lookup(m)
		} else {
			b.seen.set(m)
		}
		desc = m
	}
	head, body, err := b.split(h, data)
	if err != nil {
		return err
	}
	// Get the record's chunk, if it needs one, before anything else: making room may spill t.
	var chunk []byte
	if size := t.mem.chunkFor(len(head)+len(body), b.pool.chunkMax); size > 0 {
		var err error
		if chunk, err = b.getChunk(size); err != nil {
			return err
		}
	}
	return b.put(t, h, data, head, body, chunk, desc)
}

// split returns the record of a change or schema message: for an in-stream message of a
// transaction handed out whole, its type byte (head) and its body past the writer's xid, which
// only the subtransaction list needs; else the message itself (head). Handed out in parts, a
// streamed transaction's changes keep the xid: the consumer undoes a subtransaction's changes
// itself.
func (b *Buffer) split(h decoding.Header, data []byte) (head, body []byte, err error) {
	if !h.InStream || b.cfg.Incremental {
		return data, nil, nil
	}
	if len(data) < 5 {
		return nil, nil, fmt.Errorf("%w: short in-stream message", ErrProtocol)
	}
	return data[:1], data[5:], nil
}

// put appends the record head+body of message data to t, the transaction receiving changes,
// into chunk when the record needed a new one (taken by getChunk), else into t's last chunk;
// desc is the description a schema message carries, nil for a change. Only with a new chunk can
// it fail (making room).
func (b *Buffer) put(t *xact, h decoding.Header, data, head, body, chunk []byte, desc decoding.Message) error {
	if sub := h.Xid; h.InStream && sub != t.xid {
		t.noteSub(sub)
	}
	if desc != nil {
		t.schema = append(t.schema, schemaEntry{msg: desc, pos: t.mem.end()})
	}
	t.mem.appendRecord2(chunk, head, body)
	t.bytes += int64(len(data))
	if desc == nil {
		t.changes++
	}
	if t.inc != nil {
		t.inc.partBytes += int64(len(data))
	}
	if chunk != nil {
		b.grew(t)
		if b.pool.over(0) { // the chunk alone was larger than the room left
			if err := b.makeRoom(0); err != nil {
				return err
			}
		}
	}
	if b.partable(t) && t.inc.partBytes >= b.partMax {
		b.cut(t)
	}
	return nil
}

// getChunk returns an empty chunk of the given capacity for a transaction's records: a free one,
// or a new one once room is made for it within the limit.
func (b *Buffer) getChunk(size int) ([]byte, error) {
	if c := b.pool.takeFree(size); c != nil {
		return c, nil
	}
	if b.noAccounting {
		return make([]byte, 0, size), nil
	}
	if err := b.makeRoom(int64(size)); err != nil {
		return nil, err
	}
	if c := b.pool.takeFree(size); c != nil { // spilling may have freed one
		return c, nil
	}
	return b.pool.alloc(size), nil
}

// grew keeps the eviction heap up to date after t's memory grew.
func (b *Buffer) grew(t *xact) {
	if t.lent || b.noAccounting {
		return
	}
	if t.node.InHeap() {
		b.evict.Fix(t)
	} else {
		b.evict.Push(t)
	}
}

// recycle offers a chunk a transaction lets go of to the pool.
func (b *Buffer) recycle(c []byte) bool {
	return !b.noAccounting && b.pool.recycle(c)
}

// released accounts n fewer bytes in memory (chunks let go of) after t's memory shrank.
func (b *Buffer) released(t *xact, n int64) {
	if !b.noAccounting {
		b.pool.release(n)
	}
	if t.node.InHeap() {
		if t.mem.bytes() == 0 {
			b.evict.Remove(t)
		} else {
			b.evict.Fix(t)
		}
	}
}

// makeRoom frees memory until n more bytes fit within the limit: first free chunks, then by
// spilling the transaction with the most bytes in memory; it stops early when a free chunk of
// size n appears (spilling frees chunks) or nothing is left to free.
func (b *Buffer) makeRoom(n int64) error {
	for b.pool.over(n) {
		if n > 0 && b.pool.hasFree(int(n)) {
			return nil
		}
		if b.pool.dropFree() {
			continue
		}
		t, ok := b.evict.Peek()
		if !ok {
			return nil
		}
		if err := b.spill(t); err != nil {
			return err
		}
	}
	return nil
}

// spill appends t's in-memory records to its spill log and frees them.
func (b *Buffer) spill(t *xact) error {
	if t.log == nil {
		l, err := b.store.Create()
		if err != nil {
			return err
		}
		t.log = l
	}
	if !t.everSpilled {
		t.everSpilled = true
		b.stats.SpillTxns++
	}
	written, released, err := t.spillTo(b.recycle)
	if err != nil {
		return err
	}
	b.stats.SpillCount++
	b.stats.SpillBytes += written
	b.released(t, released)
	return nil
}

// abortSub cuts t back to where subtransaction sub first wrote. In parts, if that was in a part
// already handed out, the consumer is told to undo it, and what t holds goes (it all came after).
func (b *Buffer) abortSub(t *xact, sub uint32) error {
	if t.inc != nil && t.inc.handed != nil {
		if blk, j, _ := t.inc.handed.findSpilled(sub); blk >= 0 {
			t.inc.handed.cutSpilled(blk, j)
			released, err := t.free(b.recycle)
			b.released(t, released)
			if err != nil {
				return err
			}
			b.stats.AbortedSubxacts++
			b.enqueueMark(t, PartSubAbort, sub)
			return nil
		}
	}
	found, released, err := t.abortSub(sub, b.recycle)
	b.released(t, released)
	if err != nil {
		return err
	}
	if found {
		b.stats.AbortedSubxacts++
	}
	return nil
}

// hold keeps a prepared transaction until COMMIT PREPARED or ROLLBACK PREPARED, pinning the
// flush position at its PREPARE.
//
// pgoutput counts the schema it sent with a prepared transaction as known to the client from the
// PREPARE on: transactions that commit before COMMIT PREPARED may use those relations without
// describing them again. So the transaction's descriptions take effect now, in stream order.
func (b *Buffer) hold(t *xact, gid string, prepareLSN, endLSN decoding.LSN) error {
	b.prog.receive(endLSN)
	if old := t.replaced(); old != nil {
		// The same prepared transaction, sent again after a restart: the one held has it all
		// (and, handed out in parts, what the consumer applied), so keep that one.
		t.replace(nil)
		b.xacts[t.xid] = old
		b.stats.RestartedTxns++
		return b.free(t)
	}
	if endLSN <= b.skip && prepareLSN < b.prog.reported {
		// Sent again after a restart, and already finished: the flush position never passes
		// the PREPARE of a prepared transaction the consumer has not finished (the pin), so one
		// that arrives below it was committed or rolled back, and handed out, before. Holding
		// it would keep its parts open for a COMMIT PREPARED the server need not send again.
		b.stats.SkippedTxns++
		b.undo(t)
		return b.free(t)
	}
	t.prepared = true
	meta := t.metadata()
	meta.gid, meta.prepareLSN = gid, prepareLSN
	meta.base = b.describe(t)
	if !t.pinned {
		t.pinned = true
		b.prog.pin(t.xid, prepareLSN)
	}
	return nil
}

// describe makes t's schema descriptions take effect and returns the schema in effect before
// them, shared by the caller (release it with unshare).
//
// A streamed transaction describes again every relation it uses; that changes nothing unless the
// description differs, so the current schema is copied (because the caller shares it) only when
// one does.
func (b *Buffer) describe(t *xact) *schema {
	base := b.schema
	base.shared++
	msgs := t.described()
	for _, e := range t.schema {
		msgs = append(msgs[:len(msgs):len(msgs)], e.msg)
	}
	for i, m := range msgs {
		if b.schema.describes(m) {
			continue
		}
		if b.schema == base {
			b.schema = base.clone()
		}
		for _, m := range msgs[i:] {
			b.schema.set(m)
		}
		break
	}
	return base
}

func unshare(s *schema) {
	if s != nil {
		s.shared--
	}
}

// sharedOf returns the schema whose share a view with base holds: base, or the current-schema
// snapshot a transaction's own earlier descriptions are layered on.
func sharedOf(base *schema) *schema {
	for base.parent != nil {
		base = base.parent
	}
	return base
}

// finish hands a committed transaction to the queue, or drops it if the consumer already has it.
func (b *Buffer) finish(t *xact, commitLSN, endLSN decoding.LSN, at time.Time, gid string) error {
	delete(b.xacts, t.xid)
	if err := b.settle(t); err != nil {
		return err
	}
	var base *schema
	if t.prepared {
		base = t.meta.base
		t.meta.base, t.prepared = nil, false
	} else {
		base = b.describe(t)
	}
	if endLSN <= b.skip {
		b.stats.SkippedTxns++
		b.prog.receive(endLSN)
		unshare(base)
		if t.pinned {
			t.pinned = false
			b.prog.unpin(t.xid)
		}
		b.undo(t) // parts handed out before the commit showed it was the consumer's already
		return b.free(t)
	}
	if d := t.described(); len(d) > 0 { // the descriptions of earlier parts come first
		local := &schema{parent: base}
		for _, m := range d {
			local.set(m)
		}
		base, local.shared = local, 0
	}
	x := &Txn{
		Xid:        t.xid,
		CommitLSN:  commitLSN,
		EndLSN:     endLSN,
		CommitTime: at,
		GID:        gid,
		Streamed:   t.streamed,
		b:          b,
		data:       t,
		view:       view{base: base, shared: sharedOf(base)},
		pinned:     t.pinned,
	}
	if b.cfg.Incremental {
		x.Part = PartCommit
	}
	t.pinned = false
	if m := t.meta; m != nil {
		x.Origin, x.OriginLSN = m.origin, m.originLSN
	}
	x.seq = b.prog.enqueue(endLSN)
	b.stats.TotalTxns++
	b.stats.TotalBytes += t.bytes
	b.stats.TotalChanges += t.changes
	b.queue = append(b.queue, x)
	return nil
}

// nonTransactional queues a non-transactional logical message in its place.
func (b *Buffer) nonTransactional(m *decoding.LogicalMessage, data []byte) error {
	if m.LSN <= b.skip {
		b.stats.SkippedTxns++
		return nil
	}
	t := &xact{}
	chunk, err := b.getChunk(t.mem.chunkFor(len(data), b.pool.chunkMax))
	if err != nil {
		return err
	}
	t.mem.appendRecord(chunk, data)
	b.grew(t)
	if b.pool.over(0) {
		if err := b.makeRoom(0); err != nil {
			return err
		}
	}
	base := b.schema
	base.shared++
	x := &Txn{EndLSN: m.LSN, CommitLSN: m.LSN, NonTransactional: true, b: b, data: t, view: view{base: base, shared: base}}
	x.seq = b.prog.enqueue(m.LSN)
	b.queue = append(b.queue, x)
	return nil
}

// drop forgets a transaction that will never be handed out. If it was replacing a held
// prepared transaction, that one is held again.
func (b *Buffer) drop(t *xact) error {
	if b.xacts[t.xid] == t {
		delete(b.xacts, t.xid)
		if old := t.replaced(); old != nil {
			t.replace(nil)
			b.xacts[t.xid] = old
		}
	}
	if b.cur == t {
		b.cur = nil
	}
	if t.pinned {
		t.pinned = false
		b.prog.unpin(t.xid)
	}
	if t.meta != nil {
		unshare(t.meta.base)
		t.meta.base = nil
	}
	return b.free(t)
}

// free releases t's memory and spill log, and those of the transaction it replaces, if any.
func (b *Buffer) free(t *xact) error {
	var errs []error
	for ; t != nil; t = t.replaced() {
		released, err := t.free(b.recycle)
		b.released(t, released)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing a spill log: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Next returns the next committed transaction, in commit order, or false when none is ready.
// It releases the transaction the previous call returned: read a transaction's changes before
// calling Next again (also when they are read on another goroutine: Next must not run while
// they are). Acknowledge each transaction with Ack once it is durably handled.
func (b *Buffer) Next() (*Txn, bool) {
	if err := b.releaseLent(); err != nil && b.err == nil {
		b.err = err
	}
	if b.anyBack.Load() {
		b.freeReturned()
	}
	if m := b.pool.shared; m != nil && m.short.Load() && m.short.Swap(false) && !b.noAccounting {
		for b.pool.dropFree() { // the consumer was refused room: give it what lies idle
		}
	}
	if b.done || len(b.queue) == 0 {
		return nil, false
	}
	x := b.queue[0]
	b.queue[0] = nil
	b.queue = b.queue[1:]
	if len(b.queue) == 0 {
		// Start again at the front of the first backing array (a larger one the queue grew
		// into goes), cleared of the transactions the queue may have taken with it.
		clear(b.qmem[:cap(b.qmem)])
		b.queue = b.qmem[:0]
	}
	x.data.lent = true
	if x.data.node.InHeap() {
		b.evict.Remove(x.data)
	}
	// The transaction gets what reading it needs now, so that reading touches nothing of the
	// buffer: its spill log flushed, with a file and a read buffer of its own.
	if l := x.data.log; l != nil && l.Size() > 0 {
		x.src = l.OpenReader()
	}
	x.opts, x.incremental = b.cfg.Decoding, b.cfg.Incremental
	if b.read == nil {
		b.read = &decoding.Parser{Options: b.cfg.Decoding}
	}
	x.parser = b.read
	b.lent = x
	return x, true
}

// Pending returns the number of transactions ready to be handed out by Next.
func (b *Buffer) Pending() int { return len(b.queue) }

// Ack records that the consumer has durably handled t. Transactions may be acknowledged in any
// order; the flush position only passes a transaction once it and all before it are acknowledged.
// Acknowledging t again does nothing. A nil t, or one another Buffer handed out, is an error
// (ErrForeignTxn) and changes nothing, and so is acknowledging a part that does not commit
// (ErrNotCommit).
func (b *Buffer) Ack(t *Txn) error {
	if t == nil || t.b != b {
		return ErrForeignTxn
	}
	if t.Part != Whole && t.Part != PartCommit && t.Part != Advance {
		return fmt.Errorf("%w (a %v part)", ErrNotCommit, t.Part)
	}
	if b.prog.ack(t.seq) && t.pinned {
		b.prog.unpin(t.Xid)
	}
	return nil
}

// AckedThrough returns the end LSN of the last transaction of the acknowledged prefix: that
// transaction and every one handed out before it are acknowledged (Config.SkipThrough when none
// is). It is the position a consumer may persist and resume from; the highest acknowledged end
// LSN is not, when acknowledgements come out of order.
func (b *Buffer) AckedThrough() decoding.LSN { return b.prog.acked }

// FlushPosition returns the position that is safe to report as flushed to the server: the end
// LSN of the last transaction (or Advance) that was acknowledged together with every one before
// it; without Config.HandOutAdvances, when nothing is pending or being received, the highest
// keepalive position, so that an idle slot does not hold back WAL. A prepared transaction the buffer holds, or that was handed out
// and is not acknowledged, pins the position at its PREPARE, so that the server sends it again
// after a restart. The position never exceeds what was received (the LSNs passed to Add and
// Keepalive and those inside the messages) and never decreases.
func (b *Buffer) FlushPosition() decoding.LSN {
	return b.prog.flush(b.dec.InTransaction())
}

// Restart prepares the buffer for a new replication session on the same slot, after the
// connection was lost: the server will send again everything after the slot's confirmed
// position. Transactions still being received are dropped (the server sends them again from
// their start); complete ones (queued, handed out, or prepared and held) are kept, and those
// the server sends again are dropped instead of being handed out twice. Acknowledgements, pins
// and the flush position carry over.
func (b *Buffer) Restart() error {
	if err := b.usable(); err != nil {
		return err
	}
	b.dec = decoding.NewDecoder(b.cfg.Decoding)
	b.cur = nil
	for _, t := range b.xacts {
		if !t.prepared {
			b.undo(t)
			if err := b.drop(t); err != nil {
				b.err = err
				return err
			}
		}
	}
	b.skip = max(b.skip, b.prog.lastEnqueued())
	return nil
}

// Close releases every transaction and removes every spill file. It is safe to call twice.
func (b *Buffer) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	errs := []error{b.releaseLent()}
	b.keptMu.Lock()
	b.keptDone = true
	var kept []*Txn
	for x := b.kept.Front(); x != nil; x = b.kept.Next(x) {
		kept = append(kept, x)
	}
	for _, x := range kept {
		b.kept.Remove(x)
		x.kept = false
	}
	back := b.returned
	b.returned = nil
	b.keptMu.Unlock()
	for _, x := range kept {
		errs = append(errs, b.release(x))
	}
	for _, x := range back {
		errs = append(errs, b.letGo(x))
	}
	for _, x := range b.queue {
		errs = append(errs, b.release(x))
	}
	b.queue = nil
	for _, t := range b.xacts {
		errs = append(errs, b.free(t))
	}
	clear(b.xacts)
	b.cur = nil
	if b.store != nil {
		errs = append(errs, b.store.Close())
	}
	if !b.noAccounting {
		b.pool.close()
	}
	return errors.Join(errs...)
}
