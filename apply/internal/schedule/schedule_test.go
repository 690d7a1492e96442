package schedule

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TestOrder: sequence numbers come out in order, and Wait returns once the number and every one
// before it finished, whatever order the finishers come in.
func TestOrder(t *testing.T) {
	o := NewOrder()
	if o.Last() != 0 || o.Committed() != 0 {
		t.Fatal("a new order handed out something")
	}
	const n = 50
	for i := range uint64(n) {
		if got := o.Assign(); got != i+1 {
			t.Fatalf("Assign = %d, want %d", got, i+1)
		}
	}
	if o.Last() != n {
		t.Fatalf("Last = %d", o.Last())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Each committer waits for the one before it, as the workers do, starting in any order.
	var mu sync.Mutex
	var seen []uint64
	var wg sync.WaitGroup
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for _, seq := range rand.New(rand.NewPCG(seed, 0)).Perm(n) {
		wg.Go(func() {
			s := uint64(seq) + 1
			if err := o.Wait(ctx, s-1); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			seen = append(seen, s)
			mu.Unlock()
			o.Finish(s)
		})
	}
	if err := o.Wait(ctx, n); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, s := range seen {
		if s != uint64(i)+1 {
			t.Fatalf("committed in the order %v", seen)
		}
	}
	if o.Committed() != n {
		t.Fatalf("Committed = %d", o.Committed())
	}
	// Wait gives up with its context.
	cctx, ccancel := context.WithCancelCause(ctx)
	stop := errors.New("stopped")
	ccancel(stop)
	if err := o.Wait(cctx, n+1); !errors.Is(err, stop) {
		t.Fatalf("Wait after cancel: %v", err)
	}
}

// TestQueue: records come out in the order they went in, in memory while the budget and the
// queue's share allow and through spill files beyond, with the budget given back; Close is safe
// twice and makes Push and Pop fail.
func TestQueue(t *testing.T) {
	st := NewSpillStore(t.TempDir(), nil)
	defer st.Close()
	b := NewBudget(reorderbuffer.NewMemory(1000))
	var spilled atomic.Int64
	q := NewQueue(st, b, 600, &spilled)
	other := NewQueue(st, b, 600, &spilled)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := func(i int) []byte { return fmt.Appendf(nil, "record %03d %s", i, make([]byte, 80)) }
	const n = 40
	for i := range n {
		if err := q.Push(rec(i)); err != nil {
			t.Fatal(err)
		}
		if i == 20 {
			// The other queue finds the shared budget nearly used up by the first: it spills.
			if err := other.Push(make([]byte, 500)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if spilled.Load() == 0 {
		t.Fatal("nothing spilled past the share")
	}
	for i := range n {
		got, err := q.Pop(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(rec(i)) {
			t.Fatalf("record %d: %q", i, got[:10])
		}
		if i == n/2 {
			// Pushing while a spill log is being read: the record goes after the rest.
			if err := q.Push(rec(n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, err := q.Pop(ctx, nil); err != nil || string(got) != string(rec(n)) {
		t.Fatalf("last record: %q, %v", got, err)
	}
	if _, ok, err := q.TryPop(); ok || err != nil {
		t.Fatalf("TryPop on an empty queue: %v, %v", ok, err)
	}
	// A Pop waiting for a record gets it once pushed.
	waiting := make(chan struct{})
	got := make(chan []byte)
	go func() {
		r, _ := q.Pop(ctx, sync.OnceFunc(func() { close(waiting) }))
		got <- r
	}()
	<-waiting
	if err := q.Push([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if r := <-got; string(r) != "late" {
		t.Fatalf("waiting Pop got %q", r)
	}
	for _, c := range []*Queue{q, other} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if u := b.used.Load(); u != 0 {
		t.Fatalf("%d bytes of the budget not given back", u)
	}
	if err := q.Push([]byte("x")); !errors.Is(err, ErrQueueClosed) {
		t.Fatalf("Push after Close: %v", err)
	}
	if _, err := q.Pop(ctx, nil); !errors.Is(err, ErrQueueClosed) {
		t.Fatalf("Pop after Close: %v", err)
	}
}

// TestQueueHold: the bytes of parts held where the reorder buffer keeps them count against the
// queue's share, not the budget: records that no longer fit beside them spill, and they fit
// again once the parts are let go of.
func TestQueueHold(t *testing.T) {
	st := NewSpillStore(t.TempDir(), nil)
	defer st.Close()
	b := NewBudget(reorderbuffer.NewMemory(1 << 20))
	var spilled atomic.Int64
	q := NewQueue(st, b, 1000, &spilled)
	if !q.Hold(600) {
		t.Fatal("600 bytes not held in a share of 1000")
	}
	if q.Hold(500) {
		t.Fatal("held past the share")
	}
	if u := b.used.Load(); u != 0 {
		t.Fatalf("held bytes taken from the budget: %d", u)
	}
	if err := q.Push(make([]byte, 300)); err != nil {
		t.Fatal(err)
	}
	if spilled.Load() != 0 {
		t.Fatal("spilled within the share")
	}
	if err := q.Push(make([]byte, 200)); err != nil {
		t.Fatal(err)
	}
	if spilled.Load() != 200 {
		t.Fatalf("spilled %d, want the record past the share beside what is held", spilled.Load())
	}
	q.Unhold(600)
	if q.Hold(701) {
		t.Fatal("held past the share with 300 bytes of records in memory")
	}
	if !q.Hold(600) {
		t.Fatal("600 bytes not held once let go of")
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if q.Hold(1) {
		t.Fatal("held in a closed queue")
	}
}

// TestQueueCloseWakesPop: Close ends a Pop waiting for a record.
func TestQueueCloseWakesPop(t *testing.T) {
	q := NewQueue(NewSpillStore(t.TempDir(), nil), NewBudget(reorderbuffer.NewMemory(100)), 100, new(atomic.Int64))
	waiting := make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := q.Pop(context.Background(), sync.OnceFunc(func() { close(waiting) }))
		done <- err
	}()
	<-waiting
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrQueueClosed) {
		t.Fatalf("Pop: %v", err)
	}
}

// TestQueueAppend: Append queues a record, in memory or spilled, without a wake-up for a
// waiting Pop; Wake and Push leave one; the records pop in order.
func TestQueueAppend(t *testing.T) {
	st := NewSpillStore(t.TempDir(), nil)
	defer st.Close()
	q := NewQueue(st, NewBudget(reorderbuffer.NewMemory(1000)), 100, new(atomic.Int64))
	for i, rec := range [][]byte{[]byte("first"), make([]byte, 200)} { // the second one spills
		if err := q.Append(rec); err != nil {
			t.Fatal(err)
		}
		if len(q.wake) != 0 {
			t.Fatalf("a wake-up pending after Append of record %d", i)
		}
	}
	q.Wake()
	if len(q.wake) != 1 {
		t.Fatal("no wake-up pending after Wake")
	}
	rec, err := q.Pop(context.Background(), nil)
	if err != nil || string(rec) != "first" {
		t.Fatalf("Pop: %q, %v; want the first record", rec, err)
	}
	if rec, err = q.Pop(context.Background(), nil); err != nil || len(rec) != 200 {
		t.Fatalf("Pop: %d bytes, %v; want the spilled record", len(rec), err)
	}
	<-q.wake
	if err := q.Push([]byte("third")); err != nil {
		t.Fatal(err)
	}
	if len(q.wake) != 1 {
		t.Fatal("no wake-up pending after Push")
	}
}
