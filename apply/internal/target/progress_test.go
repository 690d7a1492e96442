package target

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestLSNs: a pg_lsn array written by AppendLSNs reads back as it was.
func TestLSNs(t *testing.T) {
	for _, lsns := range [][]decoding.LSN{nil, {0x16B3748}, {0x16B3748, 0x16B3800, 1<<32 | 0x10, 1<<40 | 0xffff}} {
		text := string(AppendLSNs(nil, lsns))
		got, err := ParseLSNs(text)
		if err != nil || !slices.Equal(got, lsns) {
			t.Fatalf("%q: ParseLSNs = %v, %v; want %v", text, got, err, lsns)
		}
	}
	if _, err := ParseLSNs("{0/1,x}"); err == nil {
		t.Fatal("ParseLSNs read a bad position")
	}
}

// BenchmarkCommitProgress commits b.N target transactions that write nothing but the progress
// row, each in the one round trip of Commit, as a worker applying small transactions one at a
// time commits each of them, on the newest PostgreSQL installed. It reports the target backend's
// CPU time per commit (backend-cpu-us/commit, from /proc/PID/schedstat: Linux only), which the
// machine's load changes less than the wall time.
func BenchmarkCommitProgress(b *testing.B) {
	ctx, c := benchConn(b, "INSERT INTO progress VALUES ('s', '0/0', '7000000000000000001', 1)")
	key := ProgressKey{Slot: "s", System: "7000000000000000001", Timeline: 1}
	commit := func(end decoding.LSN) {
		c.Begin(1, nil)
		if err := c.Commit(ctx, key, end, false); err != nil {
			b.Fatal(err)
		}
	}
	commit(1) // prepared and planned before the timing starts
	cpu0 := backendCPU(b, c.PID())
	b.ResetTimer()
	for i := range b.N {
		commit(decoding.LSN(2 + i))
	}
	b.StopTimer()
	b.ReportMetric(float64(backendCPU(b, c.PID())-cpu0)/1e3/float64(b.N), "backend-cpu-us/commit")
	rows, err := Query(ctx, c.PG(), `SELECT end_lsn::text FROM "public"."progress" WHERE slot = 's'`)
	if err != nil || len(rows) != 1 || string(rows[0][0]) != decoding.LSN(1+b.N).String() {
		b.Fatalf("the progress row after %d commits: %q, %v", b.N, rows, err)
	}
}

// benchConn connects to a new database of the newest PostgreSQL installed, with the table
// public.progress made and its statement prepared, after running setup there; the connection is
// closed when the benchmark ends.
func benchConn(b *testing.B, setup ...string) (context.Context, *Conn) {
	majors := pgtest.Majors(b)
	srv := pgtest.Shared(b, majors[len(majors)-1])
	dsn := srv.ConnString(pgtest.NewDatabase(b, srv))
	ctx := pgtest.Context(b, 10*time.Minute)
	pgtest.ExecAll(b, dsn, "CREATE TABLE progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)")
	pgtest.ExecAll(b, dsn, setup...)
	c, err := Connect(ctx, &Options{ConnString: dsn, Logger: slog.New(slog.DiscardHandler), Now: time.Now}, "bench", &Counters{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(context.Background()) })
	upsert, _ := ProgressSQL(`"public"."progress"`)
	if err := c.PrepareProgress(ctx, upsert); err != nil {
		b.Fatal(err)
	}
	return ctx, c
}

// backendCPU returns the CPU time of process pid so far, in nanoseconds (pgtest.RunTime); the
// benchmark is skipped where it cannot be read.
func backendCPU(b *testing.B, pid uint32) int64 {
	d, err := pgtest.RunTime(int(pid))
	if err != nil {
		b.Skipf("the backend's CPU time: %v", err)
	}
	return d.Nanoseconds()
}
