package target

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgreorder/pgreorder/decoding"
)

// BenchmarkSetUpdate sends 1,000 rows shaped like pgbench_accounts' (an int key, two ints and a
// char(84) filler) per statement, their value arrays in the text format (textArray) or as
// columnArray sends them (binary for integers and text), on the newest PostgreSQL installed:
// stmt=read only reads the arrays (what their format changes), stmt=update updates as many
// random rows of a 100,000-row table with them, as a set UPDATE does. It reports the target
// backend's CPU time per row (backend-ns/row, /proc/PID/schedstat: Linux only) and the
// applier's time to build the arrays (build-ns/row).
func BenchmarkSetUpdate(b *testing.B) {
	const rows, perTxn = 100_000, 1000
	ctx, c := benchConn(b, "CREATE TABLE t (aid int PRIMARY KEY, bid int, abalance int, filler char(84))",
		fmt.Sprintf("INSERT INTO t SELECT g, g / 100000, 0, '' FROM generate_series(1, %d) g", rows), "VACUUM ANALYZE t")
	if err := c.pg.Exec(ctx, "SET enable_hashjoin = off; SET enable_mergejoin = off").Close(); err != nil {
		b.Fatal(err)
	}
	const unnest = "ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4)) AS v(a, b, c, d)"
	stmts := map[string]string{
		"read":   "SELECT pg_catalog.count(v.d) FROM " + unnest,
		"update": "UPDATE public.t SET bid = v.b, abalance = v.c, filler = v.d FROM " + unnest + " WHERE t.aid = v.a",
	}
	m := &Table{cols: []colMap{{arrayOID: pgtype.Int4ArrayOID, delim: ','}, {arrayOID: pgtype.Int4ArrayOID, delim: ','},
		{arrayOID: pgtype.Int4ArrayOID, delim: ','}, {arrayOID: pgtype.BPCharArrayOID, delim: ','}}}
	oids := []uint32{pgtype.Int4ArrayOID, pgtype.Int4ArrayOID, pgtype.Int4ArrayOID, pgtype.BPCharArrayOID}
	filler := strings.Repeat(" ", 84)
	rng := rand.New(rand.NewPCG(1, 2))
	batch := func() []decoding.Tuple {
		seen := map[int]bool{}
		tups := make([]decoding.Tuple, 0, perTxn)
		for len(tups) < perTxn {
			k := 1 + rng.IntN(rows)
			if seen[k] {
				continue
			}
			seen[k] = true
			tups = append(tups, decoding.Tuple{text(strconv.Itoa(k)), text(strconv.Itoa(k % 10)), text(strconv.Itoa(rng.IntN(10000) - 5000)), text(filler)})
		}
		return tups
	}
	for _, stmt := range []string{"read", "update"} {
		for _, binary := range []bool{false, true} {
			b.Run(fmt.Sprintf("stmt=%s/binary=%v", stmt, binary), func(b *testing.B) {
				b.ReportAllocs()
				sql := stmts[stmt]
				var build int64
				txn := func() {
					tups := batch()
					b.StartTimer()
					vals, fmts := make([][]byte, len(oids)), make([]int16, len(oids))
					for i := range oids {
						if binary {
							vals[i], fmts[i] = columnArray(m, tups, i)
						} else {
							vals[i] = textArray(tups, i, ',')
						}
					}
					b.StopTimer()
					res := c.pg.ExecParams(ctx, sql, vals, oids, fmts, nil).Read()
					if res.Err != nil {
						b.Fatal(res.Err)
					}
					if n := res.CommandTag.RowsAffected(); stmt == "update" && n != perTxn {
						b.Fatalf("updated %d rows, want %d", n, perTxn)
					}
				}
				b.StopTimer()
				txn()
				cpu0 := backendCPU(b, c.PID())
				start := b.Elapsed()
				for range b.N {
					txn()
				}
				build = (b.Elapsed() - start).Nanoseconds()
				b.ReportMetric(float64(backendCPU(b, c.PID())-cpu0)/float64(b.N*perTxn), "backend-ns/row")
				b.ReportMetric(float64(build)/float64(b.N*perTxn), "build-ns/row")
			})
		}
	}
}

// text is a text value of a tuple.
func text(s string) decoding.Column {
	return decoding.Column{Kind: decoding.ColumnText, Data: []byte(s)}
}
