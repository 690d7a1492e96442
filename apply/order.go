package apply

import (
	"context"
	"sync"
)

// order hands out commit sequence numbers, in the source's commit order, and lets each
// transaction commit on the target only after the one before it: the target commits in the
// source's order whichever connection applies what, and the progress row only moves forward.
type order struct {
	mu       sync.Mutex
	assigned uint64 // the last sequence number handed out
	done     uint64 // the last one committed; every one before it is committed too
	changed  chan struct{}
}

func newOrder() *order { return &order{changed: make(chan struct{})} }

// assign returns the next sequence number.
func (o *order) assign() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.assigned++
	return o.assigned
}

// last returns the last sequence number handed out.
func (o *order) last() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.assigned
}

// committed returns the last sequence number committed.
func (o *order) committed() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done
}

// wait waits until seq and every number before it are committed.
func (o *order) wait(ctx context.Context, seq uint64) error {
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

// finish records that seq committed (or turned out to have nothing to commit). The caller
// waited for seq-1 first.
func (o *order) finish(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if seq > o.done {
		o.done = seq
	}
	close(o.changed)
	o.changed = make(chan struct{})
}
