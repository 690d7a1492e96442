//go:build !linux || vfs_osroot

package vfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// osFS works through os.Root on systems other than Linux (and on Linux when built with the tag
// vfs_osroot, so that its tests run there too). os.Root keeps every name inside its directory, but
// follows a symbolic link that stays inside it, so each method first refuses a name that is a link
// (a check a co-tenant could race only in a directory that others may rename entries in, and then
// only towards another entry of the same directory, which the ownership checks refuse).
type osFS struct{}

func (osFS) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }

func (osFS) OpenDir(path string) (Dir, error) {
	r, err := os.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	return &rootDir{r: r, path: path}, nil
}

type rootDir struct {
	r    *os.Root
	path string
}

func (d *rootDir) join(name string) string { return filepath.Join(d.path, name) }

// check returns an error if name is not a single path element or is a symbolic link.
func (d *rootDir) check(op, name string) error {
	if !ValidName(name) {
		return &fs.PathError{Op: op, Path: d.join(name), Err: fs.ErrInvalid}
	}
	if fi, err := d.r.Lstat(name); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return &fs.PathError{Op: op, Path: d.join(name), Err: ErrSymlink}
	}
	return nil
}

func (d *rootDir) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	if err := d.check("open", name); err != nil {
		return nil, err
	}
	// Not opened at all if it is not a regular file: a FIFO would wait for a writer.
	if fi, err := d.r.Lstat(name); err == nil && !fi.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: ErrNotRegular}
	}
	f, err := d.r.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	rf := &rootFile{f: f, path: d.join(name)}
	if info, err := rf.Stat(); err != nil || !info.Mode.IsRegular() {
		f.Close()
		if err == nil {
			err = &fs.PathError{Op: "open", Path: d.join(name), Err: ErrNotRegular}
		}
		return nil, err
	}
	return rf, nil
}

func (d *rootDir) Lock(name string, create bool) (LockFile, error) {
	if !haveFlock {
		return nil, fmt.Errorf("vfs: locking %s: %w", d.join(name), errors.ErrUnsupported)
	}
	if err := d.check("open", name); err != nil {
		return nil, err
	}
	flag := os.O_RDWR | syscall.O_NONBLOCK
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	}
	f, err := d.r.OpenFile(name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flock(f); err != nil {
		f.Close()
		return nil, err
	}
	return rootLock{f}, nil
}

func (d *rootDir) Mkdir(name string, perm fs.FileMode) error {
	if !ValidName(name) {
		return &fs.PathError{Op: "mkdir", Path: d.join(name), Err: fs.ErrInvalid}
	}
	return d.r.Mkdir(name, perm)
}

func (d *rootDir) OpenDir(name string) (Dir, error) {
	if err := d.check("open", name); err != nil {
		return nil, err
	}
	// name/. makes os.Root open name as an inner path element, with O_DIRECTORY: opening a FIFO
	// put in the place of a directory fails instead of waiting for a writer.
	r, err := d.r.OpenRoot(name + "/.")
	if err != nil {
		return nil, err
	}
	return &rootDir{r: r, path: d.join(name)}, nil
}

func (d *rootDir) Remove(name string) error {
	return d.remove(name, false)
}

func (d *rootDir) RemoveDir(name string) error {
	return d.remove(name, true)
}

// remove removes name if it is a directory exactly when dir is set (os.Root.Remove takes both).
func (d *rootDir) remove(name string, dir bool) error {
	if !ValidName(name) {
		return &fs.PathError{Op: "remove", Path: d.join(name), Err: fs.ErrInvalid}
	}
	fi, err := d.r.Lstat(name)
	if err != nil {
		return err
	}
	if fi.IsDir() != dir {
		return &fs.PathError{Op: "remove", Path: d.join(name), Err: fs.ErrInvalid}
	}
	return d.r.Remove(name)
}

func (d *rootDir) Rename(oldname, newname string) error {
	if err := d.check("rename", oldname); err != nil {
		return err
	}
	if !ValidName(newname) {
		return &fs.PathError{Op: "rename", Path: d.join(newname), Err: fs.ErrInvalid}
	}
	return d.r.Rename(oldname, newname)
}

func (d *rootDir) ReadDir() ([]string, error) {
	f, err := d.r.Open(".")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

func (d *rootDir) Lstat(name string) (Info, error) {
	if !ValidName(name) {
		return Info{}, &fs.PathError{Op: "lstat", Path: d.join(name), Err: fs.ErrInvalid}
	}
	fi, err := d.r.Lstat(name)
	if err != nil {
		return Info{}, err
	}
	return infoOf(fi), nil
}

func (d *rootDir) Stat() (Info, error) {
	fi, err := d.r.Stat(".")
	if err != nil {
		return Info{}, err
	}
	return infoOf(fi), nil
}

func (d *rootDir) Sync() error {
	f, err := d.r.Open(".")
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (d *rootDir) Close() error { return d.r.Close() }

// rootFile is a file opened through os.Root.
type rootFile struct {
	f    *os.File
	path string
}

func (f *rootFile) ReadAt(p []byte, off int64) (int, error)  { return f.f.ReadAt(p, off) }
func (f *rootFile) WriteAt(p []byte, off int64) (int, error) { return f.f.WriteAt(p, off) }
func (f *rootFile) Truncate(size int64) error                { return f.f.Truncate(size) }
func (f *rootFile) Sync() error                              { return f.f.Sync() }
func (f *rootFile) Name() string                             { return f.path }
func (f *rootFile) Close() error                             { return f.f.Close() }

func (f *rootFile) Stat() (Info, error) {
	fi, err := f.f.Stat()
	if err != nil {
		return Info{}, err
	}
	return infoOf(fi), nil
}

type rootLock struct{ f *os.File }

func (l rootLock) Stat() (Info, error) {
	fi, err := l.f.Stat()
	if err != nil {
		return Info{}, err
	}
	return infoOf(fi), nil
}

func (l rootLock) Close() error { return l.f.Close() }
