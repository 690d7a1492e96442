//go:build linux

package spill_test

import (
	"bytes"
	"errors"
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
	// Besides its logs' files a store holds three descriptors: its parent, its directory, its lock.
	budget := spill.MaxOpenFiles(s)
	if want := max(min(int(lowered.Cur)/4, spill.DefaultMaxOpenFiles), spill.MinDefaultOpenFiles); budget != want {
		t.Errorf("default budget under RLIMIT_NOFILE %d: %d, want %d", lowered.Cur, budget, want)
	}
	if n := openFDs(t); n > baseFDs+budget+3 {
		t.Fatalf("%d fds open, budget is %d (+%d before, +3 the store's own)", n, budget, baseFDs)
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
	if n := openFDs(t); n > baseFDs+budget+3 {
		t.Fatalf("%d fds open after reading, budget is %d", n, budget)
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

// TestLowFDLimit runs in a child process whose RLIMIT_NOFILE is 32: 60 logs are written in turns
// and read back with the default descriptor budget, with a budget far above the limit, and while
// the rest of the process holds all but a few descriptors. A call fails (with EMFILE) only when no
// descriptor is free and no other log has one to give back.
func TestLowFDLimit(t *testing.T) {
	if !isChild("lowfd") {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		runChild(t, exe, "TestLowFDLimit", "lowfd", nil, nil, "")
		return
	}
	const (
		limit  = 32
		nLogs  = 60
		rounds = 3
	)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = limit
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Logf("RLIMIT_NOFILE %d, %d descriptors open", limit, openFDs(t))
	if got, want := spill.MaxOpenFiles(openStore(t, spill.Options{})), limit/4; got != want {
		t.Errorf("default budget under RLIMIT_NOFILE %d: %d, want %d", limit, got, want)
	}
	payload := func(i, round int) []byte {
		return fmt.Appendf(nil, "log %d record %d %s", i, round, bytes.Repeat([]byte{'x'}, i))
	}
	for _, tc := range []struct {
		name  string
		opts  spill.Options
		leave int // descriptors left free by the rest of the process; 0: no hogging
	}{
		{"default budget", spill.Options{}, 0},
		{"budget above the limit", spill.Options{MaxOpenFiles: 1000}, 0},
		{"process holds all but 4", spill.Options{}, 4},
		{"process holds all but 1, budget above the limit", spill.Options{MaxOpenFiles: 1000}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, tc.opts)
			if tc.leave > 0 {
				defer closeFDs(hogFDs(t, tc.leave))
			}
			logs := make([]*spill.Log, nLogs)
			for i := range logs {
				logs[i] = create(t, s)
			}
			for round := range rounds {
				for i, l := range logs {
					if err := l.Append(payload(i, round)); err != nil {
						t.Fatalf("log %d round %d: %v", i, round, err)
					}
				}
			}
			for i, l := range logs {
				got, err := readAll(l)
				if err != nil {
					t.Fatalf("log %d: %v", i, err)
				}
				for round := range rounds {
					if round >= len(got) || !bytes.Equal(got[round], payload(i, round)) {
						t.Fatalf("log %d: read %q", i, got)
					}
				}
			}
		})
	}
	t.Run("nothing to close", func(t *testing.T) {
		s := openStore(t, spill.Options{})
		a := create(t, s)
		if err := a.Append([]byte("buffered")); err != nil {
			t.Fatal(err)
		}
		hogs := hogFDs(t, 0)
		_, err := readAll(a) // flushes: needs a descriptor, and no log has one
		closeFDs(hogs)
		if !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("flush with no descriptor to be had: %v, want EMFILE", err)
		}
		b := create(t, s)
		if err := b.Append([]byte("after")); err != nil {
			t.Fatal(err)
		}
		if got, err := readAll(b); err != nil || len(got) != 1 {
			t.Fatalf("a new log once descriptors are free: %q, %v", got, err)
		}
	})
}

// hogFDs opens /dev/null until the descriptor limit is reached, then closes leave of them again.
func hogFDs(t *testing.T, leave int) []int {
	t.Helper()
	var fds []int
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err == syscall.EMFILE {
			break
		}
		if err != nil {
			closeFDs(fds)
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	closeFDs(fds[len(fds)-leave:])
	return fds[:len(fds)-leave]
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}
