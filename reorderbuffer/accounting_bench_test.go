package reorderbuffer

import (
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/bench"
	"github.com/pgreorder/pgreorder/decoding"
)

// BenchmarkAccounting measures what memory accounting costs: PostgreSQL's "single big insertion"
// (one large transaction, no spilling) through the same Buffer with and without accounting,
// alternating in one benchmark so that both meet the same machine load. Without accounting the
// buffer takes the same path for every record but counts nothing, keeps no free chunks and no
// eviction heap: a state only this benchmark reaches.
func BenchmarkAccounting(b *testing.B) {
	n := int64(1_000_000)
	if testing.Short() {
		n = 100_000
	}
	wl := bench.BulkInsert(n, 64<<20, 20240501)
	run := func(accounting bool) time.Duration {
		buf, err := New(Config{WorkMem: 1 << 62, Dir: b.TempDir(), Decoding: bench.Options})
		if err != nil {
			b.Fatal(err)
		}
		defer buf.Close()
		buf.noAccounting = !accounting
		start := time.Now()
		var changes int64
		for lsn, data := range wl.Messages() {
			if err := buf.Add(lsn, data); err != nil {
				b.Fatal(err)
			}
			switch decoding.MessageType(data[0]) {
			case decoding.MsgCommit, decoding.MsgStreamCommit:
				for x, ok := buf.Next(); ok; x, ok = buf.Next() {
					for _, err := range x.Changes() {
						if err != nil {
							b.Fatal(err)
						}
						changes++
					}
					buf.Ack(x)
				}
			}
		}
		d := time.Since(start)
		if changes < wl.Kept {
			b.Fatalf("handed out %d messages, want at least %d changes", changes, wl.Kept)
		}
		if err := buf.CheckInvariants(); err != nil {
			b.Fatal(err)
		}
		return d
	}
	best := [2]time.Duration{1<<63 - 1, 1<<63 - 1} // off, on
	for i := range b.N {
		for _, on := range [][2]bool{{false, true}, {true, false}}[i%2] {
			k := 0
			if on {
				k = 1
			}
			best[k] = min(best[k], run(on))
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(wl.Changes) }
	b.ReportMetric(per(best[0]), "off-ns/change")
	b.ReportMetric(per(best[1]), "on-ns/change")
	b.ReportMetric(100*(per(best[1])/per(best[0])-1), "overhead-%")
}
