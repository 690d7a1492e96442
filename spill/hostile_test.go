//go:build linux

package spill_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/internal/testing/cotenant"
	"github.com/pgreorder/pgreorder/spill"
)

// Names the test plants in the shared directory, all shaped like store directories.
const (
	nobodyLink      = "pgreorder-spill-100-00000000000000a1" // -> the root-only victim directory
	nobodyStore     = "pgreorder-spill-101-00000000000000b2" // nobody's own store, with lock and log
	nobodyOpenStore = "pgreorder-spill-102-00000000000000c3" // nobody's, mode 0777, lock and log link into victim
	nobodyFile      = "pgreorder-spill-103-00000000000000d4" // a regular file
	nobodyFIFO      = "pgreorder-spill-104-00000000000000e5" // a FIFO (opening it for reading would block)
	nobodyLinkToOwn = "pgreorder-spill-105-00000000000000f6" // -> rootStale, in the same directory
	nobodyDangling  = "pgreorder-spill-106-0000000000000107" // -> victim/created-by-dangling
	nobodyEmpty     = "pgreorder-spill-107-0000000000000108" // nobody's, empty, no lock
	rootStale       = "pgreorder-spill-200-00000000000000aa" // root's stale store: removed
	rootLockless    = "pgreorder-spill-201-00000000000000bb" // root's, empty, no lock: left (starting up)
	rootOpenMode    = "pgreorder-spill-202-00000000000000cc" // root's, mode 0777: left alone
	rootForeign     = "pgreorder-spill-203-00000000000000dd" // root's stale store with a foreign file
)

// TestHostileCoTenant: another local user plants symlinks, FIFOs, foreign files and directories
// named like stores (and like the lock files of earlier versions) in a sticky, world-writable
// spill directory. Open and Close, run as root, must create nothing outside their own store,
// follow no planted link, remove nothing foreign, and still remove root's own stale stores.
func TestHostileCoTenant(t *testing.T) {
	if cotenant.Child(t, plant) {
		return
	}
	d := cotenant.Setup(t)
	base, shared, victim := d.Base, d.Shared, d.Victim
	// The victim, which only root can read, is laid out like a stale store.
	for _, name := range []string{"lock", "log-1.spill", "log-2.spill"} {
		writeFile(t, filepath.Join(victim, name))
	}

	// A live store in the same directory, opened before anything is planted (its Open cleans up too).
	live, err := spill.Open(spill.Options{Dir: shared})
	mustDo(t, err)
	liveLog, err := live.Create()
	mustDo(t, err)
	mustDo(t, liveLog.Append([]byte("live")))
	if _, err := readAll(liveLog); err != nil { // flushes the record to the file
		t.Fatal(err)
	}

	d.Plant(t)

	// Root's own leftovers, as a crashed store leaves them.
	p := func(names ...string) string { return filepath.Join(append([]string{shared}, names...)...) }
	for _, d := range []string{rootStale, rootLockless, rootForeign} {
		mustDo(t, os.Mkdir(p(d), 0o700))
	}
	mustDo(t, os.Mkdir(p(rootOpenMode), 0o700))
	mustDo(t, os.Chmod(p(rootOpenMode), 0o777))
	for _, f := range [][]string{
		{rootStale, "lock"}, {rootStale, "log-1.spill"}, {rootStale, "log-7.spill"},
		{rootOpenMode, "lock"}, {rootOpenMode, "log-1.spill"},
		{rootForeign, "lock"}, {rootForeign, "log-3.spill"}, {rootForeign, "notes.txt"},
	} {
		writeFile(t, p(f...))
	}

	before := snapshot(t, base)
	removed := func(path string) bool {
		for _, gone := range []string{p(rootStale), p(rootForeign, "lock"), p(rootForeign, "log-3.spill")} {
			if path == gone || strings.HasPrefix(path, gone+"/") {
				return true
			}
		}
		return false
	}

	s, err := spill.Open(spill.Options{Dir: shared})
	mustDo(t, err)
	if filepath.Dir(s.Dir()) != shared {
		t.Fatalf("store directory %s is not in %s", s.Dir(), shared)
	}
	l, err := s.Create()
	mustDo(t, err)
	mustDo(t, l.Append([]byte("new")))
	if _, err := readAll(l); err != nil {
		t.Fatal(err)
	}
	ours := func(path string) bool { return path == s.Dir() || strings.HasPrefix(path, s.Dir()+"/") }
	compareSnapshots(t, "after Open", before, snapshot(t, base), removed, ours)
	if got, err := readAll(liveLog); err != nil || len(got) != 1 || string(got[0]) != "live" {
		t.Errorf("the live store's log after Open: %q, %v", got, err)
	}

	mustDo(t, s.Close())
	compareSnapshots(t, "after Close", before, snapshot(t, base), removed, func(string) bool { return false })
	mustDo(t, live.Close())
	gone := func(path string) bool {
		return removed(path) || path == live.Dir() || strings.HasPrefix(path, live.Dir()+"/")
	}
	compareSnapshots(t, "after the live store's Close", before, snapshot(t, base), gone, func(string) bool { return false })
}

// plant runs as the second user.
func plant(t *testing.T, shared, victim string) {
	p := func(names ...string) string { return filepath.Join(append([]string{shared}, names...)...) }
	mustDo(t, os.Symlink(victim, p(nobodyLink)))
	// Earlier versions kept <store>.lock beside the store: aim it at a file root must not create.
	mustDo(t, os.Symlink(filepath.Join(victim, "created-by-lock"), p(nobodyLink+".lock")))

	mustDo(t, os.Mkdir(p(nobodyStore), 0o700))
	writeFile(t, p(nobodyStore, "lock"))
	writeFile(t, p(nobodyStore, "log-1.spill"))
	writeFile(t, p(nobodyStore+".lock"))

	mustDo(t, os.Mkdir(p(nobodyOpenStore), 0o700))
	mustDo(t, os.Chmod(p(nobodyOpenStore), 0o777))
	mustDo(t, os.Symlink(filepath.Join(victim, "log-1.spill"), p(nobodyOpenStore, "log-1.spill")))
	mustDo(t, os.Symlink(filepath.Join(victim, "created-by-inner-lock"), p(nobodyOpenStore, "lock")))

	mustDo(t, os.Mkdir(p(nobodyEmpty), 0o700))

	writeFile(t, p(nobodyFile))
	mustDo(t, syscall.Mkfifo(p(nobodyFIFO), 0o666))
	mustDo(t, os.Symlink(rootStale, p(nobodyLinkToOwn)))
	mustDo(t, os.Symlink(filepath.Join(victim, "created-by-dangling"), p(nobodyDangling)))
	mustDo(t, os.Symlink(filepath.Join(victim, "created-by-dangling-lock"), p(nobodyDangling+".lock")))
}

// fsEntry is what snapshot records of a file: enough to see it created, replaced or changed.
type fsEntry struct {
	mode fs.FileMode
	uid  uint32
	size int64  // files only
	link string // symlinks only
}

// snapshot describes every entry under root without following symlinks.
func snapshot(t *testing.T, root string) map[string]fsEntry {
	t.Helper()
	m := make(map[string]fsEntry)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e := fsEntry{mode: fi.Mode(), uid: fi.Sys().(*syscall.Stat_t).Uid}
		switch {
		case fi.Mode().IsRegular():
			e.size = fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		m[path] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// compareSnapshots reports every difference between before and after except the removal of
// paths for which removed is true and the creation of paths for which created is true.
func compareSnapshots(t *testing.T, when string, before, after map[string]fsEntry, removed, created func(string) bool) {
	t.Helper()
	var paths []string
	for p := range before {
		paths = append(paths, p)
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	for _, p := range paths {
		b, inBefore := before[p]
		a, inAfter := after[p]
		switch {
		case inBefore && !inAfter && !removed(p):
			t.Errorf("%s: %s was removed (%v uid %d)", when, p, b.mode, b.uid)
		case !inBefore && inAfter && !created(p):
			t.Errorf("%s: %s was created (%v uid %d)", when, p, a.mode, a.uid)
		case inBefore && inAfter && removed(p):
			t.Errorf("%s: stale %s was not removed", when, p)
		case inBefore && inAfter && a != b && !(a.mode.IsDir() && b.mode.IsDir() && a.mode == b.mode && a.uid == b.uid):
			t.Errorf("%s: %s changed from %+v to %+v", when, p, b, a)
		}
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string) {
	t.Helper()
	mustDo(t, os.WriteFile(path, []byte("x"), 0o600))
}
