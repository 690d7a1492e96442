//go:build unix

package spill

import (
	"io"
	"io/fs"
	"os"
	"syscall"
)

// openFile opens a log file with plain system calls. An *os.File would register every file with
// the runtime poller and set its flags with fcntl, which costs more than the I/O of a small log and
// buys nothing for regular files.
func openFile(name string, flag int, perm fs.FileMode) (File, error) {
	for {
		fd, err := syscall.Open(name, flag|syscall.O_CLOEXEC, uint32(perm.Perm()))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
		return &rawFile{fd: fd, name: name}, nil
	}
}

type rawFile struct {
	fd   int
	name string
}

func (f *rawFile) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := syscall.Pread(f.fd, p[n:], off+int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "read", Path: f.name, Err: err}
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
			return n, &os.PathError{Op: "write", Path: f.name, Err: err}
		}
		if m == 0 {
			return n, &os.PathError{Op: "write", Path: f.name, Err: io.ErrShortWrite}
		}
		n += m
	}
	return n, nil
}

func (f *rawFile) Truncate(size int64) error {
	for {
		err := syscall.Ftruncate(f.fd, size)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "truncate", Path: f.name, Err: err}
		}
		return nil
	}
}

func (f *rawFile) Sync() error {
	for {
		err := syscall.Fsync(f.fd)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "sync", Path: f.name, Err: err}
		}
		return nil
	}
}

func (f *rawFile) Close() error {
	if f.fd < 0 {
		return &os.PathError{Op: "close", Path: f.name, Err: os.ErrClosed}
	}
	err := syscall.Close(f.fd) // never retried on EINTR: the descriptor is gone either way
	f.fd = -1
	if err != nil {
		return &os.PathError{Op: "close", Path: f.name, Err: err}
	}
	return nil
}
