//go:build linux

package cotenant_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/internal/testing/cotenant"
)

// plantLink runs as the second user: a link in the shared directory to the victim's file.
func plantLink(t *testing.T, shared, victim string) {
	if err := os.Symlink(filepath.Join(victim, "precious"), filepath.Join(shared, "out")); err != nil {
		t.Fatal(err)
	}
}

// TestPlant is the package's own test: the second user's link is there, and is the second user's.
func TestPlant(t *testing.T) {
	if cotenant.Child(t, plantLink) {
		return
	}
	d := cotenant.Setup(t)
	if err := os.WriteFile(filepath.Join(d.Victim, "precious"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Plant(t)
	target, err := os.Readlink(filepath.Join(d.Shared, "out"))
	if err != nil || target != filepath.Join(d.Victim, "precious") {
		t.Fatalf("planted link: %q, %v", target, err)
	}
	// Root opening "out" with O_NOFOLLOW is refused: what the tests of the stores check.
	if f, err := os.OpenFile(filepath.Join(d.Shared, "out"), os.O_RDONLY|syscall.O_NOFOLLOW, 0); err == nil {
		f.Close()
		t.Fatal("a planted link was followed")
	}
}

// Example shows the shape of a test that uses the package.
func Example() {
	test := func(t *testing.T) {
		if cotenant.Child(t, plantLink) {
			return // the second user's process: planted, done
		}
		d := cotenant.Setup(t) // skips unless root
		d.Plant(t)
		// ... as root, open files in d.Shared; d.Victim must not change
	}
	_ = test
	// Output:
}
