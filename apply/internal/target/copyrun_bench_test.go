package target

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
)

// BenchmarkCopyRun inserts rows into a one-int table in runs of a given length, each run one
// COPY (Conn.FlushInserts), 200,000 rows per target transaction, as a worker applying a streamed
// transaction does between parts, on the newest PostgreSQL installed. It reports the target
// backend's CPU time per row (backend-ns/row, /proc/PID/schedstat: Linux only): what each COPY
// statement costs the target beyond its rows, and so how long a run SendAhead keeps
// (copyHoldRows) before sending it.
func BenchmarkCopyRun(b *testing.B) {
	ctx, c := benchConn(b, "CREATE TABLE t (c int)")
	rel := NewRegistry().Intern(&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Name: "c", TypeOID: 23}}}, nil)
	const perTxn = 200_000
	key := ProgressKey{Slot: "s", System: "1", Timeline: 1}
	for _, run := range []int{100, 300, 500, 700, 1000, 2000, 5000, copyHoldRows} {
		b.Run(fmt.Sprintf("rows=%d", run), func(b *testing.B) {
			txn := func(end decoding.LSN) {
				c.Begin(1, nil)
				for i := range perTxn {
					v := []byte(strconv.Itoa(i))
					if err := c.Change(ctx, &decoding.Insert{New: decoding.Tuple{{Kind: decoding.ColumnText, Data: v}}}, []*Relation{rel}); err != nil {
						b.Fatal(err)
					}
					if (i+1)%run == 0 {
						if err := c.FlushPending(ctx); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := c.Commit(ctx, key, end, false); err != nil {
					b.Fatal(err)
				}
				if err := c.pg.Exec(ctx, "TRUNCATE public.t").Close(); err != nil {
					b.Fatal(err)
				}
			}
			txn(1)
			cpu0 := backendCPU(b, c.PID())
			b.ResetTimer()
			for i := range b.N {
				txn(decoding.LSN(2 + i))
			}
			b.StopTimer()
			b.ReportMetric(float64(backendCPU(b, c.PID())-cpu0)/float64(b.N*perTxn), "backend-ns/row")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perTxn), "ns/row")
		})
	}
}
