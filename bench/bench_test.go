package bench

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkManySubxacts is PostgreSQL's "many subtransactions" case (the one that made it add a
// heap): one streamed transaction of 1M subtransactions with one insert each, work mem 4MB.
func BenchmarkManySubxacts(b *testing.B) {
	n := size(1_000_000, 1_000_000)
	const workMem = 4 << 20
	wl := ManySubxacts(n, workMem, seed)
	for _, im := range []impl{withBuffer("pgreorder", workMem, false), naiveImpl} {
		b.Run(fmt.Sprintf("subxacts=%s/workmem=4MB/impl=%s", rowsName(n), im.name), func(b *testing.B) {
			measure(b, wl, im, workMem)
		})
	}
}

// BenchmarkBulkInsert is PostgreSQL's "single big insertion" (10M rows, no spilling: the cost
// of accounting alone, with accounting turned off beside it and a paired on/off comparison) and
// the parallel-apply study's bulk insert of 5M rows at 64kB, 256kB and 64MB.
func BenchmarkBulkInsert(b *testing.B) {
	n := size(10_000_000, 1_000_000)
	wl := BulkInsert(n, 64<<20, seed) // the server streams at its default 64MB
	for _, im := range []impl{
		withBuffer("pgreorder", unlimited, false),
		withBuffer("pgreorder-noaccounting", unlimited, true),
		naiveImpl,
		generatorOnly,
	} {
		b.Run(fmt.Sprintf("rows=%s/workmem=unlimited/impl=%s", rowsName(n), im.name), func(b *testing.B) {
			measure(b, wl, im, 0)
		})
	}
	b.Run(fmt.Sprintf("rows=%s/workmem=unlimited/accounting=paired", rowsName(n)), func(b *testing.B) {
		benchAccountingCost(b, wl)
	})

	n = size(5_000_000, 500_000)
	for _, wm := range workMems {
		wl := BulkInsert(n, wm.bytes, seed)
		im := withBuffer("pgreorder", wm.bytes, false)
		b.Run(fmt.Sprintf("rows=%s/workmem=%s/impl=pgreorder", rowsName(n), wm.name), func(b *testing.B) {
			measure(b, wl, im, wm.bytes)
		})
	}
	wl = BulkInsert(n, 64<<20, seed)
	b.Run(fmt.Sprintf("rows=%s/workmem=none/impl=naive", rowsName(n)), func(b *testing.B) {
		measure(b, wl, naiveImpl, 0)
	})
}

// benchAccountingCost runs the workload with accounting off and on, alternating, several
// times, and reports the best time of each and the overhead of accounting between them. Pairing
// the runs in one benchmark keeps the load of the machine (shared with others) the same for
// both as far as possible.
func benchAccountingCost(b *testing.B, wl *Workload) {
	b.Logf("%v", wl)
	rounds := 3
	if testing.Short() {
		rounds = 5
	}
	var best [2]time.Duration // [off, on]
	for i := range best {
		best[i] = time.Duration(1<<63 - 1)
	}
	var m meter
	m.start()
	for range b.N {
		for r := range rounds {
			order := []bool{false, true}
			if r%2 == 1 {
				order = []bool{true, false}
			}
			for _, on := range order {
				im := withBuffer("pgreorder", unlimited, !on)
				start := time.Now()
				out, err := im.run(b, wl, &m)
				d := time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if out.changes != wl.Kept {
					b.Fatalf("handed out %d changes, want %d", out.changes, wl.Kept)
				}
				k := 0
				if on {
					k = 1
				}
				best[k] = min(best[k], d)
			}
		}
	}
	m.stop()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(wl.Changes) }
	b.ReportMetric(per(best[0]), "off-ns/change")
	b.ReportMetric(per(best[1]), "on-ns/change")
	b.ReportMetric(100*(per(best[1])/per(best[0])-1), "overhead-%")
}

// BenchmarkSmallTxns is PostgreSQL's "many small transactions" (pgbench -t 100000 -c 32:
// three updates and an insert each, streaming off), and a variant where 32 concurrent
// transactions are all streamed, their blocks interleaved.
func BenchmarkSmallTxns(b *testing.B) {
	perClient := size(100_000, 10_000)
	const clients = 32
	wl := SmallTxns(perClient, clients, seed)
	for _, im := range []impl{withBuffer("pgreorder", 64<<20, false), naiveImpl} {
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
		{"64MB", withBuffer("pgreorder", 64<<20, false), 64 << 20},
		{"1MB", withBuffer("pgreorder", 1<<20, false), 1 << 20},
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
			im := withBuffer("pgreorder", wm.bytes, false)
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
