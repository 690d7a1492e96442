package pgserver

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
