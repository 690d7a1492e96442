//go:build unix

package vfs_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
)

// openDir opens path through vfs.OS.
func openDir(t *testing.T, path string) vfs.Dir {
	t.Helper()
	d, err := vfs.OS().OpenDir(path)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// TestDir: names that are symbolic links are refused (opening) or replaced themselves (renaming
// over them, removing them), never followed; names that are not regular files are refused, a
// FIFO without waiting; names that are not one path element are refused.
func TestDir(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o600))
	intact := func() {
		t.Helper()
		b, err := os.ReadFile(victim)
		require.NoError(t, err)
		require.Equal(t, "precious", string(b))
	}
	path := filepath.Join(base, "d")
	require.NoError(t, os.Mkdir(path, 0o700))
	require.NoError(t, os.Symlink(victim, filepath.Join(path, "link")))
	require.NoError(t, os.Symlink(base, filepath.Join(path, "dirlink")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(path, "fifo"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(path, "sub"), 0o700))
	d := openDir(t, path)

	for _, flag := range []int{os.O_RDONLY, os.O_RDWR, os.O_RDWR | os.O_CREATE, os.O_WRONLY | os.O_CREATE | os.O_TRUNC} {
		_, err := d.OpenFile("link", flag, 0o600)
		require.ErrorIs(t, err, vfs.ErrSymlink, "opening a link with flag %#x", flag)
		require.ErrorContains(t, err, filepath.Join(path, "link"))
	}
	_, err := d.Lock("link", false)
	require.ErrorIs(t, err, vfs.ErrSymlink)
	_, err = d.OpenDir("dirlink")
	require.Error(t, err)
	for _, flag := range []int{os.O_RDONLY, os.O_WRONLY, os.O_RDWR} {
		_, err := d.OpenFile("fifo", flag, 0)
		require.ErrorIs(t, err, vfs.ErrNotRegular, "opening a FIFO with flag %#x", flag)
	}
	_, err = d.OpenFile("sub", os.O_RDONLY, 0)
	require.Error(t, err)
	for _, name := range []string{"../victim", "", ".", "..", "a/b", "a\x00b"} {
		require.False(t, vfs.ValidName(name), name)
		_, err := d.OpenFile(name, os.O_RDONLY, 0)
		require.ErrorIs(t, err, fs.ErrInvalid, "%q", name)
		_, err = d.Lstat(name)
		require.ErrorIs(t, err, fs.ErrInvalid, "%q", name)
		require.ErrorIs(t, d.Remove(name), fs.ErrInvalid, "%q", name)
		require.ErrorIs(t, d.Rename("fifo", name), fs.ErrInvalid, "%q", name)
	}
	require.True(t, vfs.ValidName("pos.tmp"))
	intact()

	info, err := d.Lstat("link")
	require.NoError(t, err)
	require.Equal(t, fs.ModeSymlink, info.Mode.Type())
	info, err = d.Lstat("fifo")
	require.NoError(t, err)
	require.Equal(t, fs.ModeNamedPipe, info.Mode.Type())
	_, err = d.Lstat("missing")
	require.ErrorIs(t, err, fs.ErrNotExist)

	// A file of one's own: positional writes and reads, its size, private.
	f, err := d.OpenFile("new", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(path, "new"), f.Name())
	_, err = f.WriteAt([]byte("hello"), 2)
	require.NoError(t, err)
	buf := make([]byte, 7)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, "\x00\x00hello", string(buf))
	info, err = f.Stat()
	require.NoError(t, err)
	require.True(t, info.Mode.IsRegular())
	require.EqualValues(t, 7, info.Size)
	require.Equal(t, os.Geteuid(), info.UID)
	require.NoError(t, vfs.CheckPrivate(f))
	require.NoError(t, f.Sync())
	require.NoError(t, f.Truncate(3))
	info, err = f.Stat()
	require.NoError(t, err)
	require.EqualValues(t, 3, info.Size)
	require.NoError(t, f.Close())
	require.ErrorIs(t, f.Close(), os.ErrClosed)

	// Renaming over a link replaces the link; removing a link removes the link.
	require.NoError(t, d.Rename("new", "link"))
	require.NoError(t, d.Sync())
	fi, err := os.Lstat(filepath.Join(path, "link"))
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular())
	require.NoError(t, os.Symlink(victim, filepath.Join(path, "link2")))
	require.NoError(t, d.Remove("link2"))
	require.NoError(t, d.Remove("dirlink"))
	_, err = os.Stat(base)
	require.NoError(t, err)
	intact()

	// A second name makes a file not private.
	require.NoError(t, os.Link(filepath.Join(path, "link"), filepath.Join(path, "hard")))
	_, err = vfs.OpenPrivate(d, "link", os.O_RDONLY, 0)
	require.ErrorIs(t, err, vfs.ErrNotPrivate)
	require.ErrorContains(t, err, "2 hard links")

	names, err := d.ReadDir()
	require.NoError(t, err)
	slices.Sort(names)
	require.Equal(t, []string{"fifo", "hard", "link", "sub"}, names)
}

// TestLock: a lock taken is seen by a second Lock of the same file, until it is closed.
func TestLock(t *testing.T) {
	d := openDir(t, t.TempDir())
	l, err := d.Lock("lock", true)
	require.NoError(t, err)
	_, err = d.Lock("lock", false)
	require.ErrorIs(t, err, vfs.ErrLocked)
	_, err = d.Lock("lock", true)
	require.ErrorIs(t, err, fs.ErrExist)
	info, err := l.Stat()
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), info.Mode.Perm()&^0o022)
	require.NoError(t, l.Close())
	l, err = d.Lock("lock", false)
	require.NoError(t, err)
	require.NoError(t, l.Close())
}

// TestFS: OpenDir opens existing directories only, MkdirAll makes them.
func TestFS(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b")
	_, err := vfs.OS().OpenDir(path)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.NoError(t, vfs.OS().MkdirAll(path, 0o700))
	require.NoError(t, vfs.OS().MkdirAll(path, 0o700))
	d := openDir(t, path)
	info, err := d.Stat()
	require.NoError(t, err)
	require.True(t, info.Mode.IsDir())
	require.NoError(t, d.Mkdir("c", 0o700))
	sub, err := d.OpenDir("c")
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	require.NoError(t, d.RemoveDir("c"))
	require.NoError(t, os.WriteFile(filepath.Join(path, "f"), nil, 0o600))
	_, err = vfs.OS().OpenDir(filepath.Join(path, "f"))
	require.Error(t, err)
	_, err = d.OpenDir("f")
	require.Error(t, err)
}

// TestWriteFile: WriteFile replaces a file with its new content, mode as given, and leaves no
// temporary file; one a crash left is replaced, and a link under either name is replaced itself,
// never followed. ReadFile reads up to its limit, and refuses a link.
func TestWriteFile(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o600))
	path := filepath.Join(base, "d")
	require.NoError(t, os.Mkdir(path, 0o700))
	d := openDir(t, path)
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)

	_, err := vfs.ReadFile(d, "pos", 100)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.NoError(t, vfs.WriteFile(d, "pos", []byte("one"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(path, "pos"+vfs.TempSuffix), []byte("torn"), 0o600)) // a crash
	require.NoError(t, vfs.WriteFile(d, "pos", []byte("two"), 0o640))
	b, err := vfs.ReadFile(d, "pos", 100)
	require.NoError(t, err)
	require.Equal(t, "two", string(b))
	b, err = vfs.ReadFile(d, "pos", 2)
	require.NoError(t, err)
	require.Equal(t, "tw", string(b))
	fi, err := os.Lstat(filepath.Join(path, "pos"))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o640), fi.Mode())
	_, err = os.Lstat(filepath.Join(path, "pos"+vfs.TempSuffix))
	require.ErrorIs(t, err, fs.ErrNotExist)

	require.NoError(t, os.Symlink(victim, filepath.Join(path, "pos"+vfs.TempSuffix)))
	require.NoError(t, vfs.WriteFile(d, "pos", []byte("three"), 0o600))
	require.NoError(t, os.Remove(filepath.Join(path, "pos")))
	require.NoError(t, os.Symlink(victim, filepath.Join(path, "pos")))
	_, err = vfs.ReadFile(d, "pos", 100)
	require.ErrorIs(t, err, vfs.ErrSymlink)
	require.ErrorContains(t, err, "symbolic link")
	require.NoError(t, vfs.WriteFile(d, "pos", []byte("four"), 0o600))
	b, err = vfs.ReadFile(d, "pos", 100)
	require.NoError(t, err)
	require.Equal(t, "four", string(b))
	got, err := os.ReadFile(victim)
	require.NoError(t, err)
	require.Equal(t, "precious", string(got))

	require.ErrorIs(t, vfs.WriteFile(d, "", nil, 0o600), fs.ErrInvalid)
	require.ErrorIs(t, vfs.WriteFile(d, "../x", nil, 0o600), fs.ErrInvalid)
	names, err := d.ReadDir()
	require.NoError(t, err)
	require.Equal(t, []string{"pos"}, names)
}

// TestWriteFileFaults: whatever fails, WriteFile returns the error, and the file holds the old
// content or, only once the rename happened, the new one: ENOSPC while writing the temporary
// file, EIO on its fsync or close, a rename that fails, EIO on the directory's fsync. The
// temporary file is removed again when the rename did not happen.
func TestWriteFileFaults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rule    faultfs.Rule
		renamed bool // the new content is in place after the error
	}{
		{"disk full", faultfs.Rule{Op: faultfs.OpWrite, Err: syscall.ENOSPC, Partial: true}, false},
		{"short write", faultfs.Rule{Op: faultfs.OpWrite, Partial: true}, false},
		{"fsync", faultfs.Rule{Op: faultfs.OpSync, Count: 1, Err: syscall.EIO}, false},
		{"close", faultfs.Rule{Op: faultfs.OpClose, Err: syscall.EIO}, false},
		{"cannot create", faultfs.Rule{Op: faultfs.OpOpen, Err: syscall.EACCES}, false},
		{"rename", faultfs.Rule{Op: faultfs.OpRename, Err: syscall.EIO}, false},
		{"directory fsync", faultfs.Rule{Op: faultfs.OpSync, Skip: 1, Err: syscall.EIO}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := t.TempDir()
			ffs := faultfs.New(vfs.OS())
			d, err := ffs.OpenDir(path)
			require.NoError(t, err)
			defer d.Close()
			require.NoError(t, vfs.WriteFile(d, "pos", []byte("old"), 0o600))
			ffs.Add(tc.rule)
			err = vfs.WriteFile(d, "pos", []byte("new"), 0o600)
			require.Error(t, err)
			if tc.rule.Err != nil {
				require.ErrorIs(t, err, tc.rule.Err)
			}
			require.Equal(t, 1, ffs.Fired())
			want := map[bool]string{false: "old", true: "new"}[tc.renamed]
			b, err := vfs.ReadFile(openDir(t, path), "pos", 100)
			require.NoError(t, err)
			require.Equal(t, want, string(b))
			names, err := os.ReadDir(path)
			require.NoError(t, err)
			require.Len(t, names, 1, "the temporary file is gone")
			ffs.Reset()
			require.NoError(t, vfs.WriteFile(d, "pos", []byte("newer"), 0o600))
			b, err = vfs.ReadFile(d, "pos", 100)
			require.NoError(t, err)
			require.Equal(t, "newer", string(b))
		})
	}
}

// TestWriteFileCrash: a crash after each operation of WriteFile in turn (every later one fails,
// nothing after the crash reaches the disk) leaves the old content or the new one, never a mix,
// and the next WriteFile, after the restart, works.
func TestWriteFileCrash(t *testing.T) {
	oldData, newData := bytes.Repeat([]byte("old "), 1000), bytes.Repeat([]byte("new "), 900)
	// setup returns a directory holding the old content, through a new faultfs.FS.
	setup := func() (string, *faultfs.FS, vfs.Dir) {
		path := t.TempDir()
		ffs := faultfs.New(vfs.OS())
		d, err := ffs.OpenDir(path)
		require.NoError(t, err)
		require.NoError(t, vfs.WriteFile(d, "pos", oldData, 0o600))
		return path, ffs, d
	}
	// A whole WriteFile, to count its operations.
	_, ffs, d := setup()
	ops := 0
	ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Match: func(string) bool { ops++; return false }})
	require.NoError(t, vfs.WriteFile(d, "pos", newData, 0o600))
	d.Close()
	require.GreaterOrEqual(t, ops, 7, "remove, create, write, sync, close, rename, sync the directory")

	for crash := range ops + 1 {
		path, ffs, d := setup()
		ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Skip: crash, Err: syscall.EIO})
		err := vfs.WriteFile(d, "pos", newData, 0o600)
		d.Close()
		require.Equal(t, crash == ops, err == nil, "crash after %d of %d operations: %v", crash, ops, err)

		restarted := openDir(t, path)
		b, rerr := vfs.ReadFile(restarted, "pos", 1<<20)
		require.NoError(t, rerr)
		if !bytes.Equal(b, oldData) && !bytes.Equal(b, newData) {
			t.Fatalf("crash after %d operations: the file holds %d bytes, neither the old content nor the new", crash, len(b))
		}
		if err == nil {
			require.Equal(t, newData, b)
		}
		require.NoError(t, vfs.WriteFile(restarted, "pos", []byte("after"), 0o600))
		b, err = vfs.ReadFile(restarted, "pos", 100)
		require.NoError(t, err)
		require.Equal(t, "after", string(b))
	}
}

func TestErrorsAreDistinct(t *testing.T) {
	errs := []error{vfs.ErrLocked, vfs.ErrSymlink, vfs.ErrNotRegular, vfs.ErrNotPrivate}
	for i, a := range errs {
		for j, b := range errs {
			require.Equal(t, i == j, errors.Is(a, b))
		}
	}
}
