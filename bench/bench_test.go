package bench

import (
	"fmt"
	"testing"
)

// BenchmarkManySubxacts is PostgreSQL's "many subtransactions" case (the one that made it add a
// heap): one streamed transaction of 1M subtransactions with one insert each, work mem 4MB.
func BenchmarkManySubxacts(b *testing.B) {
	n := size(1_000_000, 1_000_000)
	const workMem = 4 << 20
	wl := ManySubxacts(n, workMem, seed)
	for _, im := range []impl{withBuffer("pgreorder", workMem), naiveImpl} {
		b.Run(fmt.Sprintf("subxacts=%s/workmem=4MB/impl=%s", rowsName(n), im.name), func(b *testing.B) {
			measure(b, wl, im, workMem)
		})
	}
}

// BenchmarkBulkInsert is PostgreSQL's "single big insertion" (10M rows, no spilling: the cost
// of accounting alone; reorderbuffer's BenchmarkAccounting compares the same buffer with
// accounting off) and the parallel-apply study's bulk insert of 5M rows at 64kB, 256kB and 64MB.
func BenchmarkBulkInsert(b *testing.B) {
	n := size(10_000_000, 1_000_000)
	wl := BulkInsert(n, 64<<20, seed) // the server streams at its default 64MB
	for _, im := range []impl{
		withBuffer("pgreorder", unlimited),
		naiveImpl,
		generatorOnly,
	} {
		b.Run(fmt.Sprintf("rows=%s/workmem=unlimited/impl=%s", rowsName(n), im.name), func(b *testing.B) {
			measure(b, wl, im, 0)
		})
	}

	n = size(5_000_000, 500_000)
	for _, wm := range workMems {
		wl := BulkInsert(n, wm.bytes, seed)
		im := withBuffer("pgreorder", wm.bytes)
		b.Run(fmt.Sprintf("rows=%s/workmem=%s/impl=pgreorder", rowsName(n), wm.name), func(b *testing.B) {
			measure(b, wl, im, wm.bytes)
		})
	}
	wl = BulkInsert(n, 64<<20, seed)
	b.Run(fmt.Sprintf("rows=%s/workmem=none/impl=naive", rowsName(n)), func(b *testing.B) {
		measure(b, wl, naiveImpl, 0)
	})
}

// BenchmarkSmallTxns is PostgreSQL's "many small transactions" (pgbench -t 100000 -c 32:
// three updates and an insert each, streaming off), and a variant where 32 concurrent
// transactions are all streamed, their blocks interleaved.
func BenchmarkSmallTxns(b *testing.B) {
	perClient := size(100_000, 10_000)
	const clients = 32
	wl := SmallTxns(perClient, clients, seed)
	for _, im := range []impl{withBuffer("pgreorder", 64<<20), naiveImpl} {
		b.Run(fmt.Sprintf("txns=%dx%d/streamed=false/workmem=64MB/impl=%s", perClient, clients, im.name), func(b *testing.B) {
			measure(b, wl, im, 64<<20)
		})
	}
	wl = SmallTxnsStreamed(perClient, clients, 1000, 100, seed)
	for _, c := range []struct {
		name string
		im   impl
		wm   int64
	}{
		{"64MB", withBuffer("pgreorder", 64<<20), 64 << 20},
		{"1MB", withBuffer("pgreorder", 1<<20), 1 << 20},
		{"none", naiveImpl, 0},
	} {
		b.Run(fmt.Sprintf("txns=%dx%d/streamed=true/workmem=%s/impl=%s", perClient, clients, c.name, c.im.name), func(b *testing.B) {
			measure(b, wl, c.im, c.wm)
		})
	}
}

// BenchmarkRollbackToSavepoint is the parallel-apply study's rollback case: 5M rows of which
// 10, 20, 30 or 50% are rolled back to a savepoint, at 64kB, 256kB and 64MB.
func BenchmarkRollbackToSavepoint(b *testing.B) {
	n := size(5_000_000, 500_000)
	for _, pct := range []int{10, 20, 30, 50} {
		for _, wm := range workMems {
			wl := RollbackToSavepoint(n, pct, wm.bytes, seed)
			im := withBuffer("pgreorder", wm.bytes)
			b.Run(fmt.Sprintf("rows=%s/rollback=%d%%/workmem=%s/impl=pgreorder", rowsName(n), pct, wm.name), func(b *testing.B) {
				measure(b, wl, im, wm.bytes)
			})
		}
		wl := RollbackToSavepoint(n, pct, 64<<20, seed)
		b.Run(fmt.Sprintf("rows=%s/rollback=%d%%/workmem=none/impl=naive", rowsName(n), pct), func(b *testing.B) {
			measure(b, wl, naiveImpl, 0)
		})
	}
}
