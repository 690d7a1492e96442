package heap

import (
	"errors"
	"fmt"
)

// Check verifies the structure of h: link consistency, heap order, node ownership and Len.
// It walks the tree with an explicit stack because pairing heaps can be as deep as they are
// large.
func (h *Heap[T]) Check() error {
	if h.root == nil {
		if h.n != 0 {
			return fmt.Errorf("empty tree but Len %d", h.n)
		}
		return nil
	}
	if h.root.prev != nil || h.root.next != nil || h.root.parent != nil {
		return errors.New("root has a parent or sibling")
	}
	count := 0
	stack := []*Node[T]{h.root}
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		count++
		if count > h.n {
			return fmt.Errorf("more than Len=%d nodes (cycle?)", h.n)
		}
		if !p.in {
			return errors.New("node in tree is not marked in heap")
		}
		if h.node(p.elem) != p {
			return errors.New("node does not belong to its element")
		}
		prev := p
		for c := p.child; c != nil; c = c.next {
			if c.prev != prev {
				return errors.New("broken prev link")
			}
			if c.parent != p {
				return errors.New("broken parent link")
			}
			if h.before(c.elem, p.elem) {
				return errors.New("heap order violated: child before its parent")
			}
			stack = append(stack, c)
			prev = c
		}
	}
	if count != h.n {
		return fmt.Errorf("%d nodes in tree, Len %d", count, h.n)
	}
	return nil
}

// NumChildren returns the number of children of x's node (test hook for the Fix cost claim).
func (h *Heap[T]) NumChildren(x T) int {
	k := 0
	for c := h.node(x).child; c != nil; c = c.next {
		k++
	}
	return k
}
