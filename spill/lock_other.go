//go:build !unix

package spill

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// lockFile without flock: creating the file exclusively stands for holding the lock. A lock file
// left by a dead process therefore looks held forever, so stale stores are never cleaned up on
// these platforms, but a live store is never mistaken for a stale one.
func lockFile(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, name)
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}
