package format

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzStr: the JSON strings the encoder writes, also when flushed in pieces, decode to what
// encoding/json's decode to (invalid UTF-8 replaced), or, escaped, to EscapeName's text.
func FuzzStr(f *testing.F) {
	for _, s := range []string{"", "plain", "a\"b\\c", "\x00\x1f\n\r\t", "<>&", "\u2028\u2029", "é€😀", "\xff\xfe", "a\xc3",
		strings.Repeat("é", flushAt)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, mode := range []int{invalidReplace, invalidEscape} {
			var out bytes.Buffer
			e := encoder{w: &out}
			e.str(s, mode)
			e.flush()
			if e.err != nil {
				t.Fatal(e.err)
			}
			if !json.Valid(out.Bytes()) || !utf8.Valid(out.Bytes()) {
				t.Fatalf("%q -> %s", s, out.Bytes())
			}
			var got string
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if mode == invalidEscape {
				if want := EscapeName(s); got != want {
					t.Fatalf("%q: escaped %q, EscapeName %q", s, got, want)
				}
				continue
			}
			theirs, _ := json.Marshal(s)
			var want string
			json.Unmarshal(theirs, &want)
			if got != want {
				t.Fatalf("%q: %q, encoding/json %q", s, got, want)
			}
		}
	})
}
