package target

import (
	"slices"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
)

// TestLSNs: a pg_lsn array written by AppendLSNs reads back as it was.
func TestLSNs(t *testing.T) {
	for _, lsns := range [][]decoding.LSN{nil, {0x16B3748}, {0x16B3748, 0x16B3800, 1<<32 | 0x10, 1<<40 | 0xffff}} {
		text := string(AppendLSNs(nil, lsns))
		got, err := ParseLSNs(text)
		if err != nil || !slices.Equal(got, lsns) {
			t.Fatalf("%q: ParseLSNs = %v, %v; want %v", text, got, err, lsns)
		}
	}
	if _, err := ParseLSNs("{0/1,x}"); err == nil {
		t.Fatal("ParseLSNs read a bad position")
	}
}
