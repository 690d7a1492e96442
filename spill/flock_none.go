//go:build !linux && !darwin && !dragonfly && !freebsd && !illumos && !netbsd && !openbsd

package spill

import (
	"errors"
	"os"
)

// haveFlock is false: the platform has no lock a Store can use, so a store is never taken for
// stale, and stale stores are not removed.
const haveFlock = false

func flock(*os.File) error { return errors.ErrUnsupported }
