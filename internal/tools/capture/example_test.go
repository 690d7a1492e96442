package capture_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pgreorder/pgreorder/internal/tools/capture"
)

// Example reads a capture as pg_logical_slot_peek_binary_changes prints it and writes it back.
func Example() {
	in := "# a Begin and a Commit\n0/16B3750\t750\t\\x4200000000016b37a0\n0/16B37A0\t750\t43\n"
	r := capture.NewReader(strings.NewReader(in))
	w := capture.NewWriter(os.Stdout)
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("line %d: %q message of %d bytes at %s\n", r.Line(), rec.Data[0], len(rec.Data), rec.LSN)
		if err := w.Write(rec); err != nil {
			panic(err)
		}
	}
	if err := w.Flush(); err != nil {
		panic(err)
	}
	// Output:
	// line 2: 'B' message of 9 bytes at 0/16B3750
	// line 3: 'C' message of 1 bytes at 0/16B37A0
	// 0/16B3750	750	4200000000016b37a0
	// 0/16B37A0	750	43
}
