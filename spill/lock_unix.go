//go:build unix

package spill

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// lockFile takes flock(LOCK_EX|LOCK_NB) on name. After locking it checks that name still refers
// to the locked inode: a concurrent cleaner may have removed the file between open and flock, and
// a lock on an unlinked file protects nothing.
func lockFile(name string) (io.Closer, error) {
	for range 100 {
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: %s", ErrLocked, name)
			}
			return nil, &os.PathError{Op: "flock", Path: name, Err: err}
		}
		fi, err1 := f.Stat()
		pi, err2 := os.Stat(name)
		if err1 == nil && err2 == nil && os.SameFile(fi, pi) {
			return f, nil // closing f releases the lock
		}
		f.Close()
		if err1 != nil {
			return nil, err1
		}
		// name was removed or replaced after we opened it: try again.
	}
	return nil, fmt.Errorf("%w: %s keeps changing", ErrLocked, name)
}
