//go:build linux

package changefeed_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/cotenant"
	"github.com/stretchr/testify/require"
)

// forgedPosition is a position file that says the output is empty.
const forgedPosition = "pgreorder output position v1\noffset 0\nend_lsn 0/0\n"

// TestJSONLinesHostileCoTenant: another local user plants symbolic links and files under the names of
// an output file and its position files in a sticky, world-writable directory (as /tmp is). A
// File opened there as root must follow no link, write into no file of the other user, and make
// its files readable by its own user only.
func TestJSONLinesHostileCoTenant(t *testing.T) {
	if cotenant.Child(t, plantOutputs) {
		return
	}
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	d := cotenant.Setup(t)
	shared, victim := d.Shared, d.Victim // victim: only root may read it
	for _, name := range []string{"tmp-target", "out-target"} {
		require.NoError(t, os.WriteFile(filepath.Join(victim, name), []byte("precious\n"), 0o600))
	}
	d.Plant(t)

	intact := func() {
		t.Helper()
		for _, name := range []string{"tmp-target", "out-target"} {
			b, err := os.ReadFile(filepath.Join(victim, name))
			require.NoError(t, err)
			require.Equal(t, "precious\n", string(b), "%s was written through a planted link", name)
		}
	}
	write := func(j *changefeed.JSONLines) {
		t.Helper()
		require.NoError(t, writeTxn(t, j, smallTxn(10, 0x100)))
		require.NoError(t, j.Close())
	}
	open := func(name string, mode fs.FileMode) (*changefeed.JSONLines, error) {
		j, _, err := openJSONLines(t, filepath.Join(shared, name), changefeed.JSONLinesConfig{FileMode: mode})
		return j, err
	}

	// A link planted at the temporary position file: removed, not followed.
	f, err := open("a.jsonl", 0)
	require.NoError(t, err)
	write(f)
	intact()

	// A link at the output and a forged position file: refused.
	_, err = open("b.jsonl", 0)
	require.Error(t, err)
	intact()
	// A link at the output alone: refused.
	_, err = open("f.jsonl", 0)
	require.Error(t, err)
	require.Contains(t, err.Error(), "symbolic link")
	intact()

	// The other user's own output and position file: refused, left alone.
	_, err = open("c.jsonl", 0)
	require.Error(t, err)
	require.Contains(t, err.Error(), "belongs to user id "+d.UID)
	st, err := os.Stat(filepath.Join(shared, "c.jsonl"))
	require.NoError(t, err)
	require.Zero(t, st.Size(), "nothing written into the other user's file")

	// A link at the position file of an output that does not exist yet: refused.
	_, err = open("d.jsonl", 0)
	require.Error(t, err)
	require.Contains(t, err.Error(), "symbolic link")
	intact()

	// Our own files are ours alone (the umask is 022), or as JSONLinesConfig.FileMode says.
	for _, name := range []string{"a.jsonl", "a.jsonl" + changefeed.PositionSuffix} {
		st, err := os.Lstat(filepath.Join(shared, name))
		require.NoError(t, err)
		require.Equal(t, fs.FileMode(0o600), st.Mode(), name)
	}
	f, err = open("e.jsonl", 0o640)
	require.NoError(t, err)
	write(f)
	for _, name := range []string{"e.jsonl", "e.jsonl" + changefeed.PositionSuffix} {
		st, err := os.Lstat(filepath.Join(shared, name))
		require.NoError(t, err)
		require.Equal(t, fs.FileMode(0o640), st.Mode(), name)
	}
}

// plantOutputs runs as the second user.
func plantOutputs(t *testing.T, shared, victim string) {
	p := func(name string) string { return filepath.Join(shared, name) }
	require.NoError(t, os.Symlink(filepath.Join(victim, "tmp-target"), p("a.jsonl.pos.tmp")))
	require.NoError(t, os.Symlink(filepath.Join(victim, "out-target"), p("b.jsonl")))
	require.NoError(t, os.WriteFile(p("b.jsonl.pos"), []byte(forgedPosition), 0o666))
	require.NoError(t, os.WriteFile(p("c.jsonl"), nil, 0o666))
	require.NoError(t, os.WriteFile(p("c.jsonl.pos"), []byte(forgedPosition), 0o666))
	require.NoError(t, os.Symlink(filepath.Join(victim, "tmp-target"), p("d.jsonl.pos")))
	require.NoError(t, os.Symlink(filepath.Join(victim, "out-target"), p("f.jsonl")))
}
