package reorderbuffer

import "fmt"

// CheckInvariants verifies the buffer's memory accounting: the bytes counted in memory are
// exactly the chunks held by transactions (open, queued, lent) plus the free chunks, and the
// eviction heap holds exactly the transactions with memory that are not lent.
func (b *Buffer) CheckInvariants() error {
	var sum int64
	inHeap := 0
	count := func(t *txn) error {
		sum += t.mem.bytes()
		want := t.mem.bytes() > 0 && !t.lent
		if t.node.InHeap() != want {
			return fmt.Errorf("txn %d: in heap %v, want %v (bytes %d, lent %v)", t.xid, t.node.InHeap(), want, t.mem.bytes(), t.lent)
		}
		if want {
			inHeap++
		}
		return nil
	}
	for _, t := range b.txns {
		if err := count(t); err != nil {
			return err
		}
	}
	for _, x := range b.queue {
		if err := count(x.t); err != nil {
			return err
		}
	}
	if b.lent != nil && !b.lent.released {
		if err := count(b.lent.t); err != nil {
			return err
		}
	}
	var free int64
	for k, l := range b.spare {
		for _, c := range l {
			if cap(c) != minChunk<<k || len(c) != 0 {
				return fmt.Errorf("free chunk of cap %d len %d in class %d", cap(c), len(c), k)
			}
			free += int64(cap(c))
		}
	}
	if free != b.freeBytes {
		return fmt.Errorf("free chunks hold %d bytes, counted %d", free, b.freeBytes)
	}
	if sum+free != b.mem {
		return fmt.Errorf("memory counted %d, held %d by transactions + %d free", b.mem, sum, free)
	}
	if inHeap != b.evict.Len() {
		return fmt.Errorf("heap holds %d, want %d", b.evict.Len(), inHeap)
	}
	return nil
}
