package reorderbuffer

import (
	"bytes"
	"testing"

	"github.com/pgreorder/pgreorder/bench"
	"github.com/pgreorder/pgreorder/decoding"
)

// BenchmarkHotPath is the buffer's own cost per change of a bulk insert with no limit, the
// generator's left out: the messages are generated before the timer starts.
func BenchmarkHotPath(b *testing.B) {
	wl := bench.BulkInsert(200_000, 64<<20, 20240501)
	type msg struct {
		lsn  decoding.LSN
		data []byte
	}
	var msgs []msg
	for lsn, data := range wl.Messages() {
		msgs = append(msgs, msg{lsn, bytes.Clone(data)})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		buf, err := New(Config{WorkMem: 1 << 62, Dir: b.TempDir(), Decoding: bench.Options})
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			if err := buf.Add(m.lsn, m.data); err != nil {
				b.Fatal(err)
			}
			switch decoding.MessageType(m.data[0]) {
			case decoding.MsgCommit, decoding.MsgStreamCommit:
				for x, ok := buf.Next(); ok; x, ok = buf.Next() {
					for _, err := range x.Changes() {
						if err != nil {
							b.Fatal(err)
						}
					}
					buf.Ack(x)
				}
			}
		}
		buf.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(wl.Changes), "ns/change")
}
