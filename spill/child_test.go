//go:build linux

package spill_test

import (
	"os"
	"os/exec"
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
