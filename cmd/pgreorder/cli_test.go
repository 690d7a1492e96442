package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDSNRedacted: a connection string that does not parse is printed without its password,
// however the password is written.
func TestDSNRedacted(t *testing.T) {
	dsns := map[string][]string{
		"host=/nonexistent password = TopSecret8 port=abc":       {"TopSecret8"},
		`host=/nonexistent password='Top\'Secret9 x' port=abc`:   {"Secret9", "Top"},
		"postgres://u:TopSecret7@localhost:abc/db":               {"TopSecret7"},
		"postgres://u@localhost:abc/db?password=TopSecret6":      {"TopSecret6"},
		"host=/nonexistent sslpassword = 'Top Secret5' port=abc": {"Top Secret5", "Secret5"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for dsn, secrets := range dsns {
		for name, run := range map[string]func() error{
			"stream": func() error {
				return runStream(ctx, []string{"-dsn", dsn, "-slot", "s", "-publication", "p", "-progress", "0"})
			},
			"apply": func() error {
				return runApply(ctx, []string{"-source", "host=/nonexistent", "-target", dsn, "-slot", "s", "-publication", "p"})
			},
			"record": func() error { return runRecord(ctx, []string{"-dsn", dsn, "-o", t.TempDir(), writeWorkload(t)}) },
		} {
			err := run()
			require.Error(t, err, "%s %s", name, dsn)
			require.Contains(t, err.Error(), "xxxxx", "%s %s", name, dsn)
			for _, s := range secrets {
				require.NotContains(t, err.Error(), s, "%s %s", name, dsn)
			}
		}
	}
	for _, usage := range []string{streamUsage, applyUsage} {
		require.Contains(t, usage, "PGPASSWORD")
		require.Contains(t, usage, "password file")
	}
}

// buildCLI builds the command once per test binary.
var buildCLI = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "pgreorder-cli-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "pgreorder")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return bin, nil
})

// runCLI runs the built command and returns its stdout, stderr and exit status.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bin, err := buildCLI()
	require.NoError(t, err)
	var o, e bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return o.String(), e.String(), exit.ExitCode()
	}
	require.NoError(t, err)
	return o.String(), e.String(), 0
}

// TestHelpAndVersion: help asked for goes to stdout with status 0 (pgreorder apply -h | less);
// a command line that cannot run says why once, on stderr, with status 2.
func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"--help"}, {"apply", "-h"}, {"stream", "-h"}, {"replay", "-help"},
		{"record", "-h"}, {"demo", "-h"}} {
		out, errOut, code := runCLI(t, args...)
		require.Equal(t, 0, code, "%q: %s", args, errOut)
		require.Contains(t, out, "usage: pgreorder", "%q", args)
		require.Empty(t, errOut, "%q", args)
	}
	out, errOut, code := runCLI(t, "-version")
	require.Equal(t, 0, code, errOut)
	require.True(t, strings.HasPrefix(out, "pgreorder ") && strings.Contains(out, "go1."), out)

	out, errOut, code = runCLI(t, "stream", "-dsn", "x", "-slot", "s", "-publication", "p", "-status-interval", "soon")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(errOut, "-status-interval"), "said once, without the whole usage:\n%s", errOut)
	require.Contains(t, errOut, "see pgreorder stream -h")
	_, errOut, code = runCLI(t)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "usage: pgreorder")
	_, errOut, code = runCLI(t, "record")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "usage: pgreorder record")
}

// TestFlagValues: durations take a bare number of seconds, as -work-mem takes a bare number of
// kB; -synchronous-commit takes on and off, and says what to do for PostgreSQL's other levels.
func TestFlagValues(t *testing.T) {
	var f applyFlags
	fs := flag.NewFlagSet("apply", flag.ContinueOnError)
	f.register(fs)
	require.NoError(t, parseFlags(fs, []string{"-status-interval", "10", "-conflict-retention", "1.5", "-slot-wait", "2m",
		"-synchronous-commit=on"}))
	require.Equal(t, 10*time.Second, f.status)
	require.Equal(t, 1500*time.Millisecond, f.retention)
	require.Equal(t, 2*time.Minute, f.slotWait)
	require.True(t, f.syncCommit)
	require.NoError(t, parseFlags(fs, []string{"-synchronous-commit=off"}))
	require.False(t, f.syncCommit)
	require.NoError(t, parseFlags(fs, []string{"-synchronous-commit"}))
	require.True(t, f.syncCommit)
	err := parseFlags(fs, []string{"-synchronous-commit=remote_apply"})
	require.ErrorIs(t, err, errUsage)
	for _, w := range []string{"remote_apply is not taken here", "on or off", "ALTER ROLE", "options='-c synchronous_commit=remote_apply'"} {
		require.Contains(t, err.Error(), w)
	}
	require.ErrorContains(t, parseFlags(fs, []string{"-synchronous-commit=maybe"}), "want on or off")
}
