package reorderbuffer

import (
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/ilist"
)

// Releasing what was handed out: the transaction the last Next lent, released by the next Next
// or Close; those the consumer kept (Txn.Keep), released by Txn.Release on any goroutine and
// freed on the Buffer's goroutine at its next Add, Next or Close.

// keptLinks are x's place on its Buffer's list of kept transactions (Buffer.kept).
func keptLinks(x *Txn) *ilist.Links[Txn] { return &x.keptLinks }

// Keep takes x out of the Buffer's hands, so that a consumer can read it after the next Next:
// the next Next or Close does not release it, Release does. Until then x's records stay in
// memory and counted against the Buffer's limit (and Config.Memory's), and are never spilled.
// Keep is called on the Buffer's goroutine, before the next Next; from then on x is read
// without the parser the Buffer lends to the transaction it handed out (see UseParser).
//
// Only the transaction the last Next returned can be kept; for any other Keep changes nothing
// and reports false. One read back from a spill log (Spilled) keeps its file and read buffer
// (256 KiB, and with Config.SpillCompressor the compressed bytes of one block) until released,
// outside Config.WorkMem and Config.MaxOpenFiles, as the transaction Next lends does: the
// consumer bounds how many of those it keeps.
//
// Close releases the transactions still kept: they must not be read while it runs.
func (x *Txn) Keep() bool {
	b := x.b
	if b == nil || b.lent != x || x.released || x.data == nil {
		return false
	}
	b.lent = nil
	x.parser = nil
	b.keptMu.Lock()
	defer b.keptMu.Unlock()
	if b.keptDone {
		return false
	}
	x.kept = true
	b.kept.PushFront(x)
	return true
}

// Release lets go of a transaction kept with Keep: reading its changes afterwards yields
// ErrReleased. It may be called on any goroutine (the one that reads x: not while an
// iteration of x is in progress); the Buffer frees what x held at its next Add, Next or Close.
// Releasing x again, or a transaction that was not kept, does nothing.
func (x *Txn) Release() {
	b := x.b
	if b == nil {
		return
	}
	b.keptMu.Lock()
	defer b.keptMu.Unlock()
	if !x.kept {
		return
	}
	b.kept.Remove(x)
	x.kept = false
	x.released = true
	b.returned = append(b.returned, x)
	b.anyBack.Store(true)
}

// UseParser makes Changes parse with p, which the caller owns and reuses (nil: a parser of the
// transaction's own for each iteration). A consumer that reads kept transactions on a goroutine
// of its own passes the one parser it keeps there. It is the reader's, like Changes: not to be
// called while an iteration is in progress, nor on the transaction the Buffer lent its parser to
// while the consumer still reads transactions it did not keep on another goroutine.
func (x *Txn) UseParser(p *decoding.Parser) {
	if p != nil {
		p.Options = x.opts
	}
	x.parser = p
}

// Spilled reports whether some of x's records are read back from a spill log: reading x then
// holds a file and a read buffer (see Keep).
func (x *Txn) Spilled() bool { return x.src != nil }

// MemoryBytes returns the memory x's records take (the chunks that hold them): what keeping x
// holds in memory, beside the bytes its spill log holds. It is 0 once x is released.
func (x *Txn) MemoryBytes() int64 {
	if x.released || x.data == nil {
		return 0
	}
	return x.data.mem.bytes()
}

func (b *Buffer) releaseLent() error {
	x := b.lent
	b.lent = nil
	return b.release(x)
}

// release lets go of a queued or lent transaction's records and schema.
func (b *Buffer) release(x *Txn) error {
	if x == nil || x.released {
		return nil
	}
	x.released = true
	return b.letGo(x)
}

// letGo frees what a released transaction holds.
func (b *Buffer) letGo(x *Txn) error {
	x.parser = nil
	if x.src != nil {
		x.src.Close()
		x.src = nil
	}
	unshare(x.view.shared)
	x.view = view{}
	t := x.data
	x.data = nil
	return b.free(t)
}

// freeReturned frees what the kept transactions released since the last call held. An error
// (removing a spill file) fails the Buffer, as at Next.
func (b *Buffer) freeReturned() {
	b.keptMu.Lock()
	back := b.returned
	b.returned = b.spare[:0]
	b.anyBack.Store(false)
	b.keptMu.Unlock()
	for i, x := range back {
		if err := b.letGo(x); err != nil && b.err == nil {
			b.err = err
		}
		back[i] = nil
	}
	b.spare = back[:0]
}
