package ilist_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pgreorder/pgreorder/internal/ilist"
)

type item struct {
	v     int
	links ilist.Links[item]
}

func linksOf(x *item) *ilist.Links[item] { return &x.links }

func values(l *ilist.List[item]) []int {
	var out []int
	for x := l.Front(); x != nil; x = l.Next(x) {
		out = append(out, x.v)
	}
	return out
}

// TestModel pushes and removes at random, seeded, and compares the list with a slice after
// every step: order, ends and links.
func TestModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	l := ilist.New(linksOf)
	items := make([]item, 64)
	var want []int // front first
	on := map[int]bool{}
	for step := range 10_000 {
		i := rng.IntN(len(items))
		x := &items[i]
		x.v = i
		if on[i] {
			l.Remove(x)
			want = slices.DeleteFunc(want, func(v int) bool { return v == i })
		} else {
			l.PushFront(x)
			want = append([]int{i}, want...)
		}
		on[i] = !on[i]
		if got := values(&l); !slices.Equal(got, want) {
			t.Fatalf("step %d: list %v, want %v", step, got, want)
		}
		if len(want) > 0 && (l.Front().v != want[0] || l.Back().v != want[len(want)-1]) {
			t.Fatalf("step %d: ends %d, %d, want %d, %d", step, l.Front().v, l.Back().v, want[0], want[len(want)-1])
		}
		for x := l.Front(); x != nil; x = l.Next(x) {
			if !l.Linked(x) {
				t.Fatalf("step %d: %d badly linked", step, x.v)
			}
		}
	}
}

// Example keeps the least recently used element last: a use moves it first, eviction takes the
// last.
func Example() {
	type file struct {
		name string
		lru  ilist.Links[file]
	}
	l := ilist.New(func(f *file) *ilist.Links[file] { return &f.lru })
	a, b, c := &file{name: "a"}, &file{name: "b"}, &file{name: "c"}
	l.PushFront(a)
	l.PushFront(b)
	l.PushFront(c)
	l.Remove(a) // a is used again: first
	l.PushFront(a)
	fmt.Println("evict", l.Back().name)
	// Output: evict b
}
