// Package dirfile opens, renames and removes files by name inside an open directory, without
// following symbolic links, for files that live in directories other users may write to (a
// shared /tmp). The directory's own path is the caller's choice and is followed; every name
// after that is one path element resolved in the open directory: a symbolic link planted under
// that name is refused (opening) or replaced itself (renaming over it, removing it), never
// followed, and a name that is not a regular file (a FIFO, a device) is refused.
//
// On Linux it works with openat(2) and its relatives on the directory's descriptor. Elsewhere it
// uses os.Root after checking that the name is not a symbolic link, which a co-tenant could race
// only towards another entry of the same directory.
package dirfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrSymlink is wrapped by the error of Dir.OpenFile for a name that is a symbolic link.
var ErrSymlink = errors.New("is a symbolic link, which is never followed")

// ErrNotRegular is wrapped by the error of Dir.OpenFile for a name that is not a regular file.
var ErrNotRegular = errors.New("is not a regular file")

// ErrNotPrivate is wrapped by the error of CheckPrivate.
var ErrNotPrivate = errors.New("is not this user's own file")

// Dir is an open directory. It is not safe for concurrent Close.
type Dir struct {
	d    dir
	path string
}

// Open opens the directory at path (following symbolic links in path).
func Open(path string) (*Dir, error) {
	d, err := openDir(path)
	if err != nil {
		return nil, err
	}
	return &Dir{d: d, path: path}, nil
}

// Path returns the path the directory was opened with.
func (d *Dir) Path() string { return d.path }

// Join returns the path of name in the directory, for messages.
func (d *Dir) Join(name string) string { return filepath.Join(d.path, name) }

// OpenFile opens the regular file name like os.OpenFile (flag os.O_RDONLY, os.O_WRONLY or
// os.O_RDWR, with os.O_CREATE, os.O_EXCL, os.O_TRUNC, os.O_APPEND; perm applies to a file it
// creates, less the umask). It fails, wrapping ErrSymlink, if name is a symbolic link, and,
// wrapping ErrNotRegular, if it is not a regular file; opening a FIFO does not wait for a writer.
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if !validName(name) {
		return nil, &fs.PathError{Op: "open", Path: d.Join(name), Err: fs.ErrInvalid}
	}
	return d.d.openFile(d, name, flag, perm)
}

// Rename renames oldname to newname, both in the directory, replacing whatever newname is (a
// symbolic link there is replaced, not followed).
func (d *Dir) Rename(oldname, newname string) error {
	if !validName(oldname) || !validName(newname) {
		return &os.LinkError{Op: "rename", Old: d.Join(oldname), New: d.Join(newname), Err: fs.ErrInvalid}
	}
	return d.d.rename(d, oldname, newname)
}

// Remove removes name, which is not a directory (a symbolic link is removed itself).
func (d *Dir) Remove(name string) error {
	if !validName(name) {
		return &fs.PathError{Op: "remove", Path: d.Join(name), Err: fs.ErrInvalid}
	}
	return d.d.remove(d, name)
}

// Sync flushes the directory's entries to stable storage (a rename in it survives a crash).
func (d *Dir) Sync() error { return d.d.sync() }

// Close closes the directory. It is safe to call twice.
func (d *Dir) Close() error {
	if d.d == nil {
		return nil
	}
	err := d.d.close()
	d.d = nil
	return err
}

// CheckPrivate returns an error wrapping ErrNotPrivate if the open file f, found under a name
// somebody else may have planted, belongs to another user or has other names (hard links) that
// somebody else may read it through. Where the platform reports no owner it checks nothing.
func CheckPrivate(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	uid, nlink, ok := owner(fi)
	switch {
	case !ok:
		return nil
	case uid != os.Geteuid():
		return fmt.Errorf("%s %w: it belongs to user id %d (move it away, or run as its owner)", f.Name(), ErrNotPrivate, uid)
	case nlink != 1:
		return fmt.Errorf("%s %w: it has %d hard links (remove the others)", f.Name(), ErrNotPrivate, nlink)
	}
	return nil
}

// validName reports whether name is a single path element.
func validName(name string) bool {
	if name == "" || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] == 0 || os.IsPathSeparator(name[i]) {
			return false
		}
	}
	return true
}

// dir is the platform's directory handle.
type dir interface {
	openFile(d *Dir, name string, flag int, perm fs.FileMode) (*os.File, error)
	rename(d *Dir, oldname, newname string) error
	remove(d *Dir, name string) error
	sync() error
	close() error
}
