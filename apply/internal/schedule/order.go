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

// Order hands out commit sequence numbers, in the source's commit order, and lets each
// transaction commit on the target only after the one before it: the target commits in the
// source's order whichever connection applies what, and the progress row only moves forward.
type Order struct {
	mu       sync.Mutex
	assigned uint64 // the last sequence number handed out
	done     uint64 // the last one committed; every one before it is committed too
	changed  chan struct{}
}

// NewOrder returns an Order that has handed out nothing.
func NewOrder() *Order { return &Order{changed: make(chan struct{})} }

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

// Committed returns the last sequence number committed.
func (o *Order) Committed() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done
}

// Wait waits until seq and every number before it are committed.
func (o *Order) Wait(ctx context.Context, seq uint64) error {
	for {
		o.mu.Lock()
		done, ch := o.done, o.changed
		o.mu.Unlock()
		if done >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ch:
		}
	}
}

// Finish records that seq committed (or turned out to have nothing to commit). The caller
// waited for seq-1 first.
func (o *Order) Finish(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if seq > o.done {
		o.done = seq
	}
	close(o.changed)
	o.changed = make(chan struct{})
}
