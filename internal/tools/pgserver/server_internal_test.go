package pgserver

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRootWithoutServerUser: as root, a missing server user is an error unless CreateUser is set;
// nothing is created behind the caller's back.
func TestRootWithoutServerUser(t *testing.T) {
	if os.Geteuid() != 0 {
		cred, err := serverCredential("pgreorder-no-such-user", Options{})
		require.NoError(t, err)
		require.Nil(t, cred, "not root: the server runs as the caller")
		return
	}
	var log bytes.Buffer
	_, err := serverCredential("pgreorder-no-such-user", Options{Log: &log})
	require.ErrorIs(t, err, ErrNoServerUser)
	require.Contains(t, err.Error(), "useradd --system")
	require.Empty(t, log.String(), "nothing was done, so nothing is announced")

	cred, err := serverCredential("root", Options{}) // an existing user: no change needed
	require.NoError(t, err)
	require.Zero(t, cred.Uid)

	// With CreateUser, useradd runs after the announcement. A stand-in useradd records its
	// arguments and fails, so that no account is made.
	bin := t.TempDir()
	argsFile := filepath.Join(bin, "args")
	require.NoError(t, os.WriteFile(filepath.Join(bin, "useradd"), []byte("#!/bin/sh\necho \"$@\" > "+argsFile+"\nexit 9\n"), 0o755))
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	log.Reset()
	_, err = serverCredential("pgreorder-no-such-user", Options{CreateUser: true, Log: &log})
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrNoServerUser)
	args, rerr := os.ReadFile(argsFile)
	require.NoError(t, rerr, "useradd ran")
	require.Equal(t, "--system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pgreorder-no-such-user\n", string(args))
	require.Equal(t, "creating system user pgreorder-no-such-user (useradd "+strings.TrimSpace(string(args))+"): PostgreSQL refuses to run as root\n", log.String())
}

// TestSweepStale: folders of processes that no longer run are removed, and said so first;
// those of live processes stay.
func TestSweepStale(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	deadPID := dead.Process.Pid

	stale := filepath.Join(tmp, tempPrefix+strconv.Itoa(deadPID)+"-1")
	live := filepath.Join(tmp, tempPrefix+strconv.Itoa(os.Getppid())+"-1")
	other := filepath.Join(tmp, "pgreorder-pgx-1-1")
	for _, d := range []string{stale, live, other} {
		require.NoError(t, os.MkdirAll(filepath.Join(d, "data"), 0o755))
	}

	sweepOnce = sync.Once{}
	var log bytes.Buffer
	sweepStale(&log)
	require.NoDirExists(t, stale)
	require.DirExists(t, live)
	require.DirExists(t, other)
	require.Contains(t, log.String(), "removing "+stale+", left by process "+strconv.Itoa(deadPID))
}
