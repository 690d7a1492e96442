// Package cputime gives benchmarks the CPU time their process has used, for metrics such as
// cpu-ns/change that the load of other work on the machine moves less than elapsed time. It is
// test machinery: nothing shipped imports it.
package cputime

import "time"

// Process returns the user and system CPU time this process has used so far, every thread
// counted; 0 where the platform does not tell (then a cpu metric reads 0).
func Process() time.Duration { return process() }
