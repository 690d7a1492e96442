package bench

import (
	"fmt"
	"testing"

	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spillcompress"
)

// codecs are the spill compressions compared by BenchmarkSpillCompression; none is the
// uncompressed format.
var codecs = []struct {
	name  string
	codec spill.Compressor
}{{"none", nil}, {"lz4", spillcompress.LZ4()}, {"s2", spillcompress.S2()}, {"zstd", spillcompress.Zstd()}}

// BenchmarkSpillCompression runs the spilling cases of the bulk insert (64kB and 256kB) and of
// the streamed pgbench transactions (1MB) with each spill codec. Besides the metrics of the
// other benchmarks it reports written-bytes, what reached the spill files (spilled-bytes is the
// records before compression); the chart script compares written-bytes with codec=none's.
func BenchmarkSpillCompression(b *testing.B) {
	n := size(5_000_000, 500_000)
	perClient := size(100_000, 10_000)
	cases := []struct {
		name string
		wl   *Workload
		wm   int64
	}{
		{fmt.Sprintf("bulk-insert/rows=%s/workmem=64kB", rowsName(n)), BulkInsert(n, 64<<10, seed), 64 << 10},
		{fmt.Sprintf("bulk-insert/rows=%s/workmem=256kB", rowsName(n)), BulkInsert(n, 256<<10, seed), 256 << 10},
		{fmt.Sprintf("pgbench-streamed/txns=%dx32/workmem=1MB", perClient), SmallTxnsStreamed(perClient, 32, 1000, 100, seed), 1 << 20},
	}
	for _, c := range cases {
		for _, cd := range codecs {
			b.Run(c.name+"/codec="+cd.name, func(b *testing.B) {
				var written float64
				im := impl{name: "pgreorder", run: func(tb testing.TB, wl *Workload, m *meter) (outcome, error) {
					out, err := runPgreorder(wl, reorderbuffer.Config{WorkMem: c.wm, Dir: tb.TempDir(), Decoding: Options, SpillCompressor: cd.codec}, m)
					written = float64(out.stats.SpillWrittenBytes)
					return out, err
				}}
				measure(b, c.wl, im, c.wm)
				b.ReportMetric(written, "written-bytes")
			})
		}
	}
}
