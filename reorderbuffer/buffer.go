package reorderbuffer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/heap"
	"github.com/pgreorder/pgreorder/internal/knobs"
	"github.com/pgreorder/pgreorder/spill"
)

// Buffer reorders one pgoutput stream. It is not safe for concurrent use: drive it from one
// goroutine (see the package documentation for the loop).
type Buffer struct {
	cfg   Config
	limit int64
	dec   *decoding.Decoder

	store *spill.Store
	txns  map[uint32]*txn
	evict *heap.Heap[*txn] // transactions with records in memory, most bytes on top
	cur   *txn             // receiving changes: inside a stream block, or between Begin and Commit

	queue []*Txn // finished, not yet handed out by Next, in commit order
	lent  *Txn   // handed out by the last Next; released by the next Next or Close
	rels  decoding.RelationCache
	ctl   decoding.Parser // control messages on input
	out   decoding.Parser // changes handed out

	acks      []*Txn // handed out or queued, not yet acknowledged, in commit order
	pins      []*Txn // committed prepared transactions not yet acknowledged
	held      int    // prepared transactions held (in txns)
	acked     LSN    // end LSN of the last transaction of the acknowledged prefix
	keepalive LSN    // highest walEnd of a keepalive
	reported  LSN    // highest position FlushPosition returned

	mem       int64       // bytes in memory: capacity of the chunks holding records, and of free chunks
	chunkMax  int         // largest memlog chunk: a power of two near a quarter of the limit, within [minChunk, maxChunk]
	spare     [9][][]byte // free chunks by size class: minChunk << class
	freeBytes int64
	freeCap   int64 // most bytes of free chunks kept: min(limit, DefaultWorkMem)
	stats     Stats
	err       error
	done      bool
}

// New returns a Buffer. It opens its spill store in Config.Dir, which removes the spill files
// that dead processes left there; files of its own appear only when a transaction is spilled.
func New(cfg Config) (*Buffer, error) {
	if cfg.WorkMem < 0 && cfg.WorkMem != SpillEverything {
		return nil, fmt.Errorf("reorderbuffer: invalid WorkMem %d (want bytes, 0 for the default, or SpillEverything)", cfg.WorkMem)
	}
	b := &Buffer{
		cfg:   cfg,
		limit: cfg.limit(),
		dec:   decoding.NewDecoder(cfg.Decoding),
		ctl:   decoding.Parser{Options: cfg.Decoding},
		out:   decoding.Parser{Options: cfg.Decoding},
		txns:  make(map[uint32]*txn),
		evict: heap.New(func(x, y *txn) bool { return x.mem.bytes() > y.mem.bytes() },
			func(t *txn) *heap.Node[*txn] { return &t.node }),
	}
	dir := cfg.Dir
	if dir == "" {
		dir = os.TempDir()
	}
	st, err := spill.Open(spill.Options{Dir: dir, FS: cfg.FS})
	if err != nil {
		return nil, fmt.Errorf("reorderbuffer: opening spill store: %w", err)
	}
	b.store = st
	b.chunkMax = minChunk
	for int64(b.chunkMax*2) <= b.limit/4 && b.chunkMax < maxChunk {
		b.chunkMax *= 2
	}
	b.freeCap = min(b.limit, DefaultWorkMem)
	if cfg.SkipThrough != 0 {
		b.acked = cfg.SkipThrough
	}
	return b, nil
}

// Add feeds one pgoutput message: the payload of an XLogData message and its start LSN (which
// may be 0; the buffer relies on the LSNs inside the messages). data is not retained: what the
// buffer keeps, it copies, so the caller may reuse data as soon as Add returns.
//
// Committed transactions that become ready are handed out by Next. After an error every later
// call returns an error wrapping ErrFailed.
func (b *Buffer) Add(lsn LSN, data []byte) error {
	if b.done {
		return ErrClosed
	}
	if b.err != nil {
		return fmt.Errorf("%w: %w", ErrFailed, b.err)
	}
	if err := b.add(lsn, data); err != nil {
		var typ byte
		if len(data) > 0 {
			typ = data[0]
		}
		b.err = &InputError{LSN: lsn, Type: typ, Err: err}
		return b.err
	}
	return nil
}

// Keepalive records the walEnd of a primary keepalive message. When nothing is pending, the
// flush position advances to it so that an idle slot does not hold back WAL.
func (b *Buffer) Keepalive(walEnd LSN) {
	b.keepalive = max(b.keepalive, walEnd)
}

func (b *Buffer) add(lsn LSN, data []byte) error {
	h, err := b.dec.Next(data)
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
		m, err := b.parse(data, h.InStream)
		if err != nil {
			return err
		}
		return b.nonTransactional(m.(*decoding.LogicalMessage), data)

	case decoding.MsgBegin, decoding.MsgBeginPrepare: // the GID comes again with Prepare
		b.cur = b.open(h.Xid)
	case decoding.MsgOrigin:
		m, err := b.parse(data, false)
		if err != nil {
			return err
		}
		if b.cur != nil {
			o := m.(*decoding.Origin)
			meta := b.cur.metadata()
			meta.origin, meta.originLSN = o.Name, o.CommitLSN
		}
	case decoding.MsgCommit:
		m, err := b.parse(data, false)
		if err != nil {
			return err
		}
		c := m.(*decoding.Commit)
		t := b.cur
		b.cur = nil
		return b.finish(t, c.CommitLSN, c.EndLSN, c.CommitTime, "")
	case decoding.MsgPrepare:
		m, err := b.parse(data, false)
		if err != nil {
			return err
		}
		p := m.(*decoding.Prepare)
		t := b.cur
		b.cur = nil
		return b.hold(t, p.GID, p.PrepareLSN)

	case decoding.MsgStreamStart:
		t := b.txns[h.Xid]
		if h.FirstSegment {
			if t != nil {
				// The server decodes the transaction again from its start after a restart.
				b.stats.RestartedTxns++
				b.drop(t)
			}
			t = b.open(h.Xid)
			t.streamed = true
			b.stats.StreamTxns++
		} else if t == nil {
			return fmt.Errorf("%w: stream of transaction %d continues, but its first segment was never received", ErrProtocol, h.Xid)
		}
		b.stats.StreamCount++
		b.cur = t
	case decoding.MsgStreamStop:
		b.cur = nil
	case decoding.MsgStreamAbort:
		t := b.txns[h.Xid]
		switch {
		case t == nil:
			// PostgreSQL sends aborts for transactions that never streamed; nothing to do.
		case h.SubXid == h.Xid:
			b.stats.AbortedTxns++
			b.drop(t)
		default:
			return b.abortSub(t, h.SubXid)
		}
	case decoding.MsgStreamCommit:
		m, err := b.parse(data, false)
		if err != nil {
			return err
		}
		c := m.(*decoding.StreamCommit)
		return b.finish(b.streamed(c.Xid), c.CommitLSN, c.EndLSN, c.CommitTime, "")
	case decoding.MsgStreamPrepare:
		m, err := b.parse(data, false)
		if err != nil {
			return err
		}
		p := m.(*decoding.StreamPrepare)
		return b.hold(b.streamed(p.Xid), p.GID, p.PrepareLSN)
	case decoding.MsgCommitPrepared:
		m, err := b.parse(data, false)
		if err != nil {
			return err
		}
		c := m.(*decoding.CommitPrepared)
		t := b.txns[c.Xid]
		if t == nil || !t.prepared {
			// Prepared before this session's start position and already handed out, or
			// skipped through Config.SkipThrough: nothing is held for it.
			b.stats.UnknownPrepared++
			return nil
		}
		return b.finish(t, c.CommitLSN, c.EndLSN, c.CommitTime, c.GID)
	case decoding.MsgRollbackPrepared:
		m, err := b.parse(data, false)
		if err != nil {
			return err
		}
		r := m.(*decoding.RollbackPrepared)
		if t := b.txns[r.Xid]; t != nil && t.prepared {
			b.stats.AbortedTxns++
			b.drop(t)
		}
	default:
		return fmt.Errorf("%w: unexpected message type %q", ErrProtocol, byte(h.Type))
	}
	return nil
}

// parse decodes a control message; the result is valid until the next parse.
func (b *Buffer) parse(data []byte, inStream bool) (decoding.Message, error) {
	return b.ctl.Parse(data, inStream)
}

// open starts holding a transaction, discarding an older one with the same xid.
func (b *Buffer) open(xid uint32) *txn {
	if old := b.txns[xid]; old != nil {
		b.drop(old)
	}
	t := &txn{xid: xid}
	b.txns[xid] = t
	return t
}

// streamed returns the streamed transaction xid, or an empty one when none is held: a
// transaction whose changes were all rolled back (or that ran in an earlier session) still ends
// with a Stream Commit that must be acknowledged.
func (b *Buffer) streamed(xid uint32) *txn {
	if t := b.txns[xid]; t != nil {
		return t
	}
	return b.open(xid)
}

// record appends a change (or schema message) to the transaction receiving changes.
func (b *Buffer) record(h decoding.Header, data []byte, schema bool) error {
	t := b.cur
	if t == nil { // the decoder rejects changes outside a transaction; be defensive anyway
		return fmt.Errorf("%w: change outside any transaction", ErrProtocol)
	}
	// The in-stream record keeps the type byte and the body: the writer's xid is only needed
	// for the subtransaction list below.
	head, body := data, []byte(nil)
	if h.InStream {
		if len(data) < 5 {
			return fmt.Errorf("%w: short in-stream message", ErrProtocol)
		}
		head, body = data[:1], data[5:]
	}
	// Get the record's chunk, if it needs one, before anything else: making room may spill t.
	var chunk []byte
	if size := t.mem.chunkFor(len(head)+len(body), b.chunkMax); size > 0 {
		var err error
		if chunk, err = b.getChunk(size); err != nil {
			return err
		}
	}
	if sub := h.Xid; h.InStream && sub != t.xid {
		if t.subs == nil {
			t.subs = &subxacts{}
		}
		if !t.subs.contains(sub) {
			t.subs.addMem(sub, t.mem.end())
		}
	}
	t.mem.appendRecord(chunk, head, body)
	t.bytes += int64(len(data))
	if schema {
		t.hasSchema = true
	}
	if chunk != nil {
		b.grew(t)
		if b.mem > b.limit { // the chunk alone was larger than the room left
			return b.makeRoom(0)
		}
	}
	return nil
}

// getChunk returns an empty chunk of the given capacity for a transaction's records: a free one,
// or a new one once room is made for it within the limit. Unless knobs.NoAccounting is set, its
// bytes are counted in b.mem from now on (free chunks already are).
func (b *Buffer) getChunk(size int) ([]byte, error) {
	if c := b.takeFree(size); c != nil {
		return c, nil
	}
	if !knobs.NoAccounting {
		if err := b.makeRoom(int64(size)); err != nil {
			return nil, err
		}
		if c := b.takeFree(size); c != nil { // spilling may have freed one
			return c, nil
		}
		b.mem += int64(size)
		b.stats.PeakMemoryBytes = max(b.stats.PeakMemoryBytes, b.mem)
	}
	return make([]byte, 0, size), nil
}

// Free chunks. Chunks dropped by spilling, truncation and release are kept, by size class (the
// powers of two from minChunk to chunkMax), for the next records, up to freeCap bytes: spilling
// a large transaction then turns over the same memory instead of making garbage for the
// collector. Free chunks count in b.mem like chunks in use, so the limit covers them.

func chunkClass(size int) int {
	c := 0
	for s := minChunk; s < size; s <<= 1 {
		c++
	}
	return c
}

func (b *Buffer) takeFree(size int) []byte {
	if b.freeBytes == 0 {
		return nil
	}
	k := chunkClass(size)
	if k >= len(b.spare) || minChunk<<k != size || len(b.spare[k]) == 0 {
		return nil
	}
	l := b.spare[k]
	c := l[len(l)-1]
	l[len(l)-1] = nil
	b.spare[k] = l[:len(l)-1]
	b.freeBytes -= int64(cap(c))
	return c
}

// recycle keeps c as a free chunk if there is room; it reports whether it did.
func (b *Buffer) recycle(c []byte) bool {
	n := cap(c)
	k := chunkClass(n)
	if k >= len(b.spare) || minChunk<<k != n || b.freeBytes+int64(n) > b.freeCap {
		return false
	}
	b.spare[k] = append(b.spare[k], c[:0])
	b.freeBytes += int64(n)
	return true
}

// dropFree lets go of the largest free chunk; it reports whether there was one.
func (b *Buffer) dropFree() bool {
	for k := len(b.spare) - 1; k >= 0; k-- {
		if l := b.spare[k]; len(l) > 0 {
			n := int64(cap(l[len(l)-1]))
			l[len(l)-1] = nil
			b.spare[k] = l[:len(l)-1]
			b.freeBytes -= n
			b.mem -= n
			return true
		}
	}
	return false
}

// grew keeps the eviction heap up to date after t's memory grew.
func (b *Buffer) grew(t *txn) {
	if t.lent || knobs.NoAccounting {
		return
	}
	if t.node.InHeap() {
		b.evict.Fix(t)
	} else {
		b.evict.Push(t)
	}
}

// release accounts n fewer bytes in memory (chunks let go of) after t's memory shrank.
func (b *Buffer) release(t *txn, n int64) {
	b.mem -= n
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
	for b.mem+n > b.limit {
		if n > 0 && b.freeBytes > 0 {
			if k := chunkClass(int(n)); k < len(b.spare) && minChunk<<k == int(n) && len(b.spare[k]) > 0 {
				return nil
			}
		}
		if b.dropFree() {
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
func (b *Buffer) spill(t *txn) error {
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
	before := t.log.Size()
	var subs []memSub
	if t.subs != nil {
		subs = t.subs.mem
	}
	j := 0
	var err error
	t.mem.all(func(pos int64, rec []byte) bool {
		for j < len(subs) && subs[j].pos == pos {
			t.subs.addSpilled(subs[j].xid, t.log.Size())
			j++
		}
		err = t.log.Append(rec)
		return err == nil
	})
	if err != nil {
		return err
	}
	for ; j < len(subs); j++ { // an entry past the last record (none is made, but be safe)
		t.subs.addSpilled(subs[j].xid, t.log.Size())
	}
	if t.subs != nil {
		t.subs.mem, t.subs.memMin, t.subs.memMax = t.subs.mem[:0], t.subs.memMin[:0], t.subs.memMax[:0]
	}
	b.stats.SpillCount++
	b.stats.SpillBytes += t.log.Size() - before
	b.release(t, t.mem.reset(b.recycle))
	return nil
}

// abortSub cuts t back to where subtransaction sub first wrote, dropping sub and every
// subtransaction that appeared after it. A subtransaction with no entry had no changes in the
// stream: nothing to do.
func (b *Buffer) abortSub(t *txn, sub uint32) error {
	if t.subs == nil {
		return nil
	}
	if i := t.subs.findMem(sub); i >= 0 {
		b.release(t, t.mem.truncate(t.subs.mem[i].pos, b.recycle))
		t.subs.cutMem(i)
		b.stats.AbortedSubxacts++
		return nil
	}
	blk, j, off := t.subs.findSpilled(sub)
	if blk < 0 {
		return nil
	}
	if err := t.log.Truncate(off); err != nil {
		return err
	}
	b.release(t, t.mem.reset(b.recycle))
	t.subs.cutSpilled(blk, j)
	b.stats.AbortedSubxacts++
	return nil
}

// hold keeps a prepared transaction until COMMIT PREPARED or ROLLBACK PREPARED.
//
// pgoutput counts the schema it sent with a prepared transaction as known to the client from the
// PREPARE on: transactions that commit before COMMIT PREPARED may use those relations without
// describing them again. So the transaction's Relation and Type messages take effect now, as they
// would for a consumer that applies prepared transactions (PostgreSQL's subscriber).
func (b *Buffer) hold(t *txn, gid string, prepareLSN LSN) error {
	if t.hasSchema {
		if err := b.applySchema(t); err != nil {
			return err
		}
	}
	t.prepared = true
	meta := t.metadata()
	meta.gid, meta.prepareLSN = gid, prepareLSN
	b.held++
	return nil
}

// applySchema applies t's Relation and Type messages to the relation cache, in order.
func (b *Buffer) applySchema(t *txn) error {
	return b.eachRecord(t, func(rec []byte) error {
		if typ := decoding.MessageType(rec[0]); typ != decoding.MsgRelation && typ != decoding.MsgDataType {
			return nil
		}
		m, err := decoding.Parse(rec, false, b.cfg.Decoding)
		if err != nil {
			return err
		}
		b.rels.Apply(m)
		return nil
	})
}

// errStop ends eachRecord early without an error.
var errStop = errors.New("stop")

// eachRecord calls f for every record of t in order: the spill log, then memory. rec is valid
// only during the call.
func (b *Buffer) eachRecord(t *txn, f func(rec []byte) error) error {
	if t.log != nil {
		r := t.log.NewReader()
		for {
			rec, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err == nil {
				err = f(rec)
			}
			if err != nil {
				r.Close()
				return err
			}
		}
		if err := r.Close(); err != nil {
			return err
		}
	}
	var err error
	t.mem.all(func(_ int64, rec []byte) bool {
		err = f(rec)
		return err == nil
	})
	return err
}

// finish hands a committed transaction to the queue, or drops it if the consumer already has it.
func (b *Buffer) finish(t *txn, commitLSN, endLSN LSN, at time.Time, gid string) error {
	delete(b.txns, t.xid)
	if t.prepared {
		t.prepared = false
		b.held--
	}
	if endLSN <= b.cfg.SkipThrough {
		b.stats.SkippedTxns++
		b.free(t)
		return nil
	}
	x := &Txn{
		Xid:        t.xid,
		CommitLSN:  commitLSN,
		EndLSN:     endLSN,
		CommitTime: at,
		GID:        gid,
		Streamed:   t.streamed,
		b:          b,
		t:          t,
	}
	if m := t.meta; m != nil {
		x.Origin, x.OriginLSN = m.origin, m.originLSN
		if gid != "" {
			// Until the consumer has it, the server must send it again after a restart, and
			// it only does while the confirmed position is before the PREPARE.
			x.pin = m.prepareLSN
			b.pins = append(b.pins, x)
		}
	}
	b.stats.TotalTxns++
	b.stats.TotalBytes += t.bytes
	b.queue = append(b.queue, x)
	b.acks = append(b.acks, x)
	return nil
}

// nonTransactional queues a non-transactional logical message in its place.
func (b *Buffer) nonTransactional(m *decoding.LogicalMessage, data []byte) error {
	if m.LSN <= b.cfg.SkipThrough {
		b.stats.SkippedTxns++
		return nil
	}
	t := &txn{}
	chunk, err := b.getChunk(t.mem.chunkFor(len(data), b.chunkMax))
	if err != nil {
		return err
	}
	t.mem.appendRecord(chunk, data)
	b.grew(t)
	if b.mem > b.limit {
		if err := b.makeRoom(0); err != nil {
			return err
		}
	}
	x := &Txn{EndLSN: m.LSN, CommitLSN: m.LSN, NonTransactional: true, b: b, t: t}
	b.queue = append(b.queue, x)
	b.acks = append(b.acks, x)
	return nil
}

// drop forgets a transaction that will never be handed out.
func (b *Buffer) drop(t *txn) {
	if b.txns[t.xid] == t {
		delete(b.txns, t.xid)
	}
	if b.cur == t {
		b.cur = nil
	}
	b.free(t)
}

// free releases t's memory and spill log.
func (b *Buffer) free(t *txn) {
	b.release(t, t.mem.reset(b.recycle))
	t.subs = nil
	if t.prepared {
		t.prepared = false
		b.held--
	}
	if t.log != nil {
		if err := t.log.Remove(); err != nil && b.err == nil {
			b.err = err
		}
		t.log = nil
	}
}

// Next returns the next committed transaction, in commit order, or false when none is ready.
// It releases the transaction the previous call returned: read a transaction's changes before
// calling Next again. Acknowledge each transaction with Ack once it is durably handled.
func (b *Buffer) Next() (*Txn, bool) {
	b.releaseLent()
	if b.done || len(b.queue) == 0 {
		return nil, false
	}
	x := b.queue[0]
	b.queue[0] = nil
	b.queue = b.queue[1:]
	if len(b.queue) == 0 {
		b.queue = b.queue[:0:0] // let the backing array go
	}
	x.t.lent = true
	if x.t.node.InHeap() {
		b.evict.Remove(x.t)
	}
	b.lent = x
	return x, true
}

// Pending returns the number of transactions ready to be handed out by Next.
func (b *Buffer) Pending() int { return len(b.queue) }

func (b *Buffer) releaseLent() {
	x := b.lent
	if x == nil {
		return
	}
	b.lent = nil
	if x.t.hasSchema && !x.read {
		// The consumer skipped the changes; later transactions still need the schema it carried.
		if err := b.applySchema(x.t); err != nil && b.err == nil {
			b.err = err
		}
	}
	x.released = true
	b.free(x.t)
}

// Ack records that the consumer has durably handled t. Transactions may be acknowledged in any
// order; the flush position only passes a transaction once it and all before it are acknowledged.
// Acknowledging t again does nothing. A nil t, or one another Buffer handed out, is an error
// (ErrForeignTxn) and changes nothing.
func (b *Buffer) Ack(t *Txn) error {
	if t == nil || t.b != b {
		return ErrForeignTxn
	}
	t.acked = true
	b.advanceAcks()
	return nil
}

func (b *Buffer) advanceAcks() {
	i := 0
	for ; i < len(b.acks) && b.acks[i].acked; i++ {
		b.acked = max(b.acked, b.acks[i].EndLSN)
		b.acks[i] = nil
	}
	b.acks = b.acks[i:]
	if len(b.acks) == 0 {
		b.acks = b.acks[:0:0]
	}
}

// AckedThrough returns the end LSN of the last transaction of the acknowledged prefix: that
// transaction and every one handed out before it are acknowledged (Config.SkipThrough when none
// is). It is the position a consumer may persist and resume from; the highest acknowledged end
// LSN is not, when acknowledgements come out of order.
func (b *Buffer) AckedThrough() LSN { return b.acked }

// Restart prepares the buffer for a new replication session on the same slot, after the
// connection was lost: the server will send again everything after the slot's confirmed
// position. Transactions still being received are dropped (the server sends them again from
// their start); transactions already complete (queued, handed out, or prepared and held) are
// kept, and those the server sends again are dropped instead of being handed out twice.
// Acknowledgements and the flush position carry over.
func (b *Buffer) Restart() error {
	if b.done {
		return ErrClosed
	}
	if b.err != nil {
		return fmt.Errorf("%w: %w", ErrFailed, b.err)
	}
	b.dec = decoding.NewDecoder(b.cfg.Decoding)
	for _, t := range b.txns {
		if !t.prepared {
			b.drop(t)
		}
	}
	b.cur = nil
	if n := len(b.acks); n > 0 {
		b.cfg.SkipThrough = max(b.cfg.SkipThrough, b.acks[n-1].EndLSN)
	}
	b.cfg.SkipThrough = max(b.cfg.SkipThrough, b.acked)
	return nil
}

// FlushPosition returns the position that is safe to report as flushed to the server: the end
// LSN of the last transaction that was acknowledged together with every transaction before it;
// when nothing is pending or being received, the highest keepalive position, so that an idle
// slot does not hold back WAL. A prepared transaction the buffer holds pins the position at its
// PREPARE, so that the server sends it again after a restart. The result never decreases.
func (b *Buffer) FlushPosition() LSN {
	pos := b.acked
	if len(b.acks) == 0 && !b.dec.InTransaction() { // nothing pending, no Begin…Commit half received
		pos = max(pos, b.keepalive)
	}
	if b.held > 0 {
		for _, t := range b.txns {
			if t.prepared && t.meta.prepareLSN < pos {
				pos = t.meta.prepareLSN
			}
		}
	}
	i := 0
	for _, x := range b.pins {
		if !x.acked {
			pos = min(pos, x.pin)
			b.pins[i] = x
			i++
		}
	}
	clear(b.pins[i:])
	b.pins = b.pins[:i]
	if pos < b.reported {
		pos = b.reported
	}
	b.reported = pos
	return pos
}

// Close releases every transaction and removes every spill file. It is safe to call twice.
func (b *Buffer) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if x := b.lent; x != nil {
		b.lent = nil
		x.released = true
		b.free(x.t)
	}
	for _, x := range b.queue {
		x.released = true
		b.free(x.t)
	}
	b.queue = nil
	for _, t := range b.txns {
		b.free(t)
	}
	clear(b.txns)
	b.cur = nil
	var err error
	if b.store != nil {
		err = b.store.Close()
	}
	return err
}
