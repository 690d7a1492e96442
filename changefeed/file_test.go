package changefeed_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/replication"
)

func save(t *testing.T, s changefeed.Store, p changefeed.Position) error {
	t.Helper()
	u, err := s.Begin(context.Background(), changefeed.StreamWorker)
	require.NoError(t, err)
	return u.Commit(context.Background(), &p)
}

var samplePos = changefeed.Position{Slot: "s", SystemID: "7714361861004545475", CopyDone: true, EndLSN: 0x1_2345_6789, State: []byte("42\x00\n")}

func TestFileStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "pos")
	s := mustOpen(t, path)
	_, ok, err := s.Load(ctx, "s")
	require.NoError(t, err)
	require.False(t, ok, "no file, no position")
	require.NoError(t, save(t, s, samplePos))
	got, ok, err := s.Load(ctx, "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, samplePos, got)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice")
	_, _, err = s.Load(ctx, "s")
	require.ErrorIs(t, err, changefeed.ErrClosed)
}

// TestFileStoreTorn: every prefix of a position file, and every single altered byte, is an
// error, never a position; a torn temporary file (a crash before the rename) is ignored.
func TestFileStoreTorn(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "pos")
	s := mustOpen(t, path)
	require.NoError(t, save(t, s, samplePos))
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	for n := range len(good) {
		require.NoError(t, os.WriteFile(path, good[:n], 0o600))
		_, _, err := s.Load(ctx, "s")
		if n == 0 {
			require.ErrorIs(t, err, changefeed.ErrStore, "an empty file")
			continue
		}
		require.ErrorIs(t, err, changefeed.ErrStore, "prefix of %d bytes", n)
	}
	for i := range good {
		bad := append([]byte(nil), good...)
		bad[i] ^= 0x04
		require.NoError(t, os.WriteFile(path, bad, 0o600))
		_, _, err := s.Load(ctx, "s")
		require.ErrorIs(t, err, changefeed.ErrStore, "byte %d altered", i)
	}
	require.NoError(t, os.WriteFile(path, good, 0o600))
	require.NoError(t, os.WriteFile(path+".tmp", good[:10], 0o600)) // a crash before the rename
	got, ok, err := s.Load(ctx, "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, samplePos, got)
	next := samplePos
	next.EndLSN++
	require.NoError(t, save(t, s, next))
	got, _, err = s.Load(ctx, "s")
	require.NoError(t, err)
	require.Equal(t, next, got)
	_, err = os.Lstat(path + ".tmp")
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestFileStoreSymlink: a symbolic link at the file's path, or at its temporary file's, is
// never followed: the file it points to is neither read nor written.
func TestFileStoreSymlink(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "pos")
	victim := filepath.Join(dir, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious\n"), 0o600))
	unchanged := func() {
		t.Helper()
		b, err := os.ReadFile(victim)
		require.NoError(t, err)
		require.Equal(t, "precious\n", string(b))
	}

	require.NoError(t, os.Symlink(victim, path))
	_, err := changefeed.OpenFile(path)
	require.ErrorIs(t, err, changefeed.ErrStore)
	require.ErrorContains(t, err, "symbolic link")
	require.NoError(t, os.Remove(path))

	s := mustOpen(t, path)
	require.NoError(t, os.Symlink(victim, path)) // planted after Open
	_, _, err = s.Load(ctx, "s")
	require.ErrorIs(t, err, changefeed.ErrStore)
	require.ErrorContains(t, err, "symbolic link")
	require.NoError(t, os.Remove(path))

	require.NoError(t, os.Symlink(victim, path+".tmp"))
	require.NoError(t, save(t, s, samplePos))
	unchanged()
	st, err := os.Lstat(path)
	require.NoError(t, err)
	require.True(t, st.Mode().IsRegular())

	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Symlink(victim, path)) // a save replaces the link, never writes through it
	require.NoError(t, save(t, s, samplePos))
	unchanged()
	got, _, err := s.Load(ctx, "s")
	require.NoError(t, err)
	require.Equal(t, samplePos, got)
}

// readOnly makes dir read-only, for root too (immutable), and returns the undo; it skips t
// where neither works.
func readOnly(t *testing.T, dir string) func() {
	t.Helper()
	if os.Geteuid() != 0 {
		require.NoError(t, os.Chmod(dir, 0o500))
		return func() { os.Chmod(dir, 0o700) }
	}
	if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
		t.Skipf("running as root, and chattr +i fails (%v: %s): no way to make a directory read-only", err, out)
	}
	return func() { exec.Command("chattr", "-i", dir).Run() }
}

// TestFileStoreReadOnlyDir: a directory the store cannot write to fails OpenFile, naming it;
// one that becomes read-only later fails the commit, and the position stays as it was.
func TestFileStoreReadOnlyDir(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "ro")
	require.NoError(t, os.Mkdir(dir, 0o700))
	path := filepath.Join(dir, "pos")
	undo := readOnly(t, dir)
	_, err := changefeed.OpenFile(path)
	undo()
	require.ErrorContains(t, err, "not writable")
	require.ErrorContains(t, err, path)

	s := mustOpen(t, path)
	require.NoError(t, save(t, s, samplePos))
	undo = readOnly(t, dir)
	defer undo()
	next := samplePos
	next.EndLSN++
	require.Error(t, save(t, s, next))
	got, _, err := s.Load(ctx, "s")
	require.NoError(t, err)
	require.Equal(t, samplePos, got)
}

// TestFileStoreReader: another FileStore opened on the path to read it (a monitor, a test)
// does not disturb the one that commits.
func TestFileStoreReader(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "pos")
	w := mustOpen(t, path)
	done := make(chan error, 1)
	go func() {
		p := samplePos
		for range 300 {
			p.EndLSN++
			if err := save(t, w, p); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		default:
		}
		r := mustOpen(t, path)
		_, _, err := r.Load(ctx, "s")
		require.NoError(t, err)
		require.NoError(t, r.Close())
	}
}

// TestConfigErrors: what cannot work is refused before anything connects.
func TestConfigErrors(t *testing.T) {
	s := mustOpen(t, filepath.Join(t.TempDir(), "pos"))
	ok := changefeed.Config{Replication: replication.Config{ConnString: "dbname=x", Slot: "s", Publications: []string{"p"}}}
	h := func(context.Context, *changefeed.Batch) error { return nil }
	for name, f := range map[string]func() error{
		"no store":   func() error { _, err := changefeed.New(ok, nil, h); return err },
		"no handler": func() error { _, err := changefeed.New(ok, s, nil); return err },
		"no slot": func() error {
			c := ok
			c.Replication.Slot = ""
			_, err := changefeed.New(c, s, h)
			return err
		},
		"temporary slot": func() error {
			c := ok
			c.Replication.TemporarySlot = true
			_, err := changefeed.New(c, s, h)
			return err
		},
		"incremental": func() error {
			c := ok
			c.Replication.Buffer.Incremental = true
			_, err := changefeed.New(c, s, h)
			return err
		},
		"state too large": func() error {
			return save(t, s, changefeed.Position{Slot: "s", State: make([]byte, changefeed.MaxState+1)})
		},
	} {
		require.ErrorIs(t, f(), changefeed.ErrInvalidConfig, name)
	}
}
