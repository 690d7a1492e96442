package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// BenchmarkOpenTxns is n streamed transactions of 5 inserts each open at once under a work mem
// of 4MB: what the buffer keeps per open transaction outside work mem (transaction state,
// subtransaction and schema lists, spill logs, progress), measured on the Go heap after a GC
// with every transaction open, minus the record bytes in memory. Reported as bytes/open-txn,
// with the buffer's own account of it (accounted-bytes/open-txn, Stats.OverheadBytes).
// PGREORDER_BENCH_HEAPPROFILE=FILE writes a heap profile at that point (go tool pprof -sample_index=inuse_space).
func BenchmarkOpenTxns(b *testing.B) {
	sizes := []int64{10_000, 100_000}
	if *full {
		sizes = append(sizes, 1_000_000)
	}
	const workMem = 4 << 20
	for _, n := range sizes {
		wl := ManyOpenTxns(n, 5, seed)
		b.Run(fmt.Sprintf("open=%s/workmem=4MB", rowsName(n)), func(b *testing.B) {
			b.ReportAllocs()
			var perTxn, accounted float64
			for range b.N {
				p, a, err := openTxnsCost(wl, reorderbuffer.Config{WorkMem: workMem, Dir: b.TempDir(), Decoding: Options}, n)
				if err != nil {
					b.Fatal(err)
				}
				perTxn, accounted = p, a
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/(float64(b.N)*float64(wl.Changes)), "ns/change")
			b.ReportMetric(perTxn, "bytes/open-txn")
			b.ReportMetric(accounted, "accounted-bytes/open-txn")
		})
	}
}

// openTxnsCost feeds wl (n transactions opened, then committed) to a Buffer and returns the Go
// heap per open transaction when all are open, beyond the record bytes in memory, and what the
// buffer accounts for it.
func openTxnsCost(wl *Workload, cfg reorderbuffer.Config, n int64) (perTxn, accounted float64, err error) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := int64(ms.HeapAlloc)
	buf, err := reorderbuffer.New(cfg)
	if err != nil {
		return 0, 0, err
	}
	defer buf.Close()
	measured := false
	var txns int64
	for lsn, data := range wl.Messages() {
		if decoding.MessageType(data[0]) == decoding.MsgStreamCommit && !measured {
			measured = true
			runtime.GC()
			runtime.ReadMemStats(&ms)
			st := buf.Stats()
			if int64(st.OpenTxns) != n {
				return 0, 0, fmt.Errorf("%d transactions open, want %d", st.OpenTxns, n)
			}
			perTxn = float64(int64(ms.HeapAlloc)-base-st.MemoryBytes) / float64(n)
			accounted = float64(st.OverheadBytes) / float64(n)
			if path := os.Getenv("PGREORDER_BENCH_HEAPPROFILE"); path != "" {
				if err := writeHeapProfile(path); err != nil {
					return 0, 0, err
				}
			}
		}
		if err := buf.Add(lsn, data); err != nil {
			return 0, 0, err
		}
		for t, ok := buf.Next(); ok; t, ok = buf.Next() {
			for _, err := range t.Changes() {
				if err != nil {
					return 0, 0, err
				}
			}
			txns++
			buf.Ack(t)
		}
	}
	if txns != wl.Txns {
		return 0, 0, fmt.Errorf("%d transactions handed out, want %d", txns, wl.Txns)
	}
	return perTxn, accounted, buf.Close()
}

// writeHeapProfile writes the live heap's profile to path (0600), for
// PGREORDER_BENCH_HEAPPROFILE: where the bytes of the open transactions are.
func writeHeapProfile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// TestWriteOpenTxnsCapture writes the ManyOpenTxns stream of PGREORDER_BENCH_OPEN_TXNS
// transactions (default 100000) as a capture to PGREORDER_BENCH_WRITE_CAPTURE, for measuring
// `pgreorder replay -work-mem 4MB` on it (its peak RSS, e.g. with /usr/bin/time -v). Skipped
// unless that variable is set.
func TestWriteOpenTxnsCapture(t *testing.T) {
	path := os.Getenv("PGREORDER_BENCH_WRITE_CAPTURE")
	if path == "" {
		t.Skip("set PGREORDER_BENCH_WRITE_CAPTURE=FILE to write the capture")
	}
	n := int64(100_000)
	if v := os.Getenv("PGREORDER_BENCH_OPEN_TXNS"); v != "" {
		var err error
		if n, err = strconv.ParseInt(v, 10, 64); err != nil || n <= 0 {
			t.Fatalf("PGREORDER_BENCH_OPEN_TXNS=%q: want a positive number", v)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := capture.NewWriter(f)
	wl := ManyOpenTxns(n, 5, seed)
	if err := w.Comment(wl.String()); err != nil {
		t.Fatal(err)
	}
	for lsn, data := range wl.Messages() {
		if err := w.Write(capture.Record{LSN: lsn, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
