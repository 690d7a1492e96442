package heap

// Node is the heap's bookkeeping for one element. Embed one in each element type (or otherwise
// keep it alive as long as the element) and return it from the node function given to [New].
// The zero Node is not in any heap. A Node must not be copied while it is in a heap.
type Node[T any] struct {
	elem   T        // the element that owns this node, set by Push; zero when not in a heap
	child  *Node[T] // leftmost child
	next   *Node[T] // next sibling
	prev   *Node[T] // previous sibling, or the parent for a leftmost child; nil for the root
	parent *Node[T] // nil for the root
	in     bool
}

// InHeap reports whether the node's element is currently in a heap. O(1).
func (n *Node[T]) InHeap() bool { return n.in }

// Heap is a pairing heap of elements of type T; see the package documentation for the
// contract. Create one with [New].
type Heap[T any] struct {
	before func(a, b T) bool
	node   func(T) *Node[T]
	root   *Node[T]
	n      int
}

// New returns an empty heap. before(a, b) reports whether a must be nearer the top than b (for
// a max-heap by size: a.size > b.size); node returns the [Node] embedded in an element.
// Both functions must be non-nil.
func New[T any](before func(a, b T) bool, node func(T) *Node[T]) *Heap[T] {
	if before == nil || node == nil {
		panic("heap: New with a nil function")
	}
	return &Heap[T]{before: before, node: node}
}

// Len returns the number of elements in the heap. O(1).
func (h *Heap[T]) Len() int { return h.n }

// Push adds x to the heap. x must not be in a heap (Push panics if its node is). O(1).
func (h *Heap[T]) Push(x T) {
	n := h.node(x)
	if n.in {
		panic("heap: Push of an element that is already in a heap")
	}
	n.elem = x
	n.in = true
	h.root = h.meld(h.root, n)
	h.n++
}

// Peek returns the top element without removing it, and false if the heap is empty. O(1).
func (h *Heap[T]) Peek() (T, bool) {
	if h.root == nil {
		var zero T
		return zero, false
	}
	return h.root.elem, true
}

// Pop removes and returns the top element, and false if the heap is empty.
// O(log n) amortized.
func (h *Heap[T]) Pop() (T, bool) {
	r := h.root
	if r == nil {
		var zero T
		return zero, false
	}
	x := r.elem
	h.root = h.combine(r.child)
	h.n--
	r.clear()
	return x, true
}

// Remove removes x from the heap. It does nothing if x is not in a heap; x must not be in a
// different heap. O(log n) amortized.
func (h *Heap[T]) Remove(x T) {
	n := h.node(x)
	if !n.in {
		return
	}
	if n == h.root {
		h.root = h.combine(n.child)
	} else {
		h.cut(n)
		h.root = h.meld(h.root, h.combine(n.child))
	}
	h.n--
	n.clear()
}

// fixScan is how many children Fix compares with their parent before it falls back to
// combining them, which bounds the worst-case time of a Fix that moves nothing.
const fixScan = 4

// Fix restores the heap order after the key of x changed, in either direction. It does nothing
// if x is not in a heap; x must not be in a different heap. Calling Fix when the key did not
// change is allowed and leaves a valid heap.
//
// If x has at most 4 children and none of them must now go before x (its key grew, or did not
// shrink much), Fix takes O(1) time: x stays where it is unless it must now go before its
// parent, in which case its subtree is cut and melded with the root, the pairing heap's
// increase-key. Otherwise (x shrank below a child, or has many children), the children of x
// are combined into one tree as in Pop, melded with x (which goes below them if it shrank),
// and the result is melded with the root: O(log n) amortized. After that x has at most two
// children, so a run of updates to one element (a large transaction receiving many changes)
// takes O(1) time each.
func (h *Heap[T]) Fix(x T) {
	n := h.node(x)
	if !n.in {
		return
	}
	valid, k := true, 0
	for c := n.child; c != nil; c = c.next {
		if k == fixScan || h.before(c.elem, n.elem) {
			valid = false
			break
		}
		k++
	}
	if valid {
		p := n.parent
		if p == nil || !h.before(n.elem, p.elem) {
			return // n is the root, or still after its parent: the order holds
		}
		h.cut(n)
		h.root = h.meld(h.root, n)
		return
	}
	if n == h.root {
		h.root = nil
	} else {
		h.cut(n)
	}
	c := h.combine(n.child)
	n.child = nil
	h.root = h.meld(h.root, h.meld(n, c))
}

// Merge moves every element of o into h, leaving o empty. o must use the same ordering as h.
// Merging a heap with itself does nothing. O(1).
func (h *Heap[T]) Merge(o *Heap[T]) {
	if o == nil || o == h || o.root == nil {
		return
	}
	h.root = h.meld(h.root, o.root)
	h.n += o.n
	o.root = nil
	o.n = 0
}

// meld links two trees whose roots have no siblings and returns the new root: the root that
// goes second becomes the leftmost child of the other. Ties keep a on top.
func (h *Heap[T]) meld(a, b *Node[T]) *Node[T] {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	if h.before(b.elem, a.elem) {
		a, b = b, a
	}
	b.prev = a
	b.parent = a
	b.next = a.child
	if a.child != nil {
		a.child.prev = b
	}
	a.child = b
	return a
}

// combine melds a list of sibling trees, starting at first, into one tree with the standard
// two-pass method: meld pairs left to right, then meld the results right to left. It uses the
// next links of the pair winners as a stack, so it needs no memory.
func (h *Heap[T]) combine(first *Node[T]) *Node[T] {
	if first == nil {
		return nil
	}
	if first.next == nil {
		first.prev, first.parent = nil, nil
		return first
	}
	var stack *Node[T]
	for first != nil {
		a := first
		b := a.next
		if b == nil {
			a.prev, a.parent = nil, nil
			a.next = stack
			stack = a
			break
		}
		first = b.next
		a.prev, a.next, a.parent = nil, nil, nil
		b.prev, b.next, b.parent = nil, nil, nil
		m := h.meld(a, b)
		m.next = stack
		stack = m
	}
	r := stack
	stack = r.next
	r.next = nil
	for stack != nil {
		t := stack
		stack = t.next
		t.next = nil
		r = h.meld(r, t)
	}
	return r
}

// cut detaches the subtree rooted at n, which is not the root, from its parent and siblings.
func (h *Heap[T]) cut(n *Node[T]) {
	if n.prev.child == n {
		n.prev.child = n.next
	} else {
		n.prev.next = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	}
	n.prev, n.next, n.parent = nil, nil, nil
}

// clear resets a node that has left the heap, dropping its reference to the element.
func (n *Node[T]) clear() {
	var zero T
	n.elem = zero
	n.child, n.next, n.prev, n.parent = nil, nil, nil, nil
	n.in = false
}
