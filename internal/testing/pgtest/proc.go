package pgtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// RunTime returns the time process pid has spent on a CPU so far, to the nanosecond, from
// /proc/PID/schedstat (Linux only): a server backend's or walsender's CPU time, which a
// benchmark reads before and after what it measures. For a multi-threaded process it is the
// main thread's.
func RunTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data))
	if len(f) < 1 {
		return 0, fmt.Errorf("/proc/%d/schedstat: empty", pid)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/schedstat: %w", pid, err)
	}
	return time.Duration(ns), nil
}
