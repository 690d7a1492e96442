package reorderbuffer

import "fmt"

// CheckInvariants verifies the buffer's internal state: the bytes counted in memory are exactly
// the chunks held by transactions (open, queued, lent, kept, released and not yet freed) plus the
// free chunks; the eviction heap
// holds exactly the transactions with memory that are not lent; the acknowledgement state is
// consistent and every pinned transaction holds one pin; schemas shared are counted.
func (b *Buffer) CheckInvariants() error {
	var sum int64
	inHeap := 0
	pins := map[uint32]int{}
	shared := map[*schema]int{}
	count := func(t *xact) error {
		sum += t.mem.bytes()
		want := t.mem.bytes() > 0 && !t.lent
		if t.node.InHeap() != want {
			return fmt.Errorf("xact %d: in heap %v, want %v (bytes %d, lent %v)", t.xid, t.node.InHeap(), want, t.mem.bytes(), t.lent)
		}
		if want {
			inHeap++
		}
		if t.pinned {
			pins[t.xid]++
		}
		if t.meta != nil && t.meta.base != nil {
			shared[t.meta.base]++
		}
		if t.prepared != (t.meta != nil && t.meta.base != nil) {
			return fmt.Errorf("xact %d: prepared %v but base schema %v", t.xid, t.prepared, t.meta != nil && t.meta.base != nil)
		}
		return nil
	}
	for xid, t := range b.xacts {
		if t.xid != xid {
			return fmt.Errorf("xact %d held under xid %d", t.xid, xid)
		}
		if t.lent {
			return fmt.Errorf("xact %d held and lent", xid)
		}
		if err := count(t); err != nil {
			return err
		}
		for old := t.replaced(); old != nil; old = old.replaced() {
			if !old.prepared || t.prepared {
				return fmt.Errorf("xact %d replaces one not held (prepared %v), or is itself prepared", xid, old.prepared)
			}
			if err := count(old); err != nil {
				return err
			}
		}
	}
	txns := b.queue
	if b.lent != nil && !b.lent.released {
		txns = append(txns[:len(txns):len(txns)], b.lent)
	}
	// Txn.Release may run meanwhile: it changes a kept transaction only under keptMu.
	b.keptMu.Lock()
	defer b.keptMu.Unlock()
	for x := b.kept.Front(); x != nil; x = b.kept.Next(x) {
		if !x.kept || !b.kept.Linked(x) {
			return fmt.Errorf("txn %d: the list of kept transactions is broken", x.Xid)
		}
		txns = append(txns[:len(txns):len(txns)], x)
	}
	for _, x := range b.returned { // released by the consumer, freed at the next Add or Next
		if !x.released || x.data == nil {
			return fmt.Errorf("txn %d returned but not released, or freed", x.Xid)
		}
		if err := count(x.data); err != nil {
			return err
		}
		shared[x.view.shared]++
	}
	for _, x := range txns {
		if x.released || x.data == nil {
			return fmt.Errorf("txn %d released while queued, lent or kept", x.Xid)
		}
		if err := count(x.data); err != nil {
			return err
		}
		if x.data.pinned {
			return fmt.Errorf("txn %d: its data still holds the pin", x.Xid)
		}
		shared[x.view.shared]++
	}
	if err := b.pool.check(); err != nil {
		return err
	}
	if !b.noAccounting && sum+b.pool.freeBytes != b.pool.mem {
		return fmt.Errorf("memory counted %d, held %d by transactions + %d free", b.pool.mem, sum, b.pool.freeBytes)
	}
	if inHeap != b.evict.Len() {
		return fmt.Errorf("heap holds %d, want %d", b.evict.Len(), inHeap)
	}
	if err := b.prog.check(); err != nil {
		return err
	}
	// Handed-out transactions not acknowledged hold pins too; they are not visible from here
	// once released, so only check that no held transaction lacks its pin.
	for xid, n := range pins {
		if pn := b.prog.pins[xid]; pn == nil || pn.refs < n {
			return fmt.Errorf("xact %d holds a pin the tracker does not have", xid)
		}
	}
	for s, n := range shared {
		if s.shared < n {
			return fmt.Errorf("schema shared by %d, counted %d", n, s.shared)
		}
	}
	return nil
}
