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

// BenchmarkRead is what reading a committed transaction back costs per change, held in memory:
// parsed (Changes) or its row changes read only as far as their relation (Heads), the read a
// consumer saves when it only routes the records. rows=narrow is the bulk insert (one int
// column), rows=accounts pgbench's update of pgbench_accounts (four columns, 84 bytes of filler).
func BenchmarkRead(b *testing.B) {
	for _, rows := range []string{"narrow", "accounts"} {
		buf, err := New(Config{Dir: b.TempDir(), Decoding: bench.Options})
		if err != nil {
			b.Fatal(err)
		}
		defer buf.Close()
		add := func(lsn decoding.LSN, data []byte) {
			if err := buf.Add(lsn, data); err != nil {
				b.Fatal(err)
			}
		}
		if rows == "narrow" {
			for lsn, data := range bench.BulkInsert(20_000, 64<<20, 20240501).Messages() {
				add(lsn, data)
			}
		} else {
			enc := func(m decoding.Message) []byte {
				out, err := decoding.Append(nil, m, false, bench.Options)
				if err != nil {
					b.Fatal(err)
				}
				return out
			}
			col := func(s string) decoding.Column { return decoding.Column{Kind: 't', Data: []byte(s)} }
			lsn := decoding.LSN(0x1000)
			add(lsn, enc(&decoding.Begin{FinalLSN: 0x1000 + 20_002, Xid: 1000}))
			add(lsn+1, enc(&decoding.Relation{RelationID: 16384, Namespace: "public", Name: "pgbench_accounts", ReplicaIdentity: 'd',
				Columns: []decoding.RelationColumn{{Flags: 1, Name: "aid", TypeOID: 23}, {Name: "bid", TypeOID: 23},
					{Name: "abalance", TypeOID: 23}, {Name: "filler", TypeOID: 1042}}}))
			up := enc(&decoding.Update{RelationID: 16384, New: decoding.Tuple{col("123456"), col("2"), col("-4711"),
				col(string(bytes.Repeat([]byte{' '}, 84)))}})
			for i := range 20_000 {
				add(lsn+2+decoding.LSN(i), up)
			}
			add(0x1000+20_002, enc(&decoding.Commit{CommitLSN: 0x1000 + 20_002, EndLSN: 0x1000 + 20_003}))
		}
		x, ok := buf.Next()
		if !ok {
			b.Fatal("no transaction")
		}
		for _, how := range []string{"Changes", "Heads"} {
			b.Run("rows="+rows+"/how="+how, func(b *testing.B) {
				n := 0
				b.ReportAllocs()
				for b.Loop() {
					if how == "Changes" {
						for _, err := range x.Changes() {
							if err != nil {
								b.Fatal(err)
							}
							n++
						}
						continue
					}
					for _, err := range x.Heads() {
						if err != nil {
							b.Fatal(err)
						}
						n++
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/change")
			})
		}
	}
}
