package heap_test

import (
	"cmp"
	ctrheap "container/heap"
	"fmt"
	"testing"

	"github.com/emirpasic/gods/trees/binaryheap"

	"github.com/pgreorder/pgreorder/heap"
)

// BenchmarkEvictionChoice measures the cost of keeping track of the largest transaction while
// transactions grow, as the reorder buffer must (PostgreSQL's ReorderBufferChangeMemoryUpdate +
// ReorderBufferLargestTXN).
//
// Workload, identical for every strategy (same seeded generator, same sequence): N open
// transactions start with a random size in [1, 64 KiB] and are all tracked. One benchmark op is
// one step: a random transaction grows by a random change size in [64, 1087] bytes and the
// strategy updates its position (or starts tracking it again if it had been evicted). Every
// evictEvery steps the largest transaction is evicted: it leaves the structure and its size
// becomes 0, as after a spill. Setup and a warm-up of warmupSteps steps are not timed.
// ns/op is therefore the cost per change, with one eviction amortized over evictEvery changes.
//
// Strategies:
//   - pairing: this package.
//   - binary: container/heap over a slice of pointers, with each transaction keeping its index
//     (updated in Swap) so heap.Fix repositions it in O(log n).
//   - gods: github.com/emirpasic/gods/v1 trees/binaryheap, standing in for the binary heap plus
//     node→index hash table that PostgreSQL 17 carried during development (commit 5bec1d6bc).
//     gods' heap cannot update or remove an arbitrary entry (no index, and its list is
//     unexported), so the closest equivalent is lazy deletion: each update pushes a new
//     (transaction, size) entry and records it in a Go map from transaction to its live entry
//     (the hash index); eviction pops entries and skips stale ones (those no longer in the map);
//     when the heap holds more than twice as many entries as live transactions it is rebuilt
//     from the map in O(n). Same asymptotics as PostgreSQL's design (O(log n) per update plus
//     a hash update), at most twice the entries. Popped stale entries are recycled through a
//     free list, so the baseline is not penalised by garbage.
//   - linear: PostgreSQL ≤ 16: growth costs nothing, eviction scans all N transactions. Like
//     ReorderBufferLargestTXN's hash_seq_search over the by_txn hash table, it walks a hash
//     table (a Go map from xid to transaction) and so visits the transactions in hash order,
//     not in memory order.
//
// Run: go test -run '^$' -bench EvictionChoice ./heap/   (add -benchtime 1x for a smoke run).
func BenchmarkEvictionChoice(b *testing.B) {
	strategies := []struct {
		name string
		run  func(b *testing.B, n int)
	}{
		{"pairing", benchPairing},
		{"binary", benchBinary},
		{"gods", benchGods},
		{"linear", benchLinear},
	}
	for _, s := range strategies {
		b.Run("strategy="+s.name, func(b *testing.B) {
			for _, n := range []int{1, 1000, 100_000, 1_000_000} {
				b.Run(fmt.Sprintf("txns=%d", n), func(b *testing.B) { s.run(b, n) })
			}
		})
	}
}

const (
	// evictEvery is the number of changes between two evictions. In PostgreSQL, once the
	// buffer is at logical_decoding_work_mem, every added change can trigger one; with many
	// small transactions most evictions free little, so they come often.
	evictEvery  = 16
	warmupSteps = 32 * evictEvery
	benchSeed   = 0x5eed_2024
)

// txnBody pads each benchmark transaction to a realistic footprint (xid, LSNs, list heads,
// counters...), so that touching a transaction costs what it does in a real reorder buffer.
type txnBody [96]byte

// workload is the shared deterministic step generator (splitmix64).
type workload struct {
	s uint64
	n uint64
}

func newWorkload(n int) *workload { return &workload{s: benchSeed, n: uint64(n)} }

func (w *workload) next() uint64 {
	w.s += 0x9e3779b97f4a7c15
	z := w.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (w *workload) pick() int      { return int((w.next() >> 32) * w.n >> 32) }
func (w *workload) change() int64  { return 64 + int64(w.next()&1023) }
func (w *workload) initial() int64 { return 1 + int64(w.next()&0xffff) }

// pairing

type pairTxn struct {
	size int64
	node heap.Node[*pairTxn]
	_    txnBody
}

func benchPairing(b *testing.B, n int) {
	txns := make([]pairTxn, n)
	h := heap.New(
		func(a, b *pairTxn) bool { return a.size > b.size },
		func(t *pairTxn) *heap.Node[*pairTxn] { return &t.node },
	)
	w := newWorkload(n)
	for i := range txns {
		txns[i].size = w.initial()
		h.Push(&txns[i])
	}
	step := func(k int) {
		t := &txns[w.pick()]
		t.size += w.change()
		if t.node.InHeap() {
			h.Fix(t)
		} else {
			h.Push(t)
		}
		if k%evictEvery == evictEvery-1 {
			t, _ := h.Pop()
			t.size = 0
		}
	}
	for k := range warmupSteps {
		step(k)
	}
	b.ReportAllocs()
	k := 0
	for b.Loop() {
		step(k)
		k++
	}
}

// binary: container/heap with the index kept in the element

type binTxn struct {
	size int64
	idx  int // position in binHeap, -1 when not in it
	_    txnBody
}

type binHeap []*binTxn

func (h binHeap) Len() int           { return len(h) }
func (h binHeap) Less(i, j int) bool { return h[i].size > h[j].size }
func (h binHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *binHeap) Push(x any) {
	t := x.(*binTxn)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *binHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}

func benchBinary(b *testing.B, n int) {
	txns := make([]binTxn, n)
	h := make(binHeap, 0, n)
	w := newWorkload(n)
	for i := range txns {
		txns[i].size = w.initial()
		txns[i].idx = i
		h = append(h, &txns[i])
	}
	ctrheap.Init(&h)
	step := func(k int) {
		t := &txns[w.pick()]
		t.size += w.change()
		if t.idx >= 0 {
			ctrheap.Fix(&h, t.idx)
		} else {
			ctrheap.Push(&h, t)
		}
		if k%evictEvery == evictEvery-1 {
			ctrheap.Pop(&h).(*binTxn).size = 0
		}
	}
	for k := range warmupSteps {
		step(k)
	}
	b.ReportAllocs()
	k := 0
	for b.Loop() {
		step(k)
		k++
	}
}

// gods: binaryheap + map from transaction to its live entry, lazy deletion

type godsTxn struct {
	size int64
	_    txnBody
}

type godsEntry struct {
	t    *godsTxn
	size int64
	next *godsEntry // free list
}

type godsTracker struct {
	h       *binaryheap.Heap
	live    map[*godsTxn]*godsEntry
	free    *godsEntry
	scratch []any
}

func (g *godsTracker) entry(t *godsTxn) *godsEntry {
	e := g.free
	if e == nil {
		e = new(godsEntry)
	} else {
		g.free = e.next
	}
	*e = godsEntry{t: t, size: t.size}
	return e
}

// update records t's new size: the old entry, if any, becomes stale.
func (g *godsTracker) update(t *godsTxn) {
	e := g.entry(t)
	g.live[t] = e
	if g.h.Size() > 2*len(g.live)+64 {
		g.rebuild()
		return
	}
	g.h.Push(e)
}

// rebuild drops the stale entries: heapify the live ones in O(n).
func (g *godsTracker) rebuild() {
	g.scratch = g.scratch[:0]
	for _, e := range g.live {
		g.scratch = append(g.scratch, e)
	}
	g.h.Clear()
	g.h.Push(g.scratch...)
	clear(g.scratch)
}

// evict pops the largest live transaction.
func (g *godsTracker) evict() *godsTxn {
	for {
		v, ok := g.h.Pop()
		if !ok {
			return nil
		}
		e := v.(*godsEntry)
		t := e.t
		live := g.live[t] == e
		*e = godsEntry{next: g.free}
		g.free = e
		if live {
			delete(g.live, t)
			return t
		}
	}
}

func benchGods(b *testing.B, n int) {
	txns := make([]godsTxn, n)
	g := &godsTracker{
		h: binaryheap.NewWith(func(a, b any) int {
			return cmp.Compare(b.(*godsEntry).size, a.(*godsEntry).size) // max-heap
		}),
		live: make(map[*godsTxn]*godsEntry, n),
	}
	w := newWorkload(n)
	for i := range txns {
		txns[i].size = w.initial()
		g.live[&txns[i]] = g.entry(&txns[i])
	}
	g.rebuild()
	step := func(k int) {
		t := &txns[w.pick()]
		t.size += w.change()
		g.update(t)
		if k%evictEvery == evictEvery-1 {
			g.evict().size = 0
		}
	}
	for k := range warmupSteps {
		step(k)
	}
	b.ReportAllocs()
	k := 0
	for b.Loop() {
		step(k)
		k++
	}
}

// linear: PostgreSQL ≤ 16 scans every transaction at each eviction

type linTxn struct {
	size int64
	_    txnBody
}

func benchLinear(b *testing.B, n int) {
	txns := make([]linTxn, n)
	byXid := make(map[uint32]*linTxn, n)
	w := newWorkload(n)
	for i := range txns {
		txns[i].size = w.initial()
		byXid[uint32(i)+1000] = &txns[i]
	}
	step := func(k int) {
		t := &txns[w.pick()]
		t.size += w.change()
		if k%evictEvery == evictEvery-1 {
			var best *linTxn
			for _, t := range byXid {
				if best == nil || t.size > best.size {
					best = t
				}
			}
			best.size = 0
		}
	}
	for k := range warmupSteps {
		step(k)
	}
	b.ReportAllocs()
	k := 0
	for b.Loop() {
		step(k)
		k++
	}
}
