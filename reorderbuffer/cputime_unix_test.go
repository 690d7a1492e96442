//go:build unix

package reorderbuffer

import (
	"syscall"
	"time"
)

// cpuTime returns the user and system CPU time this process used so far (every thread).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
