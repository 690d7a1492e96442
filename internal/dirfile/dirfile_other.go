//go:build !linux

package dirfile

import (
	"io/fs"
	"os"
)

// rootDir is an os.Root, which keeps every name inside the directory but follows a symbolic link
// that stays inside it: each method first refuses a name that is a link.
type rootDir struct {
	r *os.Root
	f *os.File // for Sync
}

func openDir(path string) (dir, error) {
	r, err := os.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	f, err := r.Open(".")
	if err != nil {
		r.Close()
		return nil, err
	}
	return rootDir{r: r, f: f}, nil
}

func (rd rootDir) openFile(d *Dir, name string, flag int, perm fs.FileMode) (*os.File, error) {
	if fi, err := rd.r.Lstat(name); err == nil {
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return nil, &fs.PathError{Op: "open", Path: d.Join(name), Err: ErrSymlink}
		case !fi.Mode().IsRegular():
			return nil, &fs.PathError{Op: "open", Path: d.Join(name), Err: ErrNotRegular}
		}
	}
	f, err := rd.r.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = &fs.PathError{Op: "open", Path: d.Join(name), Err: ErrNotRegular}
		}
		return nil, err
	}
	return f, nil
}

func (rd rootDir) rename(d *Dir, oldname, newname string) error { return rd.r.Rename(oldname, newname) }

func (rd rootDir) remove(d *Dir, name string) error {
	fi, err := rd.r.Lstat(name)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return &fs.PathError{Op: "remove", Path: d.Join(name), Err: fs.ErrInvalid}
	}
	return rd.r.Remove(name)
}

func (rd rootDir) sync() error { return rd.f.Sync() }

func (rd rootDir) close() error {
	ferr := rd.f.Close()
	if err := rd.r.Close(); err != nil {
		return err
	}
	return ferr
}

func owner(fi fs.FileInfo) (uid int, nlink uint64, ok bool) { return ownerOf(fi) }
