package copycodec

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
)

// benchMessages returns n rows of COPY data in the text or binary format, as the server sends
// them: one CopyData message per row (the binary header comes with the first row, the trailer
// alone). Each row is an int4, a short text, a text with characters to escape, a NULL and a
// 100-byte text.
func benchMessages(bin bool, n int) (msgs [][]byte, size int) {
	pad := string(bytes.Repeat([]byte{'x'}, 100))
	for i := range n {
		var m []byte
		if bin {
			row := binaryCopy([][]*string{{str(fmt.Sprint(i)), str("account"), str("tab\there\\"), nil, str(pad)}}, false)
			if i > 0 {
				row = row[19:]
			}
			m = row
		} else {
			m = fmt.Appendf(nil, "%d\taccount\ttab\\there\\\\\t\\N\t%s\n", i, pad)
		}
		msgs = append(msgs, m)
		size += len(m)
	}
	if bin {
		msgs = append(msgs, []byte{0xff, 0xff})
		size += 2
	}
	return msgs, size
}

// BenchmarkParse parses COPY data as the server sends it: the cost per row of turning COPY
// output into tuples, before any decoding of values.
func BenchmarkParse(b *testing.B) {
	for _, bin := range []bool{false, true} {
		b.Run(map[bool]string{false: "text", true: "binary"}[bin], func(b *testing.B) {
			const n = 10000
			msgs, size := benchMessages(bin, n)
			kinds := bytes.Repeat([]byte{decoding.ColumnText}, 5)
			if bin {
				kinds = bytes.Repeat([]byte{decoding.ColumnBinary}, 5)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				rows := 0
				r := NewRowReader(bin, kinds, func(decoding.Tuple) error { rows++; return nil })
				for _, m := range msgs {
					if _, err := r.Write(m); err != nil {
						b.Fatal(err)
					}
				}
				if err := r.Finish(); err != nil || rows != n {
					b.Fatalf("%d rows, %v", rows, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
		})
	}
}
