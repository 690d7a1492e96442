package bench_test

import (
	"fmt"
	"os"

	"github.com/pgreorder/pgreorder/bench"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Example feeds a generated workload, 10,000 rows of which 30% are rolled back to a savepoint
// (the last 408 never reach the client: the server drops them before streaming them),
// to a reorder buffer limited to 64kB, and counts the rows it hands out.
func Example() {
	wl := bench.RollbackToSavepoint(10_000, 30, 64<<10, 1)
	dir, _ := os.MkdirTemp("", "bench-example")
	defer os.RemoveAll(dir)
	buf, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: 64 << 10, Dir: dir, Decoding: bench.Options})
	if err != nil {
		panic(err)
	}
	defer buf.Close()
	rows := 0
	for lsn, data := range wl.Messages() { // data is reused: Add copies what it keeps
		if err := buf.Add(lsn, data); err != nil {
			panic(err)
		}
		for t, ok := buf.Next(); ok; t, ok = buf.Next() {
			for c, err := range t.Changes() {
				if err != nil {
					panic(err)
				}
				if _, ok := c.Msg.(*decoding.Insert); ok {
					rows++
				}
			}
			buf.Ack(t)
		}
	}
	fmt.Printf("received %d changes, handed out %d rows, spilled: %v\n", wl.Changes, rows, buf.Stats().SpillBytes > 0)
	// Output: received 9592 changes, handed out 7000 rows, spilled: true
}
