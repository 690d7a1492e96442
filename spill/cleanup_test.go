//go:build linux

package spill_test

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/pgreorder/pgreorder/spill"
)

// TestCleanupRaces opens, uses and closes stores in one directory from several goroutines while
// child processes open stores there and exit without closing them. Every Open runs a cleanup that
// races with the others' start-up and shutdown: no Open may fail, no live store may lose a file,
// and once everything has ended one more Open leaves the directory empty.
func TestCleanupRaces(t *testing.T) {
	if isChild("crash") {
		s, err := spill.Open(spill.Options{Dir: os.Getenv("SPILL_DIR")})
		mustDo(t, err)
		l, err := s.Create()
		mustDo(t, err)
		mustDo(t, l.Append([]byte("abandoned")))
		if _, err := readAll(l); err != nil {
			t.Fatal(err)
		}
		os.Exit(0) // without Close, as a crash would
	}
	dir := t.TempDir()
	exe, err := os.Executable()
	mustDo(t, err)
	const (
		workers  = 6
		rounds   = 25
		children = 6
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds+children)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				errs <- useStore(dir, fmt.Sprintf("worker %d round %d", w, r))
			}
		})
	}
	for range children {
		wg.Go(func() { runChild(t, exe, "TestCleanupRaces", "crash", []string{"SPILL_DIR=" + dir}, nil, "") })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	s, err := spill.Open(spill.Options{Dir: dir})
	mustDo(t, err)
	mustDo(t, s.Close())
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("left in the directory: %v (%v)", names, err)
	}
}

// useStore opens a store in dir, writes and reads back two logs, and closes it.
func useStore(dir, who string) error {
	s, err := spill.Open(spill.Options{Dir: dir, BufferSize: 64})
	if err != nil {
		return fmt.Errorf("%s: %w", who, err)
	}
	defer s.Close()
	for i := range 2 {
		l, err := s.Create()
		if err != nil {
			return fmt.Errorf("%s: %w", who, err)
		}
		want := fmt.Sprintf("%s log %d, a record longer than the buffer so it is written through", who, i)
		if err := l.Append([]byte(want)); err != nil {
			return fmt.Errorf("%s: %w", who, err)
		}
		got, err := readAll(l)
		if err != nil || len(got) != 1 || string(got[0]) != want {
			return fmt.Errorf("%s: read back %q, %v", who, got, err)
		}
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("%s: %w", who, err)
	}
	return nil
}
