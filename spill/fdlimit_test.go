//go:build linux

package spill_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/spill"
)

// TestManyLogsLowFDLimit keeps 100k logs alive at once, interleaving appends to all of them, under
// a 1024 file descriptor limit.
func TestManyLogsLowFDLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 100k files")
	}
	const (
		nLogs  = 100_000
		rounds = 3
		limit  = 1024
	)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lowered := old
	lowered.Cur = min(old.Cur, limit)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
			t.Errorf("restoring RLIMIT_NOFILE: %v", err)
		}
	}()
	// The runtime's poller may open a descriptor or two on first use: allow for them.
	baseFDs := openFDs(t) + 2
	t.Logf("RLIMIT_NOFILE %d, %d fds open before", lowered.Cur, baseFDs)

	dir := t.TempDir()
	s, err := spill.Open(spill.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logs := make([]*spill.Log, nLogs)
	for i := range logs {
		if logs[i], err = s.Create(); err != nil {
			t.Fatal(err)
		}
	}
	payload := func(i, round int) []byte {
		return fmt.Appendf(nil, "log %d record %d %s", i, round, bytes.Repeat([]byte{'x'}, i%50))
	}
	start := time.Now()
	for round := range rounds {
		t.Logf("round %d at %v", round, time.Since(start))
		for i, l := range logs {
			if err := l.Append(payload(i, round)); err != nil {
				t.Fatalf("log %d round %d: %v", i, round, err)
			}
		}
	}
	if n := openFDs(t); n > baseFDs+spill.DefaultMaxOpenFiles+1 {
		t.Fatalf("%d fds open, budget is %d (+%d before, +1 lock)", n, spill.DefaultMaxOpenFiles, baseFDs)
	}
	t.Logf("read at %v", time.Since(start))
	for i, l := range logs {
		r := l.NewReader()
		for round := range rounds {
			rec, err := r.Next()
			if err != nil {
				t.Fatalf("log %d record %d: %v", i, round, err)
			}
			if !bytes.Equal(rec, payload(i, round)) {
				t.Fatalf("log %d record %d: got %q", i, round, rec)
			}
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("log %d: after last record: %v", i, err)
		}
		r.Close()
	}
	if n := openFDs(t); n > baseFDs+spill.DefaultMaxOpenFiles+1 {
		t.Fatalf("%d fds open after reading, budget is %d", n, spill.DefaultMaxOpenFiles)
	}
	t.Logf("close at %v", time.Since(start))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed at %v", time.Since(start))
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("after Close: %d entries, %v", len(entries), err)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries) - 1 // the directory being read
}
