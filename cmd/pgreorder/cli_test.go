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
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
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
				return runStream(ctx, []string{"-source", dsn, "-slot", "s", "-publication", "p", "-progress", "0"})
			},
			"apply": func() error {
				return runApply(ctx, []string{"-source", "host=/nonexistent", "-target", dsn, "-slot", "s", "-publication", "p"})
			},
			"record": func() error { return runRecord(ctx, []string{"-source", dsn, "-o", t.TempDir(), writeWorkload(t)}) },
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

	out, errOut, code = runCLI(t, "stream", "-source", "x", "-slot", "s", "-publication", "p", "-status-interval", "soon")
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

// TestErrorsNameFlags: what the command prints for an error names its flags, not the libraries'
// fields; says a rule where a value breaks one; comes once, not followed by an empty progress
// line; and of a connection refused TLS first and then failed without, says the real failure.
func TestErrorsNameFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	majors := streamMajors(t)
	major := majors[len(majors)-1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, major)
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	src, dst := srv.ConnString(srcDB), srv.ConnString(dstDB)
	require.NoError(t, pgtest.Exec(ctx, src, `CREATE TABLE s (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE s`))
	require.NoError(t, pgtest.Exec(ctx, dst, `CREATE TABLE s (id int PRIMARY KEY)`))
	tcpNoDB := strings.Replace(srv.TCPConnString("nope"), " sslmode=disable", "", 1) // sslmode prefer: TLS first

	library := regexp.MustCompile(`Config\.|Buffer\.|Reconnect\.|CreateSlot|SkipThrough|Publications|invalid option|` +
		`OriginFilter|SlotWait|\bTarget:|\bSource:|tls error`)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"stream", "-source", src, "-slot", "Bad-Name", "-publication", "p"},
			[]string{`-slot "Bad-Name": a slot name is 1 to 63 characters, each a lower-case letter, a digit or an underscore`}},
		{[]string{"apply", "-source", src, "-target", dst, "-slot", "Bad-Name", "-publication", "p"},
			[]string{`-slot "Bad-Name": a slot name is 1 to 63 characters`}},
		{[]string{"stream", "-source", src, "-slot", "missing", "-publication", "p"}, []string{"let -create-slot create it"}},
		{[]string{"stream", "-source", src, "-slot", "cfg", "-publication", "nope", "-create-slot"}, []string{"or correct -publication"}},
		{[]string{"stream", "-source", src, "-slot", "ahead", "-publication", "p", "-create-slot", "-resume", "F/0"},
			[]string{"the resume position (-resume, or FILE.pos with -o) is beyond the server's current WAL position"}},
		{[]string{"apply", "-source", src, "-target", tcpNoDB, "-slot", "tls", "-publication", "p"},
			[]string{`database "nope" does not exist`}},
		{[]string{"stream", "-source", tcpNoDB, "-slot", "tls", "-publication", "p"}, []string{`database "nope" does not exist`}},
	} {
		out, errOut, code := runCLI(t, tc.args...)
		require.Equal(t, 1, code, "%q: %s", tc.args, errOut)
		require.Empty(t, out)
		var errLines []string
		for l := range strings.Lines(errOut) {
			if strings.HasPrefix(l, "pgreorder ") {
				errLines = append(errLines, l)
			}
			require.NotContains(t, l, "msg=progress", "%q: no progress line when nothing was done", tc.args)
			require.NotContains(t, l, "level=ERROR", "%q: the error is printed once, by the command", tc.args)
		}
		require.Len(t, errLines, 1, "%q: one error line:\n%s", tc.args, errOut)
		for _, w := range tc.want {
			require.Contains(t, errLines[0], w, "%q", tc.args)
		}
		require.False(t, library.MatchString(errLines[0]), "%q names a library field: %s", tc.args, errLines[0])
	}
}
