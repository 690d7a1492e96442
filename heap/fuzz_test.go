package heap_test

import (
	"testing"

	"github.com/pgreorder/pgreorder/heap"
)

// FuzzOps drives sequences of operations over a small pool of elements in two heaps. Each input
// byte selects an operation (high 3 bits) and an element (low 4 bits); key changes take the next
// byte as a signed delta. After every operation the structure is checked and the top is compared
// with a brute-force maximum.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x02, 0x20, 0x05, 0x41, 0x80, 0xa0})
	f.Add([]byte{0x00, 0x01, 0x02, 0x03, 0x60, 0x7f, 0x61, 0x81, 0xc0, 0xe0})
	f.Add([]byte{0x00, 0x11, 0x02, 0x13, 0x20, 0xff, 0xe0, 0x80, 0x80, 0x80})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var pool [16]item
		for i := range pool {
			pool[i].id = i
		}
		h, other := newMaxHeap(), newMaxHeap()
		where := map[*item]*heap.Heap[*item]{}
		for i := 0; i < len(ops); i++ {
			x := &pool[ops[i]&0x0f]
			switch ops[i] >> 5 {
			case 0, 1: // push into h, or other when bit 4 is set
				if !x.node.InHeap() {
					dst := h
					if ops[i]&0x10 != 0 {
						dst = other
					}
					dst.Push(x)
					where[x] = dst
				}
			case 2, 3: // change key by the next byte (signed), then Fix
				if i+1 < len(ops) {
					i++
					x.key += int(int8(ops[i]))
				}
				if w := where[x]; w != nil {
					w.Fix(x)
				}
			case 4: // pop h
				if got, ok := h.Pop(); ok {
					delete(where, got)
				}
			case 5: // remove
				if w := where[x]; w != nil {
					w.Remove(x)
					delete(where, x)
				}
			case 6: // merge other into h
				h.Merge(other)
				for y, w := range where {
					if w == other {
						where[y] = h
					}
				}
			case 7: // pop other
				if got, ok := other.Pop(); ok {
					delete(where, got)
				}
			}
			for _, hh := range []*heap.Heap[*item]{h, other} {
				if err := hh.Check(); err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
				n, best, have := 0, 0, false
				for y, w := range where {
					if w != hh {
						continue
					}
					n++
					if !have || y.key > best {
						best, have = y.key, true
					}
				}
				top, ok := hh.Peek()
				if hh.Len() != n || ok != have || (ok && top.key != best) {
					t.Fatalf("op %d: Len %d Peek %v,%v; want %d elements, max %d", i, hh.Len(), top, ok, n, best)
				}
			}
			for j := range pool {
				if pool[j].node.InHeap() != (where[&pool[j]] != nil) {
					t.Fatalf("op %d: InHeap(%d) wrong", i, j)
				}
			}
		}
	})
}
