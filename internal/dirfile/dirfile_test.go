//go:build unix

package dirfile_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/internal/dirfile"
)

func TestDir(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "d")
	must(t, os.Mkdir(dir, 0o700))
	must(t, os.Symlink(victim, filepath.Join(dir, "link")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	d, err := dirfile.Open(dir)
	must(t, err)
	defer d.Close()

	for _, flag := range []int{os.O_RDONLY, os.O_RDWR | os.O_CREATE, os.O_WRONLY | os.O_CREATE | os.O_TRUNC} {
		if _, err := d.OpenFile("link", flag, 0o600); !errors.Is(err, dirfile.ErrSymlink) {
			t.Errorf("opening a link with flag %#x: %v, want ErrSymlink", flag, err)
		}
	}
	if _, err := d.OpenFile("fifo", os.O_RDONLY, 0); !errors.Is(err, dirfile.ErrNotRegular) {
		t.Errorf("opening a FIFO: %v, want ErrNotRegular", err)
	}
	if _, err := d.OpenFile("../victim", os.O_RDONLY, 0); err == nil {
		t.Error("a name with a separator was opened")
	}
	// Renaming over a link replaces the link; removing a link removes the link.
	f, err := d.OpenFile("new", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	must(t, err)
	must(t, dirfile.CheckPrivate(f))
	must(t, f.Close())
	must(t, d.Rename("new", "link"))
	must(t, d.Sync())
	if fi, err := os.Lstat(filepath.Join(dir, "link")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("after the rename, link is %v, %v", fi, err)
	}
	must(t, os.Symlink(victim, filepath.Join(dir, "link2")))
	must(t, d.Remove("link2"))
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Errorf("victim: %q, %v", b, err)
	}
	// A second name makes a file not private.
	must(t, os.Link(filepath.Join(dir, "link"), filepath.Join(dir, "hard")))
	f, err = d.OpenFile("link", os.O_RDONLY, 0)
	must(t, err)
	defer f.Close()
	if err := dirfile.CheckPrivate(f); !errors.Is(err, dirfile.ErrNotPrivate) {
		t.Errorf("CheckPrivate of a file with two links: %v", err)
	}
	must(t, d.Close())
	must(t, d.Close())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
