package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestApplyFlags checks that missing and invalid flags are refused with a message naming them.
func TestApplyFlags(t *testing.T) {
	base := []string{"-source", "host=/nonexistent", "-target", "host=/nonexistent", "-slot", "s", "-publication", "p"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "missing -source, -target, -slot, -publication"},
		{[]string{"-source", "x", "-slot", "s"}, "missing -target, -publication"},
		{append(base, "-mode", "fast"), `-mode "fast": valid values are buffered, eager and parallel`},
		{append(base, "-workers", "-1"), "-workers -1"},
		{append(base, "-commit-order", "any"), `-commit-order "any": valid values are source and relaxed`},
		{append(base, "-commit-order", "relaxed"), "-commit-order relaxed goes with -mode parallel (-mode is buffered"},
		{append(base, "-mode", "eager", "-commit-order", "relaxed"), "-commit-order relaxed goes with -mode parallel (-mode is eager"},
		{append(base, "-work-mem", "0"), `-work-mem "0"`},
		{append(base, "extra"), "unexpected arguments: extra"},
		{append(base, "-conflict", "insert_exists=win"), `-conflict: conflict: invalid resolution "win"`},
		{append(base, "-conflict", "insert_missing=skip"), `conflict type "insert_missing"`},
		{append(base, "-origin-filter", "some"), `-origin-filter "some": valid values are any and none`},
		{append(base, "-conflict-retention", "1ms"), "-conflict-retention 1ms"},
		{append(base, "-no-conflict-detection", "-conflict-log-table", "log"), "-conflict-log-table needs detection, which -no-conflict-detection turns off"},
		{append(base, "-copy", "-copy-workers", "-2"), "-copy-workers -2"},
		{append(base, "-copy-workers", "2"), "-copy-workers goes with -copy"},
		{append(base, "-schema-changes", "all"), `-schema-changes "all": valid values are none and add-columns`},
		{append(base, "-skip-lsn", "xyz"), `-skip-lsn "xyz": want the commit LSN the error that stopped apply names`},
		{append(base, "-spill-compression", "gzip"), `-spill-compression "gzip": want none (the default), s2, lz4 or zstd`},
	} {
		err := runApply(context.Background(), c.args)
		require.Error(t, err, "%q", c.args)
		require.Contains(t, explain("apply", err), c.want, "%q", c.args)
	}
}

// TestApplyCommand runs the built `pgreorder apply` in each mode, checks that it replicates, and
// that it exits with status 0 on SIGTERM (and SIGINT), as a benchmark harness stops it.
func TestApplyCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := filepath.Join(t.TempDir(), "pgreorder")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, major := range streamMajors(t) {
		for i, mode := range []string{"buffered", "eager", "parallel", "parallel-relaxed"} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				args := []string{"-mode", mode}
				if m, ok := strings.CutSuffix(mode, "-relaxed"); ok {
					args = []string{"-mode", m, "-commit-order", "relaxed"}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				srv := pgtest.Shared(t, major)
				srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
				src, dst := srv.ConnString(srcDB), srv.ConnString(dstDB)
				const table = `CREATE TABLE s (id int PRIMARY KEY, v text)`
				require.NoError(t, pgtest.Exec(ctx, src, table, `CREATE PUBLICATION p FOR TABLE s`))
				require.NoError(t, pgtest.Exec(ctx, dst, table))
				var stderr bytes.Buffer
				cmd := exec.CommandContext(ctx, bin, append([]string{"apply", "-source", src, "-target", dst, "-slot", "cli",
					"-publication", "p", "-create-slot", "-workers", "2", "-work-mem", "64kB"}, args...)...)
				cmd.Stderr = &stderr
				require.NoError(t, cmd.Start())
				waitSlotActive(t, ctx, src, "cli")
				require.NoError(t, pgtest.Exec(ctx, src,
					`BEGIN; INSERT INTO s SELECT g, repeat('z', 100) FROM generate_series(1, 2000) g; SAVEPOINT a;
					 DELETE FROM s WHERE id > 1000; ROLLBACK TO a; COMMIT`,
					`UPDATE s SET v = NULL WHERE id = 7`, `DELETE FROM s WHERE id = 8`))
				conn, err := pgx.Connect(ctx, dst)
				require.NoError(t, err)
				defer conn.Close(context.Background())
				var n, nulls int
				applied := pgtest.Until(ctx, func() bool {
					require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE v IS NULL) FROM s`).Scan(&n, &nulls))
					return n == 1999 && nulls == 1
				})
				require.True(t, applied, "the target has %d rows; stderr:\n%s", n, &stderr)
				sig := []syscall.Signal{syscall.SIGTERM, syscall.SIGINT}[i%2]
				require.NoError(t, cmd.Process.Signal(sig))
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				select {
				case err := <-exited:
					require.NoError(t, err, "exit after %v; stderr:\n%s", sig, &stderr)
				case <-time.After(30 * time.Second):
					cmd.Process.Kill()
					t.Fatalf("still running 30s after %v; stderr:\n%s", sig, &stderr)
				}
				require.True(t, strings.Contains(stderr.String(), "progress"), "the final progress is logged:\n%s", &stderr)
			})
		}
	}
}

// TestApplyCommandCopy runs `pgreorder apply -copy` into an empty target while the source
// changes, and checks that the target ends equal to the source.
func TestApplyCommandCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	for _, major := range streamMajors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := pgtest.Shared(t, major)
			srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
			src, dst := srv.ConnString(srcDB), srv.ConnString(dstDB)
			const table = `CREATE TABLE s (id int PRIMARY KEY, v text)`
			require.NoError(t, pgtest.Exec(ctx, src, table, `CREATE PUBLICATION p FOR TABLE s`,
				`INSERT INTO s SELECT g, md5(g::text) FROM generate_series(1, 5000) g`))
			require.NoError(t, pgtest.Exec(ctx, dst, table))
			runCtx, stop := context.WithCancel(ctx)
			exited := make(chan error, 1)
			go func() {
				exited <- runApply(runCtx, []string{"-source", src, "-target", dst, "-slot", "cli_copy",
					"-publication", "p", "-copy", "-copy-workers", "2", "-mode", "parallel"})
			}()
			waitSlotActive(t, ctx, src, "cli_copy")
			require.NoError(t, pgtest.Exec(ctx, src, `UPDATE s SET v = 'changed' WHERE id % 10 = 0`,
				`DELETE FROM s WHERE id % 7 = 0`, `INSERT INTO s SELECT g, 'new' FROM generate_series(5001, 5100) g`))
			const sum = `SELECT count(*), coalesce(sum(hashtext(id::text || coalesce(v, ''))::bigint), 0) FROM s`
			var want [2]int64
			conn, err := pgx.Connect(ctx, src)
			require.NoError(t, err)
			defer conn.Close(context.Background())
			require.NoError(t, conn.QueryRow(ctx, sum).Scan(&want[0], &want[1]))
			tconn, err := pgx.Connect(ctx, dst)
			require.NoError(t, err)
			defer tconn.Close(context.Background())
			for {
				var got [2]int64
				require.NoError(t, tconn.QueryRow(ctx, sum).Scan(&got[0], &got[1]))
				if got == want {
					break
				}
				select {
				case err := <-exited:
					t.Fatalf("apply stopped: %v", err)
				case <-ctx.Done():
					t.Fatalf("the target has %d rows (sum %d), the source %d (sum %d)", got[0], got[1], want[0], want[1])
				case <-time.After(20 * time.Millisecond):
				}
			}
			stop()
			require.NoError(t, <-exited)
		})
	}
}

// TestApplyConfigErrors: a failed pre-flight check of the source (wal_level, a missing
// publication, a slot of another plugin) stops apply at once with the check's message, as it
// stops stream, instead of being retried.
func TestApplyConfigErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers")
	}
	majors := streamMajors(t)
	major := majors[len(majors)-1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	src, dst := srv.ConnString(srcDB), srv.ConnString(dstDB)
	require.NoError(t, pgtest.Exec(ctx, src, `CREATE TABLE s (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE s`,
		`SELECT pg_create_logical_replication_slot('td', 'test_decoding')`))
	require.NoError(t, pgtest.Exec(ctx, dst, `CREATE TABLE s (id int PRIMARY KEY)`))

	var in pgtest.Install
	for _, i := range pgtest.FindInstalls() {
		if i.Major == major {
			in = i
		}
	}
	replica, err := pgtest.Start(ctx, in, pgtest.Options{Settings: map[string]string{"wal_level": "replica"}})
	require.NoError(t, err)
	defer replica.Stop()

	for _, tc := range []struct {
		name, source, slot, pub, want string
	}{
		{"wal_level", replica.ConnString("postgres"), "cfg", "p", "wal_level"},
		{"publication", src, "cfg", "nope", `publication "nope" does not exist`},
		{"plugin", src, "td", "p", "test_decoding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runCtx, stop := context.WithTimeout(ctx, 20*time.Second)
			defer stop()
			err := runApply(runCtx, []string{"-source", tc.source, "-target", dst, "-slot", tc.slot,
				"-publication", tc.pub, "-create-slot"})
			require.NoError(t, ctx.Err())
			require.Error(t, err, "apply did not stop on its own")
			require.NoError(t, runCtx.Err(), "apply stopped only when its context ended")
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestSecondSession: a second apply, or a second stream, of a slot that a running one holds
// names the holder and stops after -slot-wait instead of waiting for ever.
func TestSecondSession(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	majors := streamMajors(t)
	major := majors[len(majors)-1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	src, dst := srv.ConnString(srcDB), srv.ConnString(dstDB)
	require.NoError(t, pgtest.Exec(ctx, src, `CREATE TABLE s (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE s`))
	require.NoError(t, pgtest.Exec(ctx, dst, `CREATE TABLE s (id int PRIMARY KEY)`))

	first := func(run func(context.Context, []string) error, args ...string) {
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(runCtx, args) }()
		t.Cleanup(func() {
			stop()
			require.NoError(t, <-done)
		})
	}
	first(runApply, "-source", src, "-target", dst, "-slot", "first", "-publication", "p", "-create-slot")
	waitSlotActive(t, ctx, src, "first")
	first(runStream, "-source", src, "-slot", "second", "-publication", "p", "-create-slot", "-progress", "0", "-o", filepath.Join(t.TempDir(), "out"))
	waitSlotActive(t, ctx, src, "second")

	for _, tc := range []struct {
		name string
		run  func(context.Context, []string) error
		args []string
		want []string
	}{
		{"apply", runApply, []string{"-source", src, "-target", dst, "-slot", "first", "-publication", "p"},
			[]string{`slot "first" is in use on the target by another session`, `application_name "pgreorder apply first"`, "pg_terminate_backend("}},
		{"stream", runStream, []string{"-source", src, "-slot", "second", "-publication", "p", "-progress", "0"},
			[]string{`slot "second" is in use by another connection`, `application_name "pgreorder"`, "pg_terminate_backend("}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			err := tc.run(ctx, append(tc.args, "-slot-wait", "2"))
			require.Error(t, err)
			for _, w := range append(tc.want, "pid ") {
				require.Contains(t, err.Error(), w)
			}
			// The wait the error reports is measured: the last attempt ends after the 2 s are
			// over, later on a loaded machine.
			_, rest, _ := strings.Cut(err.Error(), "after waiting ")
			words := strings.Fields(rest)
			require.NotEmpty(t, words, "the wait, in %q", err.Error())
			waited, perr := time.ParseDuration(words[0])
			require.NoError(t, perr, "the wait, in %q", err.Error())
			require.GreaterOrEqual(t, waited, 2*time.Second, "the wait reported, in %q", err.Error())
			require.Less(t, time.Since(began), 30*time.Second)
		})
	}
}

// TestApplyAcceptSlotAhead checks that -accept-slot-ahead reaches the Applier's configuration.
func TestApplyAcceptSlotAhead(t *testing.T) {
	args := []string{"-source", "x", "-target", "y", "-slot", "s", "-publication", "p"}
	for _, accept := range []bool{false, true} {
		fs := flag.NewFlagSet("apply", flag.ContinueOnError)
		var f applyFlags
		f.register(fs)
		a := args
		if accept {
			a = append(append([]string{}, args...), "-accept-slot-ahead")
		}
		require.NoError(t, fs.Parse(a))
		cfg, err := f.config(fs)
		require.NoError(t, err)
		require.Equal(t, accept, cfg.AcceptSlotAhead)
	}
}

// TestApplyProfiles: -cpuprofile writes a CPU profile and -memprofile the allocations profile
// that go tool pprof reads (gzipped protobuf naming the sample types) even when apply stops at
// once, here on a context already canceled, before connecting anywhere; a path that cannot be
// created is an error naming the flag.
func TestApplyProfiles(t *testing.T) {
	for _, c := range []struct {
		flag  string
		holds []string // in the decompressed profile
	}{
		{"-cpuprofile", []string{"nanoseconds", "cpu"}},
		{"-memprofile", []string{"alloc_space"}},
	} {
		t.Run(c.flag, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "p.pprof")
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := runApply(ctx, []string{c.flag, path,
				"-source", "host=/nonexistent dbname=src", "-target", "host=/nonexistent dbname=dst",
				"-slot", "s", "-publication", "p"})
			require.NoError(t, err)
			f, err := os.Open(path)
			require.NoError(t, err)
			defer f.Close()
			zr, err := gzip.NewReader(f)
			require.NoError(t, err, "a profile is gzipped")
			data, err := io.ReadAll(zr)
			require.NoError(t, err)
			for _, h := range c.holds {
				require.Contains(t, string(data), h)
			}

			err = runApply(ctx, []string{c.flag, filepath.Join(t.TempDir(), "no", "such", "dir"),
				"-source", "host=/nonexistent", "-target", "host=/nonexistent", "-slot", "s", "-publication", "p"})
			require.ErrorContains(t, err, c.flag)
		})
	}
}

// TestTuneGC: apply's collector settings (GOGC=400 within work mem + 64MB) apply unless the
// environment sets GOGC or GOMEMLIMIT, or the work mem has no limit. The test restores Go's settings as it found them.
func TestTuneGC(t *testing.T) {
	gc := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(gc)
		debug.SetMemoryLimit(limit)
	})
	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run("with "+env, func(t *testing.T) {
			t.Setenv(env, "100")
			tuneGC(8 << 20)()
			require.Equal(t, 100, debug.SetGCPercent(100), "GOGC left as it was")
			require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(math.MaxInt64), "no limit set")
		})
	}
	t.Run("unlimited work mem", func(t *testing.T) {
		t.Setenv("GOGC", "")
		t.Setenv("GOMEMLIMIT", "")
		tuneGC(math.MaxInt64)()
		require.Equal(t, 100, debug.SetGCPercent(100), "GOGC left as it was")
		require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(math.MaxInt64), "no limit set")
	})
	t.Run("neither", func(t *testing.T) {
		t.Setenv("GOGC", "")
		t.Setenv("GOMEMLIMIT", "")
		stop := tuneGC(8 << 20)
		defer stop()
		require.Equal(t, 400, debug.SetGCPercent(100))
		require.Equal(t, int64(8<<20+applyHeapRoom), debug.SetMemoryLimit(math.MaxInt64))
	})
}

// TestCollectorLimit: the limit is the work mem plus the room, until twice the live heap is
// more.
func TestCollectorLimit(t *testing.T) {
	for _, c := range []struct {
		workMem int64
		live    uint64
		want    int64
	}{
		{64 << 20, 0, 128 << 20},
		{64 << 20, 10 << 20, 128 << 20},
		{64 << 20, 64 << 20, 128 << 20},
		{64 << 20, 100 << 20, 200 << 20},
		{64 << 10, 1 << 30, 2 << 30},
		{64 << 20, math.MaxUint64, math.MaxInt64 - 1},
	} {
		require.Equal(t, c.want, collectorLimit(c.workMem, c.live), "work mem %d, live %d", c.workMem, c.live)
	}
}
