package heap_test

import (
	"fmt"

	"github.com/pgreorder/pgreorder/heap"
)

// txn is an element: it embeds the heap's Node.
type txn struct {
	xid  uint32
	size int64
	node heap.Node[*txn]
}

// Example picks the largest transaction to evict, as the reorder buffer does. Transactions with
// no bytes in memory stay out of the heap.
func Example() {
	h := heap.New(
		func(a, b *txn) bool { return a.size > b.size },
		func(t *txn) *heap.Node[*txn] { return &t.node },
	)
	t1, t2, t3 := &txn{xid: 731}, &txn{xid: 732}, &txn{xid: 733}

	grow := func(t *txn, n int64) {
		t.size += n
		if t.node.InHeap() {
			h.Fix(t)
		} else {
			h.Push(t)
		}
	}
	grow(t1, 100)
	grow(t2, 300)
	grow(t3, 200)
	grow(t1, 250) // t1 is now the largest

	for h.Len() > 0 {
		t, _ := h.Pop() // evict: spill to disk, size drops to 0
		fmt.Println(t.xid, t.size, t.node.InHeap())
		t.size = 0
	}
	// Output:
	// 731 350 false
	// 732 300 false
	// 733 200 false
}
