package reorderbuffer

import (
	"bytes"
	"testing"

	"github.com/pgreorder/pgreorder/bench"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/cputime"
)

// BenchmarkHotPath is the buffer's own cost per change of a bulk insert, the generator's left
// out: the messages are generated before the timer starts. With no limit nothing spills; at
// 64kB and 256kB (the server streaming at the same setting) nearly every record goes through the
// spill log.
func BenchmarkHotPath(b *testing.B) {
	for _, c := range []struct {
		name    string
		workMem int64
	}{{"unlimited", 0}, {"256kB", 256 << 10}, {"64kB", 64 << 10}} {
		b.Run("workmem="+c.name, func(b *testing.B) { hotPath(b, c.workMem) })
	}
}

func hotPath(b *testing.B, workMem int64) {
	server, limit := int64(64<<20), int64(1<<62)
	if workMem > 0 {
		server, limit = workMem, workMem
	}
	wl := bench.BulkInsert(200_000, server, 20240501)
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
	cpu0 := cputime.Process()
	for range b.N {
		buf, err := New(Config{WorkMem: limit, Dir: b.TempDir(), Decoding: bench.Options})
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
	cpu := cputime.Process() - cpu0
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(wl.Changes), "ns/change")
	// The process's CPU time (every thread, the collector's too): steadier than the elapsed
	// time on a machine shared with other work.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(wl.Changes), "cpu-ns/change")
}
