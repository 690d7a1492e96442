//go:build linux && !vfs_osroot

package vfs

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"
)

// osFS works on directory descriptors with openat(2), mkdirat(2), unlinkat(2), renameat(2) and
// fstat(2): every name is resolved in its directory without following a symbolic link
// (O_NOFOLLOW; mkdirat, unlinkat and renameat never follow one), and what a caller checks is the
// descriptor it opened.
type osFS struct{}

func (osFS) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }

func (osFS) OpenDir(path string) (Dir, error) {
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

// openat opens name in d with O_NOFOLLOW and O_CLOEXEC added to flag. Its error wraps
// ErrSymlink if name is a symbolic link.
func (d *osDir) openat(name string, flag int, perm uint32) (int, error) {
	if !ValidName(name) {
		return -1, &fs.PathError{Op: "openat", Path: d.join(name), Err: fs.ErrInvalid}
	}
	fd, err := retry(func() (int, error) {
		return syscall.Openat(d.fd, name, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
	})
	if err != nil {
		// O_NOFOLLOW fails with ELOOP on a link; with O_CREAT the kernel may refuse one earlier
		// (EACCES, protected_symlinks and its relatives): say which it was. The open failed either
		// way; the name is looked at again for the message only.
		switch {
		case err == syscall.ELOOP || (err == syscall.EACCES || err == syscall.EPERM) && d.isSymlink(name):
			err = ErrSymlink
		case err == syscall.ENXIO: // a FIFO without a reader, a socket, a device without its driver
			err = ErrNotRegular
		}
		return -1, &fs.PathError{Op: "openat", Path: d.join(name), Err: err}
	}
	return fd, nil
}

// isSymlink reports whether name is a symbolic link, for messages.
func (d *osDir) isSymlink(name string) bool {
	info, err := d.Lstat(name)
	return err == nil && info.Mode&fs.ModeSymlink != 0
}

// oPath is O_PATH, which package syscall does not export everywhere; it has this value on every
// architecture Go supports.
const oPath = 0x200000

func (d *osDir) Lstat(name string) (Info, error) {
	if !ValidName(name) {
		return Info{}, &fs.PathError{Op: "lstat", Path: d.join(name), Err: fs.ErrInvalid}
	}
	// An O_PATH descriptor of the name itself (O_NOFOLLOW: of a link, not of its target), which
	// opens nothing and so cannot block on a FIFO: fstatat(2) has no portable number in package
	// syscall.
	fd, err := retry(func() (int, error) {
		return syscall.Openat(d.fd, name, oPath|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	})
	if err != nil {
		return Info{}, &fs.PathError{Op: "lstat", Path: d.join(name), Err: err}
	}
	defer syscall.Close(fd)
	return fstat(fd, d.join(name))
}

func (d *osDir) join(name string) string { return filepath.Join(d.path, name) }

func (d *osDir) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	// Opening a FIFO for reading or writing alone waits for the other end: O_NONBLOCK, taken off
	// again below. (For reading and writing it does not wait, and O_RDWR, the spill logs' hot path,
	// needs no second system call.)
	nonblock := flag&(syscall.O_RDONLY|syscall.O_WRONLY|syscall.O_RDWR) != syscall.O_RDWR
	if nonblock {
		flag |= syscall.O_NONBLOCK
	}
	fd, err := d.openat(name, flag, uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := statFD(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		if err == nil {
			err = ErrNotRegular
		}
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	if nonblock {
		if err := syscall.SetNonblock(fd, false); err != nil {
			syscall.Close(fd)
			return nil, &fs.PathError{Op: "fcntl", Path: d.join(name), Err: err}
		}
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
	if !ValidName(name) {
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
	if !ValidName(name) {
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
	if !ValidName(oldname) || !ValidName(newname) {
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

func (d *osDir) Sync() error {
	if _, err := retry(func() (int, error) { return 0, syscall.Fsync(d.fd) }); err != nil {
		return &fs.PathError{Op: "sync", Path: d.path, Err: err}
	}
	return nil
}

func (d *osDir) Close() error { return closeFD(&d.fd, d.path) }

type lockFile struct {
	fd   int
	name string
}

func (l *lockFile) Stat() (Info, error) { return fstat(l.fd, l.name) }
func (l *lockFile) Close() error        { return closeFD(&l.fd, l.name) } // releases the flock

// statFD fstats fd, again after EINTR.
func statFD(fd int, st *syscall.Stat_t) error {
	_, err := retry(func() (int, error) { return 0, syscall.Fstat(fd, st) })
	return err
}

func fstat(fd int, name string) (Info, error) {
	var st syscall.Stat_t
	if err := statFD(fd, &st); err != nil {
		return Info{}, &fs.PathError{Op: "fstat", Path: name, Err: err}
	}
	return Info{
		Mode:  fileMode(st.Mode),
		UID:   int(st.Uid),
		Nlink: uint64(st.Nlink),
		Dev:   uint64(st.Dev),
		Ino:   uint64(st.Ino),
		Size:  st.Size,
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

// rawFile is a file worked with plain system calls. An *os.File would register every file
// with the runtime poller and set its flags with fcntl, which costs more than the I/O of a small
// log and buys nothing for regular files.
type rawFile struct {
	fd   int
	dir  *osDir
	name string // in dir
}

// path returns the file's path, for errors (built only then: opening files is a hot path).
func (f *rawFile) path() string { return f.dir.join(f.name) }

func (f *rawFile) Name() string { return f.path() }

func (f *rawFile) Stat() (Info, error) {
	if f.fd < 0 {
		return Info{}, &fs.PathError{Op: "fstat", Path: f.path(), Err: os.ErrClosed}
	}
	return fstat(f.fd, f.path())
}

func (f *rawFile) ReadAt(p []byte, off int64) (int, error) {
	return f.transfer("read", p, off, syscall.Pread)
}

func (f *rawFile) WriteAt(p []byte, off int64) (int, error) {
	return f.transfer("write", p, off, syscall.Pwrite)
}

// transfer calls pio (pread or pwrite) until all of p is transferred, again after EINTR. A call
// that transfers nothing ends a read with io.EOF (as io.ReaderAt wants it: not wrapped) and a
// write with io.ErrShortWrite.
func (f *rawFile) transfer(op string, p []byte, off int64, pio func(int, []byte, int64) (int, error)) (int, error) {
	n := 0
	for n < len(p) {
		m, err := pio(f.fd, p[n:], off+int64(n))
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return n, &fs.PathError{Op: op, Path: f.path(), Err: err}
		case m == 0 && op == "read":
			return n, io.EOF
		case m == 0:
			return n, &fs.PathError{Op: op, Path: f.path(), Err: io.ErrShortWrite}
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
