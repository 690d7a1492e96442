package copycodec

import (
	"bytes"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
)

// decodeRows reads data of ncols columns back with the RowReader, as snapshot reads COPY ... TO
// STDOUT: each row's fields, NULL as Null.
func decodeRows(t *testing.T, bin bool, ncols int, data []byte) ([][]Field, error) {
	t.Helper()
	kind := byte(decoding.ColumnText)
	if bin {
		kind = decoding.ColumnBinary
	}
	var rows [][]Field
	r := NewRowReader(bin, bytes.Repeat([]byte{kind}, ncols), func(tup decoding.Tuple) error {
		row := make([]Field, len(tup))
		for i, c := range tup {
			if c.Kind == decoding.ColumnNull {
				row[i] = Field{Null: true}
				continue
			}
			row[i] = Field{Data: append([]byte{}, c.Data...)}
		}
		rows = append(rows, row)
		return nil
	})
	if _, err := r.Write(data); err != nil {
		return rows, err
	}
	return rows, r.Finish()
}

func sameFields(a, b []Field) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Null != b[i].Null || !a[i].Null && !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}

func TestTextValue(t *testing.T) {
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
		if got := string(AppendTextValue(nil, []byte(c.in))); got != c.want {
			t.Errorf("AppendTextValue(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestTextRow(t *testing.T) {
	fields := []Field{{Data: []byte("a\tb")}, {Null: true}, {Data: []byte{}}, {Data: []byte(`\N`)}}
	got := AppendTextRow(nil, fields)
	if want := "a\\tb\t\\N\t\t\\\\N\n"; string(got) != want {
		t.Fatalf("row = %q, want %q", got, want)
	}
	back, err := decodeRows(t, false, len(fields), got)
	if err != nil || len(back) != 1 || !sameFields(back[0], fields) {
		t.Fatalf("decoded %v (%v), want %v", back, err, fields)
	}
}

func TestBinaryRow(t *testing.T) {
	fields := []Field{{Data: []byte{0, 0, 0, 42}}, {Null: true}, {Data: []byte{}}}
	got := AppendBinaryRow(nil, fields)
	want := []byte{0, 3, 0, 0, 0, 4, 0, 0, 0, 42, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}
	if !bytes.Equal(got, want) {
		t.Fatalf("row = % x, want % x", got, want)
	}
	if n := len(BinaryHeader); n != 19 {
		t.Fatalf("binary header is %d bytes, want 19 (11 of signature, 4 of flags, 4 of extension length)", n)
	}
	data := append(append(append([]byte{}, BinaryHeader...), got...), BinaryTrailer...)
	back, err := decodeRows(t, true, len(fields), data)
	if err != nil || len(back) != 1 || !sameFields(back[0], fields) {
		t.Fatalf("decoded %v (%v), want %v", back, err, fields)
	}
}

// FuzzRoundTrip checks that any values, encoded as COPY data by the encoder, read back as they
// were through the RowReader, in both formats. The input is split into rows at 0xfe bytes and
// into fields at NUL bytes; a field of the one byte 0x01 is NULL. Every row gets as many fields
// as the first.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", "a", "\x00", "a\x00b", `\N`, "\\\t\n\r", "\x00\x00", "é\\x41\\101",
		"\x01\x00x\xfe\x00\x01", "a\xfeb\xfe\\.", "\r\n\xfe\n"} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, in []byte, bin bool) {
		var rows [][]Field
		for line := range bytes.SplitSeq(in, []byte{0xfe}) {
			var row []Field
			for part := range bytes.SplitSeq(line, []byte{0}) {
				if len(part) == 1 && part[0] == 1 {
					row = append(row, Field{Null: true})
				} else {
					row = append(row, Field{Data: part})
				}
			}
			if len(rows) > 0 {
				row = append(row, make([]Field, len(rows[0]))...)[:len(rows[0])]
			}
			rows = append(rows, row)
		}
		ncols := len(rows[0])
		var data []byte
		if bin {
			data = append(data, BinaryHeader...)
		}
		for _, row := range rows {
			if bin {
				data = AppendBinaryRow(data, row)
			} else {
				data = AppendTextRow(data, row)
			}
		}
		if bin {
			data = append(data, BinaryTrailer...)
		} else if n := bytes.Count(data, []byte{'\n'}); n != len(rows) {
			t.Fatalf("%d rows encoded with %d line breaks: %q", len(rows), n, data)
		}
		back, err := decodeRows(t, bin, ncols, data)
		if err != nil {
			t.Fatalf("encoded %v as %q, which does not decode: %v", rows, data, err)
		}
		if len(back) != len(rows) {
			t.Fatalf("encoded %d rows as %q, decoded %d", len(rows), data, len(back))
		}
		for i := range rows {
			if !sameFields(back[i], rows[i]) {
				t.Fatalf("row %d: encoded %v as %q, decoded as %v", i, rows[i], data, back[i])
			}
		}
	})
}

func BenchmarkTextRow(b *testing.B) {
	fields := []Field{{Data: []byte("12345")}, {Data: []byte("some text of a usual length\twith a tab")},
		{Null: true}, {Data: []byte("2024-02-29 12:34:56.789+00")}}
	var buf []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(AppendTextRow(nil, fields))))
	for b.Loop() {
		buf = AppendTextRow(buf[:0], fields)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/row")
}

func BenchmarkBinaryRow(b *testing.B) {
	fields := []Field{{Data: []byte{0, 0, 48, 57}}, {Data: []byte("some text of a usual length\twith a tab")},
		{Null: true}, {Data: []byte{0, 2, 200, 1, 2, 3, 4, 5}}}
	var buf []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(AppendBinaryRow(nil, fields))))
	for b.Loop() {
		buf = AppendBinaryRow(buf[:0], fields)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/row")
}
