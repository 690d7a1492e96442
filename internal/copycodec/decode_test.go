package copycodec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

// parsed is what a RowReader made of some data: the rows (NULL as nil, values copied) and the
// error, if any.
type parsed struct {
	rows [][]*string
	err  error
}

// parseAll feeds data to a reader of ncols columns in pieces cut at cuts (offsets into data)
// and finishes it.
func parseAll(bin bool, ncols int, data []byte, cuts ...int) parsed {
	kinds := bytes.Repeat([]byte{decoding.ColumnText}, ncols)
	if bin {
		kinds = bytes.Repeat([]byte{decoding.ColumnBinary}, ncols)
	}
	var out parsed
	r := NewRowReader(bin, kinds, func(t decoding.Tuple) error {
		row := make([]*string, len(t))
		for i, c := range t {
			if c.Kind == decoding.ColumnNull {
				continue
			}
			if c.Kind != kinds[i] {
				return fmt.Errorf("column %d of kind %c", i, c.Kind)
			}
			s := string(c.Data)
			row[i] = &s
		}
		out.rows = append(out.rows, row)
		return nil
	})
	prev := 0
	for _, cut := range append(cuts, len(data)) {
		cut = min(max(cut, prev), len(data))
		if _, err := r.Write(data[prev:cut]); err != nil {
			out.err = err
			return out
		}
		prev = cut
	}
	out.err = r.Finish()
	return out
}

func str(s string) *string { return &s }

func show(rows [][]*string) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString("[")
		for i, v := range r {
			if i > 0 {
				b.WriteString(" ")
			}
			if v == nil {
				b.WriteString("NULL")
			} else {
				fmt.Fprintf(&b, "%q", *v)
			}
		}
		b.WriteString("]")
	}
	return b.String()
}

func TestTextFormat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ncols int
		data  string
		want  [][]*string
		err   string
	}{
		{"empty", 2, "", nil, ""},
		{"values", 3, "1\tab\tc d\n2\t\t\\N\n", [][]*string{{str("1"), str("ab"), str("c d")}, {str("2"), str(""), nil}}, ""},
		{"escapes", 1, `a\tb\nc\\d\re\bf\fg\vh` + "\n", [][]*string{{str("a\tb\nc\\d\re\bf\fg\vh")}}, ""},
		{"octal and hex", 1, `\101\0\7\1234\x41\x4a4\xg\q` + "\n", [][]*string{{str("A\x00\x07S4AJ4xgq")}}, ""},
		{"backslash N is not NULL inside", 1, `\\N` + "\n", [][]*string{{str(`\N`)}}, ""},
		{"escaped before raw", 3, `a\tb` + "\tplain\t" + `x\\` + "\n", [][]*string{{str("a\tb"), str("plain"), str(`x\`)}}, ""},
		{"zero columns", 0, "\n\n", [][]*string{{}, {}}, ""},
		{"too many", 1, "a\tb\n", nil, "more than 1 values"},
		{"too few", 3, "a\tb\n", nil, "2 values, want 3"},
		{"lone backslash", 1, "a\\\n", nil, "lone backslash"},
		{"NULL inside", 1, `a\N` + "\n", nil, `\N inside a value`},
		{"unterminated", 1, "abc", nil, "data ends inside a row"},
		{"zero columns but values", 0, "a\n", nil, "more than 0 values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseAll(false, tc.ncols, []byte(tc.data))
			checkParsed(t, got, tc.want, tc.err)
			for cut := range len(tc.data) {
				if split := parseAll(false, tc.ncols, []byte(tc.data), cut); !sameParse(split, got) {
					t.Fatalf("cut at %d: %s %v, whole: %s %v", cut, show(split.rows), split.err, show(got.rows), got.err)
				}
			}
		})
	}
}

func checkParsed(t *testing.T, got parsed, want [][]*string, wantErr string) {
	t.Helper()
	if wantErr != "" {
		var fe *FormatError
		if !errors.As(got.err, &fe) || !strings.Contains(got.err.Error(), wantErr) {
			t.Fatalf("error %v, want a *FormatError with %q", got.err, wantErr)
		}
		return
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	if !reflect.DeepEqual(got.rows, want) && !(len(got.rows) == 0 && len(want) == 0) {
		t.Fatalf("got %s, want %s", show(got.rows), show(want))
	}
}

// sameParse reports whether two parses of the same data agree: the same rows and both or
// neither failing. (A failure may come one row later when the data is cut inside the bad row.)
func sameParse(a, b parsed) bool {
	if (a.err == nil) != (b.err == nil) {
		return false
	}
	if a.err != nil {
		return true
	}
	return show(a.rows) == show(b.rows)
}

// binaryCopy encodes rows in the binary COPY format.
func binaryCopy(rows [][]*string, trailer bool) []byte {
	b := []byte(binarySignature)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, 0)
	for _, r := range rows {
		b = binary.BigEndian.AppendUint16(b, uint16(len(r)))
		for _, v := range r {
			if v == nil {
				b = binary.BigEndian.AppendUint32(b, 0xffffffff)
				continue
			}
			b = binary.BigEndian.AppendUint32(b, uint32(len(*v)))
			b = append(b, *v...)
		}
	}
	if trailer {
		b = binary.BigEndian.AppendUint16(b, 0xffff)
	}
	return b
}

func TestBinaryFormat(t *testing.T) {
	rows := [][]*string{{str("\x00\x00\x00\x01"), nil, str("")}, {str("abc"), str("\xff\n\t"), nil}}
	header := func(flags, ext uint32, extData string) []byte {
		b := []byte(binarySignature)
		b = binary.BigEndian.AppendUint32(b, flags)
		b = binary.BigEndian.AppendUint32(b, ext)
		return append(b, extData...)
	}
	full := binaryCopy(rows, true)
	for _, tc := range []struct {
		name  string
		ncols int
		data  []byte
		want  [][]*string
		err   string
	}{
		{"rows", 3, full, rows, ""},
		{"no rows", 3, binaryCopy(nil, true), nil, ""},
		{"header extension and non-critical flag", 3,
			append(header(1<<20, 3, "xyz"), full[19:]...), rows, ""},
		{"bad signature", 3, append([]byte("PGCOPY\n\xfe\r\n\x00"), full[11:]...), nil, "bad signature"},
		{"short bad signature", 3, []byte("PGX"), nil, "bad signature"},
		{"oids", 3, append(header(1<<16, 0, ""), full[19:]...), nil, "rows carry OIDs"},
		{"critical flag", 3, append(header(1, 0, ""), full[19:]...), nil, "unknown critical flags"},
		{"wrong count", 2, full, nil, "3 values, want 2"},
		{"negative length", 1, append(header(0, 0, ""), 0, 1, 0xff, 0xff, 0xff, 0xfe), nil, "has length -2"},
		{"no trailer", 3, binaryCopy(rows, false), nil, "without its trailer"},
		{"after trailer", 3, append(binaryCopy(rows, true), 0), nil, "after the trailer"},
		{"truncated row", 3, full[:len(full)-6], nil, "data ends inside a row"},
		{"empty", 3, nil, nil, "without its trailer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseAll(true, tc.ncols, tc.data)
			checkParsed(t, got, tc.want, tc.err)
			for cut := range len(tc.data) {
				if split := parseAll(true, tc.ncols, tc.data, cut); !sameParse(split, got) {
					t.Fatalf("cut at %d: %s %v, whole: %s %v", cut, show(split.rows), split.err, show(got.rows), got.err)
				}
			}
		})
	}
}

// escapeText escapes v for the text format, choosing among equivalent escapes at random.
func escapeText(rng *rand.Rand, v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\t' || c == '\n' || c == '\r' || rng.IntN(8) == 0:
			switch rng.IntN(3) {
			case 0:
				fmt.Fprintf(&b, `\%03o`, c)
			case 1:
				fmt.Fprintf(&b, `\x%02x`, c)
			default:
				if e, ok := map[byte]string{'\t': `\t`, '\n': `\n`, '\r': `\r`, '\b': `\b`, '\f': `\f`, '\v': `\v`}[c]; ok {
					b.WriteString(e)
				} else {
					fmt.Fprintf(&b, `\%03o`, c)
				}
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// TestRoundTrip: random rows, encoded in both formats (with randomly chosen escapes) and cut in
// random pieces, parse back to themselves.
func TestRoundTrip(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	alphabet := "ab\\\t\n\r\x00\x08\xffN\"' é"
	for iter := range 300 {
		ncols := rng.IntN(5)
		var rows [][]*string
		for range rng.IntN(6) {
			row := make([]*string, ncols)
			for i := range row {
				if rng.IntN(5) == 0 {
					continue
				}
				var b []byte
				for range rng.IntN(12) {
					b = append(b, alphabet[rng.IntN(len(alphabet))])
				}
				row[i] = str(string(b))
			}
			rows = append(rows, row)
		}
		var text bytes.Buffer
		for _, r := range rows {
			for i, v := range r {
				if i > 0 {
					text.WriteByte('\t')
				}
				if v == nil {
					text.WriteString(`\N`)
				} else {
					text.WriteString(escapeText(rng, *v))
				}
			}
			text.WriteByte('\n')
		}
		for _, tc := range []struct {
			bin  bool
			data []byte
		}{{false, text.Bytes()}, {true, binaryCopy(rows, true)}} {
			var cuts []int
			for range rng.IntN(4) {
				cuts = append(cuts, rng.IntN(len(tc.data)+1))
			}
			cuts = sortedInts(cuts)
			got := parseAll(tc.bin, ncols, tc.data, cuts...)
			if got.err != nil || show(got.rows) != show(rows) {
				t.Fatalf("iteration %d, binary %t, cuts %v:\ndata %q\ngot  %s %v\nwant %s", iter, tc.bin, cuts, tc.data,
					show(got.rows), got.err, show(rows))
			}
		}
	}
}

func sortedInts(v []int) []int {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
	return v
}

// TestEmitError: an error from the consumer of the rows stops the parse and is returned as it
// is.
func TestEmitError(t *testing.T) {
	stop := errors.New("stop")
	n := 0
	r := NewRowReader(false, []byte{decoding.ColumnText}, func(decoding.Tuple) error {
		n++
		return stop
	})
	if _, err := r.Write([]byte("a\nb\n")); err != stop {
		t.Fatalf("Write = %v, want the emit error", err)
	}
	if n != 1 {
		t.Fatalf("%d rows emitted after the error", n)
	}
}
