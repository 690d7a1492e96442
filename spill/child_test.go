//go:build linux

package spill_test

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// childEnv tells a re-executed test binary which part of a test it is to run.
const childEnv = "SPILL_TEST_CHILD"

// isChild reports whether this process is the child that a test started with runChild for mode.
func isChild(mode string) bool { return os.Getenv(childEnv) == mode }

// runChild runs test (a test name) in a new process of the test binary exe, with childEnv=mode
// plus env, in dir, as the user in cred (nil: this user). It fails t, with the child's output,
// if the child fails.
func runChild(t *testing.T, exe, test, mode string, env []string, cred *syscall.Credential, dir string) {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^"+test+"$", "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), env...)
	cmd.Dir = dir
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", mode, err, out)
	}
	if testing.Verbose() {
		t.Logf("child %s:\n%s", mode, out)
	}
}

// copyExecutable copies the test binary into dir, mode 0755, so that another user can run it (the
// go tool builds it in a private directory).
func copyExecutable(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	exe := filepath.Join(dir, "spill.test")
	dst, err := os.OpenFile(exe, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return exe
}
