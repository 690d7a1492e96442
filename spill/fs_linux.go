//go:build linux && !spill_osroot

package spill

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"
)

// osFS works on directory descriptors with openat(2), mkdirat(2), unlinkat(2) and fstat(2):
// every name is resolved in its directory without following a symbolic link (O_NOFOLLOW; mkdirat
// and unlinkat never follow one), and what a Store checks is the descriptor it opened.
type osFS struct{}

func (osFS) OpenDir(path string) (Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, err
	}
	fd, err := retry(func() (int, error) {
		return syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &osDir{fd: fd, path: path}, nil
}

type osDir struct {
	fd   int
	path string // for messages only
}

// openat opens name in d with O_NOFOLLOW and O_CLOEXEC added to flag.
func (d *osDir) openat(name string, flag int, perm uint32) (int, error) {
	if !validName(name) {
		return -1, &fs.PathError{Op: "openat", Path: d.join(name), Err: fs.ErrInvalid}
	}
	fd, err := retry(func() (int, error) {
		return syscall.Openat(d.fd, name, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
	})
	if err != nil {
		return -1, &fs.PathError{Op: "openat", Path: d.join(name), Err: err}
	}
	return fd, nil
}

func (d *osDir) join(name string) string { return filepath.Join(d.path, name) }

func (d *osDir) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	fd, err := d.openat(name, flag, uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	return &rawFile{fd: fd, dir: d, name: name}, nil
}

func (d *osDir) Lock(name string, create bool) (LockFile, error) {
	// O_NONBLOCK: opening a FIFO must not wait for a writer.
	flag := syscall.O_RDWR | syscall.O_NONBLOCK
	if create {
		flag |= syscall.O_CREAT | syscall.O_EXCL
	}
	fd, err := d.openat(name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = retry(func() (int, error) { return 0, syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB) })
	if err != nil {
		syscall.Close(fd)
		if err == syscall.EWOULDBLOCK {
			return nil, fmt.Errorf("%w: %s", ErrLocked, d.join(name))
		}
		return nil, &fs.PathError{Op: "flock", Path: d.join(name), Err: err}
	}
	return &lockFile{fd: fd, name: d.join(name)}, nil
}

func (d *osDir) Mkdir(name string, perm fs.FileMode) error {
	if !validName(name) {
		return &fs.PathError{Op: "mkdirat", Path: d.join(name), Err: fs.ErrInvalid}
	}
	_, err := retry(func() (int, error) { return 0, syscall.Mkdirat(d.fd, name, uint32(perm.Perm())) })
	if err != nil {
		return &fs.PathError{Op: "mkdirat", Path: d.join(name), Err: err}
	}
	return nil
}

func (d *osDir) OpenDir(name string) (Dir, error) {
	fd, err := d.openat(name, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return &osDir{fd: fd, path: d.join(name)}, nil
}

func (d *osDir) Remove(name string) error { return d.unlinkat("unlinkat", name, 0) }

func (d *osDir) RemoveDir(name string) error { return d.unlinkat("rmdirat", name, atRemoveDir) }

// atRemoveDir is AT_REMOVEDIR, which package syscall does not export (its Unlinkat has no flags).
const atRemoveDir = 0x200

func (d *osDir) unlinkat(op, name string, flags int) error {
	if !validName(name) {
		return &fs.PathError{Op: op, Path: d.join(name), Err: fs.ErrInvalid}
	}
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return &fs.PathError{Op: op, Path: d.join(name), Err: err}
	}
	_, err = retry(func() (int, error) {
		_, _, errno := syscall.Syscall(syscall.SYS_UNLINKAT, uintptr(d.fd), uintptr(unsafe.Pointer(p)), uintptr(flags))
		if errno != 0 {
			return 0, errno
		}
		return 0, nil
	})
	if err != nil {
		return &fs.PathError{Op: op, Path: d.join(name), Err: err}
	}
	return nil
}

func (d *osDir) Rename(oldname, newname string) error {
	if !validName(oldname) || !validName(newname) {
		return &os.LinkError{Op: "renameat", Old: d.join(oldname), New: d.join(newname), Err: fs.ErrInvalid}
	}
	_, err := retry(func() (int, error) { return 0, syscall.Renameat(d.fd, oldname, d.fd, newname) })
	if err != nil {
		return &os.LinkError{Op: "renameat", Old: d.join(oldname), New: d.join(newname), Err: err}
	}
	return nil
}

func (d *osDir) ReadDir() ([]string, error) {
	// A descriptor of its own (not a dup of d.fd, which would share the read offset).
	fd, err := retry(func() (int, error) {
		return syscall.Openat(d.fd, ".", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, &fs.PathError{Op: "openat", Path: d.path, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	return f.Readdirnames(-1)
}

func (d *osDir) Stat() (Info, error) { return fstat(d.fd, d.path) }

func (d *osDir) Close() error { return closeFD(&d.fd, d.path) }

type lockFile struct {
	fd   int
	name string
}

func (l *lockFile) Stat() (Info, error) { return fstat(l.fd, l.name) }
func (l *lockFile) Close() error        { return closeFD(&l.fd, l.name) } // releases the flock

func fstat(fd int, name string) (Info, error) {
	var st syscall.Stat_t
	if _, err := retry(func() (int, error) { return 0, syscall.Fstat(fd, &st) }); err != nil {
		return Info{}, &fs.PathError{Op: "fstat", Path: name, Err: err}
	}
	return Info{
		Mode:  fileMode(st.Mode),
		UID:   int(st.Uid),
		Nlink: uint64(st.Nlink),
		Dev:   uint64(st.Dev),
		Ino:   uint64(st.Ino),
	}, nil
}

// fileMode converts st_mode to an fs.FileMode.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFDIR:
		mode |= fs.ModeDir
	case syscall.S_IFLNK:
		mode |= fs.ModeSymlink
	case syscall.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		mode |= fs.ModeSocket
	case syscall.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		mode |= fs.ModeDevice
	default:
		mode |= fs.ModeIrregular
	}
	if m&syscall.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// retry calls f until it does not fail with EINTR.
func retry(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != syscall.EINTR {
			return n, err
		}
	}
}

// closeFD closes *fd once; the second call returns an error matching os.ErrClosed.
func closeFD(fd *int, name string) error {
	if *fd < 0 {
		return &fs.PathError{Op: "close", Path: name, Err: os.ErrClosed}
	}
	err := syscall.Close(*fd) // never retried on EINTR: the descriptor is gone either way
	*fd = -1
	if err != nil {
		return &fs.PathError{Op: "close", Path: name, Err: err}
	}
	return nil
}

// rawFile is a log file worked with plain system calls. An *os.File would register every file
// with the runtime poller and set its flags with fcntl, which costs more than the I/O of a small
// log and buys nothing for regular files.
type rawFile struct {
	fd   int
	dir  *osDir
	name string // in dir
}

// path returns the file's path, for errors (built only then: opening files is a hot path).
func (f *rawFile) path() string { return f.dir.join(f.name) }

func (f *rawFile) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := syscall.Pread(f.fd, p[n:], off+int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, &fs.PathError{Op: "read", Path: f.path(), Err: err}
		}
		if m == 0 {
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

func (f *rawFile) WriteAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := syscall.Pwrite(f.fd, p[n:], off+int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, &fs.PathError{Op: "write", Path: f.path(), Err: err}
		}
		if m == 0 {
			return n, &fs.PathError{Op: "write", Path: f.path(), Err: io.ErrShortWrite}
		}
		n += m
	}
	return n, nil
}

func (f *rawFile) Truncate(size int64) error {
	if _, err := retry(func() (int, error) { return 0, syscall.Ftruncate(f.fd, size) }); err != nil {
		return &fs.PathError{Op: "truncate", Path: f.path(), Err: err}
	}
	return nil
}

func (f *rawFile) Sync() error {
	if _, err := retry(func() (int, error) { return 0, syscall.Fsync(f.fd) }); err != nil {
		return &fs.PathError{Op: "sync", Path: f.path(), Err: err}
	}
	return nil
}

func (f *rawFile) Close() error {
	if f.fd < 0 {
		return &fs.PathError{Op: "close", Path: f.path(), Err: os.ErrClosed}
	}
	err := syscall.Close(f.fd) // never retried on EINTR: the descriptor is gone either way
	f.fd = -1
	if err != nil {
		return &fs.PathError{Op: "close", Path: f.path(), Err: err}
	}
	return nil
}
