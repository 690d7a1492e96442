package heap_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/heap"
)

type item struct {
	key  int
	id   int
	node heap.Node[*item]
}

func newMaxHeap() *heap.Heap[*item] {
	return heap.New(func(a, b *item) bool { return a.key > b.key }, func(x *item) *heap.Node[*item] { return &x.node })
}

func mustCheck(t testing.TB, h *heap.Heap[*item]) {
	t.Helper()
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
}

// model is the reference: the keys of the elements in the heap, kept sorted descending.
type model struct{ in map[*item]bool }

func (m *model) maxKey() (int, bool) {
	keys := make([]int, 0, len(m.in))
	for x := range m.in {
		keys = append(keys, x.key)
	}
	if len(keys) == 0 {
		return 0, false
	}
	slices.Sort(keys)
	return keys[len(keys)-1], true
}

func seed(t *testing.T) uint64 {
	s := uint64(time.Now().UnixNano())
	t.Logf("seed %d", s)
	return s
}

func TestEmpty(t *testing.T) {
	h := newMaxHeap()
	if h.Len() != 0 {
		t.Fatalf("Len = %d", h.Len())
	}
	if x, ok := h.Peek(); ok || x != nil {
		t.Fatalf("Peek on empty = %v, %v", x, ok)
	}
	if x, ok := h.Pop(); ok || x != nil {
		t.Fatalf("Pop on empty = %v, %v", x, ok)
	}
	x := &item{key: 1}
	h.Remove(x) // not in a heap: no-op
	h.Fix(x)    // not in a heap: no-op
	if x.node.InHeap() || h.Len() != 0 {
		t.Fatal("Remove/Fix of an element not in the heap changed something")
	}
	var zero heap.Heap[*item]
	if zero.Len() != 0 {
		t.Fatal("zero Heap not empty")
	}
	if _, ok := zero.Pop(); ok {
		t.Fatal("zero Heap Pop returned an element")
	}
	mustCheck(t, h)
}

func TestOneElement(t *testing.T) {
	h := newMaxHeap()
	x := &item{key: 5}
	h.Push(x)
	if !x.node.InHeap() || h.Len() != 1 {
		t.Fatal("after Push: not in heap")
	}
	if top, ok := h.Peek(); !ok || top != x {
		t.Fatal("Peek")
	}
	for _, k := range []int{5, 9, -3} { // same key, grown, shrunk
		x.key = k
		h.Fix(x)
		mustCheck(t, h)
		if top, _ := h.Peek(); top != x || h.Len() != 1 {
			t.Fatalf("after Fix to %d: top %v len %d", k, top, h.Len())
		}
	}
	h.Remove(x)
	if x.node.InHeap() || h.Len() != 0 {
		t.Fatal("Remove of the only element")
	}
	h.Push(x) // can be pushed again
	if got, ok := h.Pop(); !ok || got != x || x.node.InHeap() {
		t.Fatal("Pop of the only element")
	}
	mustCheck(t, h)
}

func TestPushTwicePanics(t *testing.T) {
	h := newMaxHeap()
	x := &item{}
	h.Push(x)
	defer func() {
		if recover() == nil {
			t.Fatal("second Push did not panic")
		}
	}()
	h.Push(x)
}

func TestNewNilPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New(nil, nil) did not panic")
		}
	}()
	heap.New[*item](nil, nil)
}

func TestEdgeCases(t *testing.T) {
	tests := []struct {
		name string
		keys []int
		op   func(h *heap.Heap[*item], xs []*item)
		want []int // keys in Pop order afterwards
	}{
		{"equal keys", []int{3, 3, 3, 3}, func(*heap.Heap[*item], []*item) {}, []int{3, 3, 3, 3}},
		{"remove top", []int{1, 7, 4}, func(h *heap.Heap[*item], xs []*item) { h.Remove(xs[1]) }, []int{4, 1}},
		{"remove leaf", []int{1, 7, 4}, func(h *heap.Heap[*item], xs []*item) { h.Remove(xs[0]) }, []int{7, 4}},
		{"remove twice", []int{1, 7, 4}, func(h *heap.Heap[*item], xs []*item) { h.Remove(xs[2]); h.Remove(xs[2]) }, []int{7, 1}},
		{"fix same key", []int{2, 9, 5}, func(h *heap.Heap[*item], xs []*item) { h.Fix(xs[0]); h.Fix(xs[1]) }, []int{9, 5, 2}},
		{"grow to top", []int{2, 9, 5}, func(h *heap.Heap[*item], xs []*item) { xs[0].key = 10; h.Fix(xs[0]) }, []int{10, 9, 5}},
		{"grow to tie with top", []int{2, 9, 5}, func(h *heap.Heap[*item], xs []*item) { xs[0].key = 9; h.Fix(xs[0]) }, []int{9, 9, 5}},
		{"shrink top", []int{2, 9, 5}, func(h *heap.Heap[*item], xs []*item) { xs[1].key = 0; h.Fix(xs[1]) }, []int{5, 2, 0}},
		{"shrink top, still top", []int{2, 9, 5}, func(h *heap.Heap[*item], xs []*item) { xs[1].key = 6; h.Fix(xs[1]) }, []int{6, 5, 2}},
		{"shrink below children after pops", []int{8, 1, 6, 7, 3, 5}, func(h *heap.Heap[*item], xs []*item) {
			h.Pop()        // restructures: 7 now has children
			xs[3].key = -1 // 7 -> -1
			h.Fix(xs[3])
		}, []int{6, 5, 3, 1, -1}},
		{"pop all then peek", []int{4}, func(h *heap.Heap[*item], xs []*item) { h.Pop() }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newMaxHeap()
			xs := make([]*item, len(tc.keys))
			for i, k := range tc.keys {
				xs[i] = &item{key: k, id: i}
				h.Push(xs[i])
			}
			tc.op(h, xs)
			mustCheck(t, h)
			var got []int
			for {
				x, ok := h.Pop()
				if !ok {
					break
				}
				if x.node.InHeap() {
					t.Fatal("popped element still in heap")
				}
				mustCheck(t, h)
				got = append(got, x.key)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("pop order %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	a, b := newMaxHeap(), newMaxHeap()
	for i := range 10 {
		a.Push(&item{key: i * 2})
		b.Push(&item{key: i*2 + 1})
	}
	a.Merge(b)
	a.Merge(a)   // self: no-op
	a.Merge(nil) // nil: no-op
	if a.Len() != 20 || b.Len() != 0 {
		t.Fatalf("Len after Merge: %d, %d", a.Len(), b.Len())
	}
	if _, ok := b.Peek(); ok {
		t.Fatal("merged-from heap not empty")
	}
	mustCheck(t, a)
	mustCheck(t, b)
	for want := 19; want >= 0; want-- {
		x, _ := a.Pop()
		if x.key != want {
			t.Fatalf("Pop = %d, want %d", x.key, want)
		}
	}
}

// TestFixRunIsCheap checks the claim in Fix's documentation: right after a Fix of x, x has at
// most two children, however many it had before.
func TestFixRunIsCheap(t *testing.T) {
	h := newMaxHeap()
	big := &item{key: 1 << 30}
	h.Push(big)
	for i := range 1000 {
		h.Push(&item{key: i}) // all become children of big
	}
	if k := h.NumChildren(big); k != 1000 {
		t.Fatalf("setup: big has %d children", k)
	}
	for i := range 5 {
		big.key++
		h.Fix(big)
		if k := h.NumChildren(big); k > 2 {
			t.Fatalf("after Fix %d: %d children", i, k)
		}
	}
	mustCheck(t, h)
}

// TestRandomAgainstModel runs long seeded random sequences of every operation and compares the
// top with a model after each step, checking the whole structure as it goes.
func TestRandomAgainstModel(t *testing.T) {
	s := seed(t)
	rng := rand.New(rand.NewPCG(s, 3))
	for round := range 20 {
		pool := make([]*item, 1+rng.IntN(200))
		for i := range pool {
			pool[i] = &item{id: i, key: rng.IntN(50)} // small key range: many ties
		}
		h, other := newMaxHeap(), newMaxHeap()
		m := model{in: map[*item]bool{}}
		om := map[*item]bool{}
		steps := 3000
		for step := range steps {
			x := pool[rng.IntN(len(pool))]
			switch op := rng.IntN(10); {
			case op < 3: // push (into h or the other heap) if free
				if !x.node.InHeap() {
					if rng.IntN(4) == 0 {
						other.Push(x)
						om[x] = true
					} else {
						h.Push(x)
						m.in[x] = true
					}
				}
			case op < 6: // change key and fix, in whichever heap x is
				switch rng.IntN(3) {
				case 0:
					x.key += rng.IntN(40)
				case 1:
					x.key -= rng.IntN(40)
				}
				if om[x] {
					other.Fix(x)
				} else {
					h.Fix(x)
				}
			case op < 7:
				if !om[x] {
					h.Remove(x)
					delete(m.in, x)
				}
			case op < 9:
				got, ok := h.Pop()
				want, wok := m.maxKey()
				if ok != wok || (ok && got.key != want) {
					t.Fatalf("round %d step %d: Pop = %v,%v want key %d,%v", round, step, got, ok, want, wok)
				}
				if ok {
					delete(m.in, got)
				}
			default:
				if rng.IntN(20) == 0 {
					h.Merge(other)
					for y := range om {
						m.in[y] = true
					}
					clear(om)
				}
			}
			mustCheck(t, h)
			mustCheck(t, other)
			if h.Len() != len(m.in) || other.Len() != len(om) {
				t.Fatalf("round %d step %d: Len %d/%d, model %d/%d", round, step, h.Len(), other.Len(), len(m.in), len(om))
			}
			top, ok := h.Peek()
			want, wok := m.maxKey()
			if ok != wok || (ok && top.key != want) {
				t.Fatalf("round %d step %d: Peek key mismatch (ok %v/%v, want %d)", round, step, ok, wok, want)
			}
			for _, y := range pool {
				if y.node.InHeap() != (m.in[y] || om[y]) {
					t.Fatalf("round %d step %d: InHeap of %d = %v", round, step, y.id, y.node.InHeap())
				}
			}
		}
	}
}

// TestNoAllocs checks that no operation allocates once the elements exist.
func TestNoAllocs(t *testing.T) {
	h := newMaxHeap()
	pool := make([]item, 64)
	for i := range pool {
		pool[i].key = i
		h.Push(&pool[i])
	}
	other := newMaxHeap()
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		x := &pool[i%len(pool)]
		i++
		x.key += 7
		h.Fix(x)
		y, _ := h.Pop()
		y.key = -y.key
		h.Push(y)
		h.Remove(x)
		other.Push(x)
		h.Merge(other)
		h.Peek()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run", allocs)
	}
}
