// Package heap provides a generic, intrusive pairing heap with removal and update of arbitrary
// elements.
//
// pgreorder uses it to pick the transaction with the most bytes in memory when the reorder buffer
// exceeds logical_decoding_work_mem, as PostgreSQL 17+ does in reorderbuffer.c.
//
// # Contract
//
// A [Heap] orders elements of type T by a caller-supplied comparison before(a, b), which reports
// whether a must be nearer the top than b. It must be a strict weak order (irreflexive,
// transitive) and must give the same answer for the same keys for as long as both elements are in
// the heap: when the key of an element in the heap changes, the caller calls [Heap.Fix] before
// the next other operation on that heap. For an eviction heap, before(a, b) is a.size > b.size
// (a max-heap).
//
// The heap is intrusive: each element embeds one [Node], and the node function passed to [New]
// returns it. T is therefore normally a pointer to the struct that embeds the Node. The Node
// records its element, so the heap needs no allocation of its own: Push, Pop, Remove, Fix and
// Merge never allocate. An element can be in at most one heap at a time ([Node.InHeap] tells
// whether it is in one), and the node must not be copied while it is in a heap.
//
// Complexities, n being the number of elements (amortized bounds hold over any sequence of
// operations starting from empty heaps):
//
//	Push, Peek, Len, Merge   O(1)
//	Pop, Remove              O(log n) amortized
//	Fix, key grew            O(1) time (see [Heap.Fix] for the exact condition)
//	Fix, key shrank          O(log n) amortized
//
// A Heap is not safe for concurrent use. The zero Heap is empty but has no ordering: use [New].
//
// # Why a pairing heap
//
// PostgreSQL up to 16 chose the transaction to spill by scanning every transaction and
// subtransaction of the reorder buffer (ReorderBufferLargestTXN over the by_txn hash), O(n) for
// each eviction, so that decoding a transaction with ~100k subtransactions under a small
// logical_decoding_work_mem, where nearly every change triggers an eviction, took minutes
// instead of seconds (as reported on pgsql-hackers; the exact figures were not kept). During
// the 17 cycle (commit 5bec1d6bc) it moved to a binary max-heap on txn->size with a hash table from
// transaction to heap index, so that an entry could be found, updated and removed; that heap was
// only built and maintained above 1024 transactions. Before 17.0 this was replaced by the
// general-purpose pairing heap (lib/pairingheap.c), keyed by txn->size and always kept up to date,
// holding only transactions with size > 0: insertion is O(1), the largest is read in O(1), and
// any node can be removed in O(log n) amortized without an index, because the node lives in the
// transaction itself.
//
// This package follows that last design. The intrusive node gives the same "no index, no
// allocation" property in Go; generics replace pairingheap.c's offsetof-based containers. One
// difference: each node also links to its parent (one more word than pairingheap.c's node).
// PostgreSQL updates a transaction's position by removing and re-adding it on every change;
// with the parent link, Fix can instead check the order locally and, in the common case of a
// transaction that grew a little, move nothing at all. That keeps the eviction benchmark on
// par with an indexed binary heap, whose sift is cheap for small key changes. Fix covers both
// directions of a key change, which lets a caller keep one code path for memory growth (a
// change added to a transaction) and shrinkage (changes streamed, spilled or freed).
//
// BenchmarkEvictionChoice (eviction_bench_test.go) compares this heap with container/heap, an
// emirpasic/gods binary heap and the linear scan of PostgreSQL 16 on the eviction workload.
package heap
