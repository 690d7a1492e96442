// Package schedule holds what apply's Eager and Parallel modes schedule their transactions with,
// none of it touching a server: the commit order (Order), the queues that hand a transaction's
// changes to its worker (Queue, over a shared memory Budget and spill files), the state machine
// a worker applies a queue's records with (RunJob, over a JobTarget), the dependency tracker of
// Parallel (Tracker), which says what each transaction must wait for, and the watchdog's rule
// for the lock waits the target cannot see as deadlocks (LockWatch).
package schedule

import (
	"context"
	"sync"
)

// Order hands out commit sequence numbers, in the source's commit order, and tracks which of
// them committed on the target. In source commit order each transaction commits only after the
// one before it (Wait(seq-1), then Finish(seq)): the target commits in the source's order
// whichever connection applies what, and the progress row only moves forward. A transaction may
// also finish ahead of earlier ones (relaxed commit order, or one found already applied): Finish
// records it, and Committed, the contiguous prefix, passes it once every earlier one finished.
type Order struct {
	mu       sync.Mutex
	assigned uint64          // the last sequence number handed out
	done     uint64          // the last one of the prefix: it and every one before it finished
	ahead    map[uint64]bool // numbers past done+1 that finished, ahead of the prefix
	changed  chan struct{}   // closed by the next Finish; made by a waiter (nil: none waits)
}

// NewOrder returns an Order that has handed out nothing.
func NewOrder() *Order { return &Order{} }

// waitChan returns the channel the next Finish closes. The caller holds mu.
func (o *Order) waitChan() chan struct{} {
	if o.changed == nil {
		o.changed = make(chan struct{})
	}
	return o.changed
}

// Assign returns the next sequence number.
func (o *Order) Assign() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.assigned++
	return o.assigned
}

// Last returns the last sequence number handed out.
func (o *Order) Last() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.assigned
}

// Committed returns the last sequence number of the committed prefix: it and every one before it
// committed.
func (o *Order) Committed() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done
}

// Wait waits until seq and every number before it committed.
func (o *Order) Wait(ctx context.Context, seq uint64) error {
	for {
		o.mu.Lock()
		if o.done >= seq {
			o.mu.Unlock()
			return nil
		}
		ch := o.waitChan()
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ch:
		}
	}
}

// Finish records that seq committed (or turned out to have nothing to commit). In source commit
// order the caller waited for seq-1 first; a number finished ahead of the prefix is remembered
// until the prefix reaches it.
func (o *Order) Finish(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case seq <= o.done:
	case seq == o.done+1:
		o.done = seq
		for o.ahead[o.done+1] {
			delete(o.ahead, o.done+1)
			o.done++
		}
	default:
		if o.ahead == nil {
			o.ahead = map[uint64]bool{}
		}
		o.ahead[seq] = true
	}
	if o.changed != nil { // someone waits
		close(o.changed)
		o.changed = nil
	}
}

// Finished says whether seq finished, in the prefix or ahead of it.
func (o *Order) Finished(seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return seq <= o.done || o.ahead[seq]
}

// WaitFor waits until seq finished, whether or not every number before it did.
func (o *Order) WaitFor(ctx context.Context, seq uint64) error {
	for {
		o.mu.Lock()
		if seq <= o.done || o.ahead[seq] {
			o.mu.Unlock()
			return nil
		}
		ch := o.waitChan()
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ch:
		}
	}
}
