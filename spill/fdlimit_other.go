//go:build !unix

package spill

// fileLimit reports that the platform has no RLIMIT_NOFILE.
func fileLimit() (uint64, bool) { return 0, false }
