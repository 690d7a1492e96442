package apply

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"testing"
)

// decodeCopyText parses one row of COPY's text format (default delimiter and NULL) as the
// server's CopyReadAttributesText does: the reference the encoder is checked against.
func decodeCopyText(line []byte) ([]field, error) {
	if len(line) == 0 || line[len(line)-1] != '\n' {
		return nil, errors.New("row does not end with a newline")
	}
	line = line[:len(line)-1]
	var fields []field
	for {
		end := bytes.IndexByte(line, '\t')
		raw := line
		if end >= 0 {
			raw = line[:end]
		}
		if string(raw) == `\N` {
			fields = append(fields, field{null: true})
		} else {
			var v []byte
			for i := 0; i < len(raw); i++ {
				c := raw[i]
				switch {
				case c == '\n' || c == '\r':
					return nil, fmt.Errorf("unescaped line break at %d", i)
				case c != '\\':
					v = append(v, c)
					continue
				}
				i++
				if i == len(raw) {
					return nil, errors.New("backslash at the end of a field")
				}
				switch e := raw[i]; e {
				case 'b':
					v = append(v, '\b')
				case 'f':
					v = append(v, '\f')
				case 'n':
					v = append(v, '\n')
				case 'r':
					v = append(v, '\r')
				case 't':
					v = append(v, '\t')
				case 'v':
					v = append(v, '\v')
				case 'x':
					j := i + 1
					for j < len(raw) && j < i+3 && isHex(raw[j]) {
						j++
					}
					if j == i+1 {
						v = append(v, 'x')
						continue
					}
					n, _ := strconv.ParseUint(string(raw[i+1:j]), 16, 8)
					v = append(v, byte(n))
					i = j - 1
				case '0', '1', '2', '3', '4', '5', '6', '7':
					j := i
					for j < len(raw) && j < i+3 && raw[j] >= '0' && raw[j] <= '7' {
						j++
					}
					n, _ := strconv.ParseUint(string(raw[i:j]), 8, 16)
					v = append(v, byte(n))
					i = j - 1
				default:
					v = append(v, e) // \\ and any other character stand for themselves
				}
			}
			fields = append(fields, field{data: v})
		}
		if end < 0 {
			return fields, nil
		}
		line = line[end+1:]
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func TestCopyTextValue(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{`back\slash`, `back\\slash`},
		{"tab\there", `tab\there`},
		{"new\nline", `new\nline`},
		{"cr\rlf\n", `cr\rlf\n`},
		{`\N`, `\\N`},
		{`\.`, `\\.`},
		{"é\x00\x7f", "é\x00\x7f"}, // NUL cannot come from PostgreSQL; passed through like any byte
		{"\\\\\t\t", `\\\\\t\t`},
	} {
		if got := string(appendCopyTextValue(nil, []byte(c.in))); got != c.want {
			t.Errorf("appendCopyTextValue(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestCopyTextRow(t *testing.T) {
	fields := []field{{data: []byte("a\tb")}, {null: true}, {data: []byte{}}, {data: []byte(`\N`)}}
	got := string(appendCopyTextRow(nil, fields))
	if want := "a\\tb\t\\N\t\t\\\\N\n"; got != want {
		t.Fatalf("row = %q, want %q", got, want)
	}
	back, err := decodeCopyText([]byte(got))
	if err != nil {
		t.Fatal(err)
	}
	if !sameFields(back, fields) {
		t.Fatalf("decoded %v, want %v", back, fields)
	}
}

func TestCopyBinaryRow(t *testing.T) {
	fields := []field{{data: []byte{0, 0, 0, 42}}, {null: true}, {data: []byte{}}}
	got := appendCopyBinaryRow(nil, fields)
	want := []byte{0, 3, 0, 0, 0, 4, 0, 0, 0, 42, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}
	if !bytes.Equal(got, want) {
		t.Fatalf("row = % x, want % x", got, want)
	}
	if n := len(copyBinaryHeader); n != 19 {
		t.Fatalf("binary header is %d bytes, want 19 (11 of signature, 4 of flags, 4 of extension length)", n)
	}
	back, err := decodeCopyBinary(got)
	if err != nil {
		t.Fatal(err)
	}
	if !sameFields(back, fields) {
		t.Fatalf("decoded %v, want %v", back, fields)
	}
}

func decodeCopyBinary(b []byte) ([]field, error) {
	if len(b) < 2 {
		return nil, errors.New("short row")
	}
	n := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	var fields []field
	for range n {
		if len(b) < 4 {
			return nil, errors.New("short field length")
		}
		l := int32(binary.BigEndian.Uint32(b))
		b = b[4:]
		if l == -1 {
			fields = append(fields, field{null: true})
			continue
		}
		if int(l) > len(b) || l < 0 {
			return nil, errors.New("short field")
		}
		fields = append(fields, field{data: b[:l]})
		b = b[l:]
	}
	if len(b) != 0 {
		return nil, errors.New("trailing bytes")
	}
	return fields, nil
}

func sameFields(a, b []field) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].null != b[i].null || !bytes.Equal(a[i].data, b[i].data) {
			return false
		}
	}
	return true
}

// FuzzCopyText checks that any values, split into fields at NUL bytes (a NUL-only field is NULL),
// read back from the encoded row as they were.
func FuzzCopyText(f *testing.F) {
	for _, s := range []string{"", "a", "\x00", "a\x00b", `\N`, "\\\t\n\r", "\x00\x00", "é\\x41\\101"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var fields []field
		for part := range bytes.SplitSeq(in, []byte{0}) {
			fields = append(fields, field{data: part, null: len(part) == 1 && part[0] == 1})
		}
		row := appendCopyTextRow(nil, fields)
		back, err := decodeCopyText(row)
		if err != nil {
			t.Fatalf("encoded %q as %q, which does not decode: %v", in, row, err)
		}
		for i := range fields {
			if fields[i].null {
				fields[i].data = nil
			}
		}
		if !sameFields(back, fields) {
			t.Fatalf("encoded %v as %q, decoded as %v", fields, row, back)
		}
		if bytes.Count(row, []byte{'\n'}) != 1 {
			t.Fatalf("row %q has a line break inside", row)
		}
	})
}

func BenchmarkCopyText(b *testing.B) {
	fields := []field{{data: []byte("12345")}, {data: []byte("some text of a usual length\twith a tab")},
		{null: true}, {data: []byte("2024-02-29 12:34:56.789+00")}}
	var buf []byte
	size := len(appendCopyTextRow(nil, fields))
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for b.Loop() {
		buf = appendCopyTextRow(buf[:0], fields)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/row")
}

func BenchmarkCopyBinary(b *testing.B) {
	fields := []field{{data: []byte{0, 0, 48, 57}}, {data: []byte("some text of a usual length\twith a tab")},
		{null: true}, {data: []byte{0, 2, 200, 1, 2, 3, 4, 5}}}
	var buf []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(appendCopyBinaryRow(nil, fields))))
	for b.Loop() {
		buf = appendCopyBinaryRow(buf[:0], fields)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/row")
}
