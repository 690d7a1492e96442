//go:build unix

package spill

import "syscall"

// fileLimit returns the soft RLIMIT_NOFILE.
func fileLimit() (uint64, bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, false
	}
	return uint64(lim.Cur), true
}
