package changefeed_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
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
		"temporary slot, stream, stored position": func() error {
			c := ok
			c.Start, c.Replication.TemporarySlot = changefeed.StartStream, true
			_, err := changefeed.New(c, s, h)
			return err
		},
		"slot store, copy": func() error {
			_, err := changefeed.New(ok, changefeed.SlotStore{}, h)
			return err
		},
		"unknown start": func() error {
			c := ok
			c.Start = 7
			_, err := changefeed.New(c, s, h)
			return err
		},
		"incremental": func() error {
			c := ok
			c.Replication.Buffer.Incremental = true
			_, err := changefeed.New(c, s, h)
			return err
		},
		"copier, stream": func() error {
			c := ok
			c.Start, c.Copier = changefeed.StartStream, &failCopier{}
			_, err := changefeed.New(c, s, h)
			return err
		},
		"state too large": func() error {
			return save(t, s, changefeed.Position{Slot: "s", State: make([]byte, changefeed.MaxState+1)})
		},
	} {
		require.ErrorIs(t, f(), changefeed.ErrInvalidConfig, name)
	}
	c := ok
	c.Start, c.Replication.TemporarySlot = changefeed.StartStream, true
	_, err := changefeed.New(c, changefeed.SlotStore{}, h)
	require.NoError(t, err, "a temporary slot streamed with no stored position")
}

// openFaulty opens a FileStore on a new path through a new faultfs.FS and stores samplePos.
func openFaulty(t *testing.T) (string, *faultfs.FS, *changefeed.FileStore) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pos")
	ffs := faultfs.New(vfs.OS())
	s, err := changefeed.OpenFileStore(path, changefeed.FileConfig{FS: ffs})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, save(t, s, samplePos))
	return path, ffs, s
}

// TestFileStoreFaults: a commit that meets ENOSPC writing the temporary file, EIO on its fsync, a
// rename that fails or EIO on the directory's fsync returns that error (so that Run acknowledges
// nothing), and the position read back, by the store and by a new one (a restart), is the
// previous one or, once the rename was made, the new one; the temporary file does not stay, and
// the next commit works.
func TestFileStoreFaults(t *testing.T) {
	ctx := context.Background()
	isTmp := func(p string) bool { return filepath.Base(p) == "pos"+vfs.TempSuffix }
	for _, tc := range []struct {
		name    string
		rule    func(dir string) faultfs.Rule
		renamed bool // the new position is in place all the same
	}{
		{"disk full", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpWrite, Match: isTmp, Err: syscall.ENOSPC, Partial: true}
		}, false},
		{"cannot create", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpOpen, Match: isTmp, Err: syscall.ENOSPC}
		}, false},
		{"fsync", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: isTmp, Err: syscall.EIO}
		}, false},
		{"rename", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpRename, Match: isTmp, Err: syscall.EIO}
		}, false},
		{"directory fsync", func(dir string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: func(p string) bool { return p == dir }, Err: syscall.EIO}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, ffs, s := openFaulty(t)
			rule := tc.rule(filepath.Dir(path))
			ffs.Add(rule)
			next := samplePos
			next.EndLSN++
			err := save(t, s, next)
			require.ErrorIs(t, err, rule.Err)
			require.ErrorContains(t, err, path)
			require.Equal(t, 1, ffs.Fired())
			ffs.Reset()

			want := samplePos
			if tc.renamed {
				want = next
			}
			got, ok, err := s.Load(ctx, "s")
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, want, got)
			restarted := mustOpen(t, path)
			defer restarted.Close()
			got, _, err = restarted.Load(ctx, "s")
			require.NoError(t, err)
			require.Equal(t, want, got)
			_, err = os.Lstat(path + vfs.TempSuffix)
			require.ErrorIs(t, err, os.ErrNotExist)

			next.EndLSN++
			require.NoError(t, save(t, restarted, next))
			got, _, err = s.Load(ctx, "s")
			require.NoError(t, err)
			require.Equal(t, next, got)
		})
	}
}

// TestFileStoreCrash: the process dies at each step of a commit in turn (every operation from
// there on fails, nothing more reaches the disk), a crash between the temporary file's write and
// its rename among them. A new store on the path loads the previous position or the new one,
// never an error; after a commit that returned nil, the new one.
func TestFileStoreCrash(t *testing.T) {
	ctx := context.Background()
	next := samplePos
	next.EndLSN += 0x100
	next.State = []byte("a longer state than the previous one")
	_, ffs, s := openFaulty(t)
	ops := 0
	ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Match: func(string) bool { ops++; return false }})
	require.NoError(t, save(t, s, next))
	require.GreaterOrEqual(t, ops, 7, "remove, create, write, sync, close, rename, sync the directory")

	outcomes := map[decoding.LSN]int{}
	for crash := range ops + 1 {
		path, ffs, s := openFaulty(t)
		ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Skip: crash, Err: syscall.EIO})
		err := save(t, s, next)
		require.Equal(t, crash == ops, err == nil, "crash after %d of %d operations: %v", crash, ops, err)
		s.Close()

		restarted := mustOpen(t, path)
		got, ok, lerr := restarted.Load(ctx, "s")
		require.NoError(t, lerr, "crash after %d operations", crash)
		require.True(t, ok)
		if got.EndLSN == samplePos.EndLSN {
			require.Equal(t, samplePos, got)
			require.Error(t, err, "crash after %d operations", crash)
		} else {
			require.Equal(t, next, got, "crash after %d operations", crash)
		}
		outcomes[got.EndLSN]++
		require.NoError(t, save(t, restarted, samplePos), "after the restart")
		require.NoError(t, restarted.Close())
	}
	require.Equal(t, map[decoding.LSN]int{samplePos.EndLSN: ops - 1, next.EndLSN: 2}, outcomes,
		"the new position is there once the rename was made, before the directory's fsync")
}

// TestFileStoreNotPrivate: a position file with a second name (a hard link somebody else may
// read it through), or one that belongs to another user, is an error, never a position; nor is
// anything but a regular file.
func TestFileStoreNotPrivate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "pos")
	s := mustOpen(t, path)
	defer s.Close()
	require.NoError(t, save(t, s, samplePos))
	require.NoError(t, os.Link(path, filepath.Join(dir, "other")))
	_, _, err := s.Load(ctx, "s")
	require.ErrorIs(t, err, changefeed.ErrStore)
	require.ErrorContains(t, err, "hard links")
	require.NoError(t, os.Remove(filepath.Join(dir, "other")))
	_, _, err = s.Load(ctx, "s")
	require.NoError(t, err)

	if os.Geteuid() == 0 {
		require.NoError(t, os.Chown(path, 65534, 65534))
		_, _, err = s.Load(ctx, "s")
		require.ErrorIs(t, err, changefeed.ErrStore)
		require.ErrorContains(t, err, "belongs to user id 65534")
		require.NoError(t, os.Chown(path, 0, 0))
	}

	require.NoError(t, os.Remove(path))
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	_, _, err = s.Load(ctx, "s") // never waits for a writer
	require.ErrorIs(t, err, changefeed.ErrStore)
	_, err = changefeed.OpenFile(path)
	require.ErrorIs(t, err, changefeed.ErrStore)
}
