package target

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
)

// BenchmarkNetTableAdd holds the changes of a group of pgbench-like transactions, a keyed
// table's updates (by a key of 100000 rows, some updated twice) and an insert-only table's
// inserts, as absorb does, then forgets them as the commit does (or keeps their containers, as
// a commit whose set statements succeeded does): the cost per change held.
func BenchmarkNetTableAdd(b *testing.B) {
	const group = 256
	seed := uint64(20240501)
	b.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	text := func(s string) decoding.Column { return decoding.Column{Kind: decoding.ColumnText, Data: []byte(s)} }
	keyed := &Table{Table: detect.Table{Name: `"public"."a"`, Key: []int{0}},
		cols: []colMap{{name: `"aid"`}, {name: `"bid"`}, {name: `"abalance"`}, {name: `"filler"`}}}
	log := &Table{Table: detect.Table{Name: `"public"."h"`},
		cols: []colMap{{name: `"tid"`}, {name: `"bid"`}, {name: `"aid"`}, {name: `"delta"`}, {name: `"mtime"`}}}
	upd := make([]decoding.Tuple, group)
	ins := make([]decoding.Tuple, group)
	for i := range group {
		aid := strconv.Itoa(rng.IntN(100000) + 1)
		delta := strconv.Itoa(rng.IntN(10000) - 5000)
		upd[i] = decoding.Tuple{text(aid), text("1"), text(delta), text("                                                                                    ")}
		ins[i] = decoding.Tuple{text("3"), text("1"), text(aid), text(delta), text("2026-12-02 03:51:40.123456")}
	}
	// start: the tables start empty (new), with the room absorb gives them after a group of the
	// same size (sized: coalescer.sizes), or with the emptied containers of the last group's
	// tables (spare: coalescer.recycle, as after set statements that succeeded).
	for _, start := range []string{"new", "sized", "spare"} {
		b.Run("start="+start, func(b *testing.B) {
			b.ReportAllocs()
			var c coalescer
			if start != "new" {
				c.sizes = map[*Table]int{keyed: group, log: group}
			}
			for range b.N {
				a, h := c.newNetTable(keyed, []int{0}, true), c.newNetTable(log, nil, true)
				for i := range group {
					if !a.add('U', upd[i], nil, 0, int32(i)) || !h.add('I', ins[i], nil, 0, int32(i)) {
						b.Fatal("a change was not held")
					}
				}
				if start == "spare" {
					c.recycle(a)
					c.recycle(h)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2*group), "ns/change")
		})
	}
}
