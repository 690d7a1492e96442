package snapshot_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// BenchmarkCopy copies a pgbench_accounts-like table of 200,000 rows (about 26 MB) from the
// newest installed server, each row's values decoded with pgvalue as a consumer would, with 1
// and 2 workers, in the text and the binary format. Every iteration opens the same exported
// snapshot again (allowed while the replication connection stays idle). It reports rows/s and
// the table's MB/s; the server runs on the same machine, so the figures measure both sides.
func BenchmarkCopy(b *testing.B) {
	majors := pgtest.Majors(b)
	srv := pgtest.Shared(b, majors[len(majors)-1])
	db := pgtest.NewDatabase(b, srv)
	cs := srv.ConnString(db)
	ctx := context.Background()
	const rows = 200000
	if err := pgtest.Exec(ctx, cs,
		`CREATE TABLE accounts (aid int PRIMARY KEY, bid int, abalance int, filler char(84))`,
		fmt.Sprintf(`INSERT INTO accounts SELECT i, i / 100000 + 1, 0, '' FROM generate_series(1, %d) i`, rows),
		`VACUUM ANALYZE accounts`, `CREATE PUBLICATION pub FOR TABLE accounts`); err != nil {
		b.Fatal(err)
	}
	var size int64
	for _, bin := range []bool{false, true} {
		conn, err := replication.Connect(ctx, replication.Config{ConnString: srv.ReplicationConnString(db),
			Slot: fmt.Sprintf("bench_%t", bin), Publications: []string{"pub"}, Binary: bin})
		if err != nil {
			b.Fatal(err)
		}
		snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
		if err != nil {
			b.Fatal(err)
		}
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/workers=%d", map[bool]string{false: "text", true: "binary"}[bin], workers), func(b *testing.B) {
				cfg := snapshot.Config{ConnString: cs, Publications: []string{"pub"}, Workers: workers,
					ChunkSize: 4 << 20, Binary: bin}
				b.ReportAllocs()
				var copied atomic.Int64
				start := time.Now()
				for b.Loop() {
					res, err := snapshot.Copy(ctx, cfg, snap, func(ctx context.Context, c *snapshot.Chunk) error {
						dec := pgvalue.NewDecoder(nil)
						for ch, err := range dec.Changes(c) {
							if err != nil {
								return err
							}
							for col := range ch.New.Columns() {
								if _, err := col.Value(); err != nil {
									return err
								}
							}
							copied.Add(1)
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
					if res.Rows != rows {
						b.Fatalf("%d rows copied", res.Rows)
					}
					size = res.Tables[0].Size
				}
				secs := time.Since(start).Seconds()
				b.ReportMetric(float64(copied.Load())/secs, "rows/s")
				b.ReportMetric(float64(size)*float64(b.N)/secs/1e6, "table-MB/s")
			})
		}
		conn.Close(ctx)
	}
}
