//go:build linux

package dirfile

import (
	"io/fs"
	"os"
	"syscall"
)

// fdDir is a directory descriptor.
type fdDir struct{ f *os.File }

func openDir(path string) (dir, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.IsDir() {
		f.Close()
		if err == nil {
			err = &fs.PathError{Op: "open", Path: path, Err: syscall.ENOTDIR}
		}
		return nil, err
	}
	return fdDir{f}, nil
}

func (fd fdDir) fd() int { return int(fd.f.Fd()) }

func (fd fdDir) openFile(d *Dir, name string, flag int, perm fs.FileMode) (*os.File, error) {
	var n int
	var err error
	for {
		// O_NONBLOCK: opening a FIFO planted under the name must not wait for a writer.
		n, err = syscall.Openat(fd.fd(), name, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, uint32(perm.Perm()))
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		// O_NOFOLLOW fails with ELOOP on a link, and with O_CREAT the kernel may refuse it
		// earlier (EACCES): say which it was. (The open failed either way; the path is looked at
		// again for the message only.)
		if fi, lerr := os.Lstat(d.Join(name)); err == syscall.ELOOP || lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return nil, &fs.PathError{Op: "open", Path: d.Join(name), Err: ErrSymlink}
		}
		return nil, &fs.PathError{Op: "open", Path: d.Join(name), Err: err}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(n, &st); err != nil {
		syscall.Close(n)
		return nil, &fs.PathError{Op: "fstat", Path: d.Join(name), Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(n)
		return nil, &fs.PathError{Op: "open", Path: d.Join(name), Err: ErrNotRegular}
	}
	if err := syscall.SetNonblock(n, false); err != nil {
		syscall.Close(n)
		return nil, &fs.PathError{Op: "fcntl", Path: d.Join(name), Err: err}
	}
	return os.NewFile(uintptr(n), d.Join(name)), nil
}

func (fd fdDir) rename(d *Dir, oldname, newname string) error {
	if err := syscall.Renameat(fd.fd(), oldname, fd.fd(), newname); err != nil {
		return &os.LinkError{Op: "renameat", Old: d.Join(oldname), New: d.Join(newname), Err: err}
	}
	return nil
}

func (fd fdDir) remove(d *Dir, name string) error {
	// syscall.Unlinkat takes no flags: it removes a non-directory, a symbolic link itself.
	if err := syscall.Unlinkat(fd.fd(), name); err != nil {
		return &fs.PathError{Op: "unlinkat", Path: d.Join(name), Err: err}
	}
	return nil
}

func (fd fdDir) sync() error  { return fd.f.Sync() }
func (fd fdDir) close() error { return fd.f.Close() }

func owner(fi fs.FileInfo) (uid int, nlink uint64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(st.Uid), uint64(st.Nlink), true
}
