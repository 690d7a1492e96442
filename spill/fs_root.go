//go:build !linux || spill_osroot

package spill

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// osFS works through os.Root on systems other than Linux (and on Linux when built with the tag
// spill_osroot, so that its tests run there too). os.Root keeps every name inside its directory. os.Root follows a
// symbolic link that stays inside the directory, so each method first refuses a name that is a
// link (a check a co-tenant could race only in a directory that others may rename entries in,
// and then only towards another entry of the same directory, which Store checks once open).
type osFS struct{}

func (osFS) OpenDir(path string) (Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, err
	}
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

// check returns an error if name is not a single path element or is a symbolic link.
func (d *rootDir) check(op, name string) error {
	if !validName(name) {
		return &fs.PathError{Op: op, Path: filepath.Join(d.path, name), Err: fs.ErrInvalid}
	}
	if fi, err := d.r.Lstat(name); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return &fs.PathError{Op: op, Path: filepath.Join(d.path, name), Err: errSymlink}
	}
	return nil
}

var errSymlink = fmt.Errorf("is a symbolic link: %w", fs.ErrInvalid)

func (d *rootDir) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	if err := d.check("open", name); err != nil {
		return nil, err
	}
	f, err := d.r.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (d *rootDir) Lock(name string, create bool) (LockFile, error) {
	if !haveFlock {
		return nil, fmt.Errorf("spill: locking %s: %w", filepath.Join(d.path, name), errors.ErrUnsupported)
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
	if !validName(name) {
		return &fs.PathError{Op: "mkdir", Path: filepath.Join(d.path, name), Err: fs.ErrInvalid}
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
	return &rootDir{r: r, path: filepath.Join(d.path, name)}, nil
}

func (d *rootDir) Remove(name string) error {
	return d.remove(name, false)
}

func (d *rootDir) RemoveDir(name string) error {
	return d.remove(name, true)
}

// remove removes name if it is a directory exactly when dir is set (os.Root.Remove takes both).
func (d *rootDir) remove(name string, dir bool) error {
	if !validName(name) {
		return &fs.PathError{Op: "remove", Path: filepath.Join(d.path, name), Err: fs.ErrInvalid}
	}
	fi, err := d.r.Lstat(name)
	if err != nil {
		return err
	}
	if fi.IsDir() != dir {
		return &fs.PathError{Op: "remove", Path: filepath.Join(d.path, name), Err: fs.ErrInvalid}
	}
	return d.r.Remove(name)
}

func (d *rootDir) Rename(oldname, newname string) error {
	if err := d.check("rename", oldname); err != nil {
		return err
	}
	if !validName(newname) {
		return &fs.PathError{Op: "rename", Path: filepath.Join(d.path, newname), Err: fs.ErrInvalid}
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

func (d *rootDir) Stat() (Info, error) {
	fi, err := d.r.Stat(".")
	if err != nil {
		return Info{}, err
	}
	return infoOf(fi), nil
}

func (d *rootDir) Close() error { return d.r.Close() }

type rootLock struct{ f *os.File }

func (l rootLock) Stat() (Info, error) {
	fi, err := l.f.Stat()
	if err != nil {
		return Info{}, err
	}
	return infoOf(fi), nil
}

func (l rootLock) Close() error { return l.f.Close() }
