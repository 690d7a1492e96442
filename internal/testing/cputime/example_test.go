package cputime_test

import (
	"fmt"

	"github.com/pgreorder/pgreorder/internal/testing/cputime"
)

// A benchmark reads the CPU time before and after its work.
func Example() {
	before := cputime.Process()
	sum := 0
	for i := range 1_000_000 {
		sum += i
	}
	fmt.Println(sum, cputime.Process() >= before)
	// Output: 499999500000 true
}
