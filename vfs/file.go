package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// TempSuffix is appended to a name to make the name of the temporary file that WriteFile writes
// and then renames over it. A crash can leave it behind; the next WriteFile of the name replaces
// it, and ReadFile never reads it.
const TempSuffix = ".tmp"

// CheckPrivate returns an error wrapping ErrNotPrivate if the open file f, found under a name
// somebody else may have planted, belongs to another user or has other names (hard links) that
// somebody else may read it through. A file that has been removed since it was opened (replaced by
// a WriteFile, say) has no name left, and passes. Where the platform reports no owner it checks
// nothing.
func CheckPrivate(f File) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	switch {
	case info.UID < 0:
	case info.UID != os.Geteuid():
		return fmt.Errorf("%s %w: it belongs to user id %d (move it away, or run as its owner)", f.Name(), ErrNotPrivate, info.UID)
	case info.Nlink > 1: // 0: removed (replaced) since it was opened, which nobody can open now
		return fmt.Errorf("%s %w: it has %d hard links (remove the others)", f.Name(), ErrNotPrivate, info.Nlink)
	}
	return nil
}

// OpenPrivate opens the regular file name in d like Dir.OpenFile and checks, with CheckPrivate,
// that it is this user's own.
func OpenPrivate(d Dir, name string, flag int, perm fs.FileMode) (File, error) {
	f, err := d.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if err := CheckPrivate(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReadFile reads the file name in d, at most limit bytes of it (a longer file is cut there), after
// checking with OpenPrivate that it is a regular file of this user's own, not a symbolic link. Its
// error wraps fs.ErrNotExist if there is no such file.
func ReadFile(d Dir, name string, limit int64) ([]byte, error) {
	f, err := OpenPrivate(d, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.NewSectionReader(f, 0, limit))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// WriteFile replaces the file name in d with data, atomically and durably: it removes whatever has
// the temporary name (name plus TempSuffix: a file a crash left, or a symbolic link itself, never
// followed), creates the temporary file exclusively with mode perm (less the umask), writes data,
// fsyncs and closes it, renames it over name (replacing whatever name is, a symbolic link itself)
// and fsyncs d.
//
// A reader sees the old content of name or the new one, never anything else. When WriteFile
// returns nil, the new content is durable. When it returns an error, either may be there (the
// rename may have happened, and a crash may yet undo it): a caller that keeps a position in the
// file must not count on the new one, and reads the file again to know. The temporary file is
// removed again, if it can be, when writing it failed.
func WriteFile(d Dir, name string, data []byte, perm fs.FileMode) error {
	if !ValidName(name) {
		return &fs.PathError{Op: "write", Path: name, Err: fs.ErrInvalid}
	}
	tmp := name + TempSuffix
	if err := d.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := d.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	n, err := f.WriteAt(data, 0)
	if err == nil && n < len(data) {
		err = &fs.PathError{Op: "write", Path: f.Name(), Err: io.ErrShortWrite}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = d.Rename(tmp, name)
	}
	if err != nil {
		d.Remove(tmp) // best effort: the next WriteFile removes it otherwise
		return err
	}
	return d.Sync()
}
