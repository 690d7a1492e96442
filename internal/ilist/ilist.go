// Package ilist is a doubly linked list threaded through its elements: each element carries the
// Links of the list it is on, so that adding and removing allocate nothing and an element is
// removed without a search. An element is on at most one List through one Links field. Removing
// an element that is not on the list, or adding one that is, corrupts the list: the owner keeps
// track (a flag, or the state the element is in). Not safe for concurrent use.
package ilist

// Links are an element's place in a List: a field of the element, zero when it is on none.
type Links[T any] struct{ prev, next *T }

// List is a list of *T linked through the Links field that its links function returns. Make it
// with New: the zero List has no links function.
type List[T any] struct {
	head, tail *T
	links      func(*T) *Links[T]
}

// New returns an empty List whose elements are linked through links(x).
func New[T any](links func(*T) *Links[T]) List[T] { return List[T]{links: links} }

// Front returns the first element, nil if the list is empty.
func (l *List[T]) Front() *T { return l.head }

// Back returns the last element, nil if the list is empty.
func (l *List[T]) Back() *T { return l.tail }

// Next returns the element after x, nil if x is the last.
func (l *List[T]) Next(x *T) *T { return l.links(x).next }

// PushFront puts x, which is on no list, first.
func (l *List[T]) PushFront(x *T) {
	lx := l.links(x)
	lx.prev, lx.next = nil, l.head
	if l.head != nil {
		l.links(l.head).prev = x
	} else {
		l.tail = x
	}
	l.head = x
}

// Remove takes x, which is on l, off it.
func (l *List[T]) Remove(x *T) {
	lx := l.links(x)
	if lx.prev != nil {
		l.links(lx.prev).next = lx.next
	} else {
		l.head = lx.next
	}
	if lx.next != nil {
		l.links(lx.next).prev = lx.prev
	} else {
		l.tail = lx.prev
	}
	lx.prev, lx.next = nil, nil
}

// Linked reports whether x's neighbours point back at it, and whether x is at the list's ends
// exactly when it has no neighbour on that side: the invariant a consistency check walks the
// list with.
func (l *List[T]) Linked(x *T) bool {
	lx := l.links(x)
	return (lx.prev == nil) == (l.head == x) && (lx.next == nil) == (l.tail == x) &&
		(lx.prev == nil || l.links(lx.prev).next == x) && (lx.next == nil || l.links(lx.next).prev == x)
}
