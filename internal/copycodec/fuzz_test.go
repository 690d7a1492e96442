package copycodec

import (
	"bytes"
	"testing"
)

// fuzzParse checks, for any data, that the parser does not panic, that cutting the data in two
// changes nothing, and that every row it returns has the expected number of columns.
func fuzzParse(t *testing.T, bin bool, data []byte, ncols uint8, cut uint16) {
	n := int(ncols % 8)
	whole := parseAll(bin, n, data)
	for _, r := range whole.rows {
		if len(r) != n {
			t.Fatalf("row of %d columns, want %d", len(r), n)
		}
	}
	split := parseAll(bin, n, data, int(cut)%(len(data)+1))
	if !sameParse(whole, split) {
		t.Fatalf("whole: %s %v; cut at %d: %s %v", show(whole.rows), whole.err, int(cut)%(len(data)+1), show(split.rows), split.err)
	}
}

func FuzzText(f *testing.F) {
	f.Add([]byte("1\tab\t\\N\n2\t\\t\\n\\\\\t\n"), uint8(3), uint16(5))
	f.Add([]byte(`\101\x4a\q`+"\n"), uint8(1), uint16(3))
	f.Add([]byte("\n"), uint8(0), uint16(0))
	f.Add([]byte("a\\"), uint8(1), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, ncols uint8, cut uint16) {
		fuzzParse(t, false, data, ncols, cut)
		// What parses re-encodes (escaping every special byte) to the same rows.
		got := parseAll(false, int(ncols%8), data)
		if got.err != nil {
			return
		}
		var enc bytes.Buffer
		for _, r := range got.rows {
			for i, v := range r {
				if i > 0 {
					enc.WriteByte('\t')
				}
				if v == nil {
					enc.WriteString(`\N`)
					continue
				}
				for _, c := range []byte(*v) {
					switch c {
					case '\\':
						enc.WriteString(`\\`)
					case '\t':
						enc.WriteString(`\t`)
					case '\n':
						enc.WriteString(`\n`)
					default:
						enc.WriteByte(c)
					}
				}
			}
			enc.WriteByte('\n')
		}
		again := parseAll(false, int(ncols%8), enc.Bytes())
		if again.err != nil || show(again.rows) != show(got.rows) {
			t.Fatalf("re-encoded %q parses to %s %v, want %s", enc.Bytes(), show(again.rows), again.err, show(got.rows))
		}
	})
}

func FuzzBinary(f *testing.F) {
	f.Add(binaryCopy([][]*string{{str("\x00\x00\x00\x01"), nil}, {str(""), str("xyz")}}, true), uint8(2), uint16(20))
	f.Add(binaryCopy(nil, true), uint8(1), uint16(0))
	f.Add([]byte(binarySignature), uint8(1), uint16(4))
	f.Fuzz(func(t *testing.T, data []byte, ncols uint8, cut uint16) {
		fuzzParse(t, true, data, ncols, cut)
		// What parses re-encodes to the same bytes (with an empty header extension).
		got := parseAll(true, int(ncols%8), data)
		if got.err != nil {
			return
		}
		if enc := binaryCopy(got.rows, true); len(data) >= 19 && data[15]|data[16]|data[17]|data[18] == 0 &&
			data[11]|data[12]|data[13]|data[14] == 0 && !bytes.Equal(enc, data) {
			t.Fatalf("re-encoded %q, input %q", enc, data)
		}
	})
}
