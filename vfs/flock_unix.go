//go:build (linux && vfs_osroot) || darwin || dragonfly || freebsd || illumos || netbsd || openbsd

package vfs

import (
	"fmt"
	"os"
	"syscall"
)

const haveFlock = true

// flock takes flock(2) LOCK_EX|LOCK_NB on f.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch err {
		case nil:
			return nil
		case syscall.EINTR:
			continue
		case syscall.EWOULDBLOCK:
			return fmt.Errorf("%w: %s", ErrLocked, f.Name())
		default:
			return &os.PathError{Op: "flock", Path: f.Name(), Err: err}
		}
	}
}
