//go:build !unix

package reorderbuffer

import "time"

// cpuTime is not measured here: cpu-ns/change reads 0.
func cpuTime() time.Duration { return 0 }
