//go:build !linux && !darwin && !dragonfly && !freebsd && !illumos && !netbsd && !openbsd

package vfs

import (
	"errors"
	"os"
)

// haveFlock is false: the platform has no lock, and Dir.Lock fails with errors.ErrUnsupported.
const haveFlock = false

func flock(*os.File) error { return errors.ErrUnsupported }
