package reorderbuffer

// Handing out transactions in parts (Config.Incremental): a consumer that applies changes as they
// arrive, the way PostgreSQL's parallel apply workers apply a streamed transaction, gets each
// transaction's changes in pieces, in arrival order, together with what to undo.

// PartKind says what a handed-out Txn is.
type PartKind uint8

const (
	// Whole is a whole committed transaction (or a non-transactional message): what Next hands
	// out unless Config.Incremental is set.
	Whole PartKind = iota
	// PartChanges carries the changes the transaction received since its previous part. The
	// transaction has not committed: it may still roll back subtransactions or abort.
	PartChanges
	// PartSubAbort says that subtransaction SubXid rolled back, after some of its changes were
	// handed out: undo everything from its first change on (ROLLBACK TO the savepoint taken
	// before it), including the subtransactions that began after it. Changes yields nothing.
	PartSubAbort
	// PartAbort says that the transaction will not commit after parts of it were handed out: undo
	// them all. It comes for a top-level abort, a ROLLBACK PREPARED, a transaction the server
	// sends again from its start (after a restart), and one that turns out at its commit to end
	// at or before the skip position (the consumer had it already). Changes yields nothing.
	PartAbort
	// PartCommit ends the transaction: its Changes are the last ones (those not yet handed out,
	// possibly all), its fields carry the commit, and it is acknowledged with Ack like a whole
	// transaction.
	PartCommit
	// Advance is no transaction: with Config.HandOutAdvances, it says that the server has sent
	// everything up to EndLSN and that, up to there, the consumer has everything (every
	// transaction handed out before it is acknowledged, none is being received). Persist EndLSN
	// as the consumer's position, as for a transaction, then Ack it: the flush position moves to
	// EndLSN only then. Changes yields nothing; only EndLSN and CommitLSN (equal) are set. It comes
	// in any mode, Incremental or not.
	Advance
)

func (k PartKind) String() string {
	switch k {
	case Whole:
		return "whole"
	case PartChanges:
		return "changes"
	case PartSubAbort:
		return "subtransaction abort"
	case PartAbort:
		return "abort"
	case PartCommit:
		return "commit"
	case Advance:
		return "advance"
	}
	return "unknown part"
}

// partSize is how many bytes of changes a transaction receives before they are handed out in
// parts: enough that a part is worth its bookkeeping, small enough that the consumer applies
// early and memory turns over.
func partSize(limit int64) int64 {
	return min(max(limit/8, 64<<10), 8<<20)
}

// partable reports whether t hands out its changes as they arrive now.
func (b *Buffer) partable(t *xact) bool {
	return t.inc != nil && !t.inc.quiet && !t.prepared && t.replaced() == nil
}

// cut hands out what t received since its previous part as a PartChanges Txn. Its records move
// to a holder of their own (queued like a whole transaction, spilled like one if it waits), its
// subtransactions and descriptions become ones the consumer has.
func (b *Buffer) cut(t *xact) {
	p := t.inc
	h := &xact{xid: t.xid, mem: t.mem, log: t.log, streamed: t.streamed, bytes: p.partBytes}
	t.mem, t.log, p.partBytes = memlog{}, nil, 0
	if t.node.InHeap() {
		b.evict.Remove(t)
	}
	if h.mem.bytes() > 0 {
		b.evict.Push(h)
	}
	if t.subs != nil {
		if p.handed == nil {
			p.handed = &subxacts{}
		}
		for _, blk := range t.subs.spilled {
			blk.each(func(_ int, xid uint32, _ int64) { p.handed.addSpilled(xid, 0) })
		}
		for _, e := range t.subs.mem {
			p.handed.addSpilled(e.xid, 0)
		}
		t.subs = nil
	}
	// The part resolves against the current schema and what earlier parts described.
	shared := b.schema
	shared.shared++
	base := shared
	if len(p.described) > 0 {
		base = &schema{parent: shared}
		for _, m := range p.described {
			base.set(m)
		}
	}
	for _, e := range t.schema {
		p.described = append(p.described, e.msg)
	}
	t.schema = nil
	p.parts++
	b.queue = append(b.queue, &Txn{Xid: t.xid, Streamed: t.streamed, Part: PartChanges, b: b, data: h,
		view: view{base: base, shared: shared}})
}

// enqueueMark queues a part without changes (PartSubAbort, PartAbort) for t.
func (b *Buffer) enqueueMark(t *xact, kind PartKind, sub uint32) {
	shared := b.schema
	shared.shared++
	b.queue = append(b.queue, &Txn{Xid: t.xid, Streamed: t.streamed, Part: kind, SubXid: sub, b: b,
		data: &xact{xid: t.xid}, view: view{base: shared, shared: shared}})
}

// undo tells the consumer to undo t's parts, if any were handed out: t will not commit (or is
// not the consumer's to apply).
func (b *Buffer) undo(t *xact) {
	if t.inc != nil && t.inc.parts > 0 {
		t.inc.parts = 0
		b.enqueueMark(t, PartAbort, 0)
	}
}
