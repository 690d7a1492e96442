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
// inserts, as absorb does, then forgets them as the commit does: the cost per change held.
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
	// sized: the tables start with the room absorb gives them after a group of the same size
	// (coalescer.sizes).
	for _, sized := range []bool{false, true} {
		b.Run("sized="+strconv.FormatBool(sized), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				a := &netTable{m: keyed, keyed: true, key: []int{0}}
				h := &netTable{m: log}
				if sized {
					a.log, a.rows, a.keys = make([]held, 0, group), make([]netRow, 0, group), make(map[string]int, group)
					h.log, h.rows = make([]held, 0, group), make([]netRow, 0, group)
				}
				for i := range group {
					if !a.add('U', upd[i], nil, 0, int32(i)) || !h.add('I', ins[i], nil, 0, int32(i)) {
						b.Fatal("a change was not held")
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2*group), "ns/change")
		})
	}
}
