//go:build linux

// Package cotenant runs part of a test as a second local user, for tests of what a process that
// runs as root does in a directory another user shares with it: a sticky, world-writable
// directory such as /tmp, where the other user may have planted symbolic links, FIFOs and files
// under the names the process is about to use.
//
// A test calls Child first, which in the second user's process runs the planting function and
// reports true (the test then returns), then Setup, which makes the directories, then Plant,
// which runs the test binary again as the second user to plant what the test needs:
//
//	func TestHostile(t *testing.T) {
//		if cotenant.Child(t, plant) {
//			return
//		}
//		d := cotenant.Setup(t) // skips unless root, with a "nobody" user
//		d.Plant(t)             // plant(t, d.Shared, d.Victim), as nobody
//		// ... open files in d.Shared as root; d.Victim must stay as it was
//	}
//
// It is test machinery: only _test.go files import it.
package cotenant

import (
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
)

// Environment variables of the second user's process.
const (
	childEnv  = "PGREORDER_COTENANT_CHILD" // the test it is to plant for
	sharedEnv = "PGREORDER_COTENANT_SHARED"
	victimEnv = "PGREORDER_COTENANT_VICTIM"
)

// Dirs are the directories of one test.
type Dirs struct {
	// Base holds the others and the copy of the test binary; the second user can enter it.
	Base string
	// Shared is sticky and writable by everyone, as /tmp is.
	Shared string
	// Victim only root can read: what a planted link points at, which nothing may change.
	Victim string
	// UID is the second user's user id, as os/user spells it.
	UID string

	uid, gid uint32
}

// Child reports whether this process is the second user's part of the test t: if so, it has
// called plant with the shared and victim directories, and t is to return at once.
func Child(t *testing.T, plant func(t *testing.T, shared, victim string)) bool {
	if os.Getenv(childEnv) != t.Name() {
		return false
	}
	plant(t, os.Getenv(sharedEnv), os.Getenv(victimEnv))
	return true
}

// Setup skips t unless it runs as root and the user "nobody" exists. It makes Base (mode 0755,
// as is the test's directory above it, so that the second user can reach Shared), Shared (mode
// 01777) and Victim (mode 0700), all under t.TempDir().
func Setup(t *testing.T) *Dirs {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs part of itself as a second user (nobody)")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no second user: %v", err)
	}
	uid, err1 := strconv.ParseUint(nobody.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(nobody.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		t.Skipf("user nobody has uid %q gid %q", nobody.Uid, nobody.Gid)
	}
	base := t.TempDir()
	d := &Dirs{Base: base, Shared: filepath.Join(base, "shared"), Victim: filepath.Join(base, "victim"),
		UID: nobody.Uid, uid: uint32(uid), gid: uint32(gid)}
	must(t, os.Chmod(filepath.Dir(base), 0o755))
	must(t, os.Chmod(base, 0o755))
	must(t, os.Mkdir(d.Shared, 0o700))
	must(t, os.Chmod(d.Shared, 0o777|fs.ModeSticky)) // Mkdir's mode is cut by the umask
	must(t, os.Mkdir(d.Victim, 0o700))
	return d
}

// Plant runs the test t again, as the second user, in a copy of the test binary in Base (the
// go tool builds it in a directory only this user can read), and fails t with the child's
// output if the child fails. In the child, Child runs the planting function.
func (d *Dirs) Plant(t *testing.T) {
	t.Helper()
	exe := filepath.Join(d.Base, "cotenant.test")
	copyExecutable(t, exe)
	cmd := exec.Command(exe, "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), sharedEnv+"="+d.Shared, victimEnv+"="+d.Victim)
	cmd.Dir = d.Base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: d.uid, Gid: d.gid}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("planting as user %s: %v\n%s", d.UID, err, out)
	}
}

// copyExecutable copies the running test binary to path, mode 0755.
func copyExecutable(t *testing.T, path string) {
	t.Helper()
	self, err := os.Executable()
	must(t, err)
	src, err := os.Open(self)
	must(t, err)
	defer src.Close()
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	must(t, err)
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	must(t, dst.Close())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
