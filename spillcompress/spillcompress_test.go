package spillcompress_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spillcompress"
)

var codecs = map[string]spill.Compressor{"lz4": spillcompress.LZ4(), "s2": spillcompress.S2(), "zstd": spillcompress.Zstd()}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 5000)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	inputs := map[string][]byte{
		"text":   bytes.Repeat([]byte("I\x00\x00@\x00N\x00\x01t\x00\x00\x00\x0712345678"), 300),
		"random": random,
		"one":    {42},
	}
	for name, c := range codecs {
		for in, src := range inputs {
			prefix := []byte("keep")
			out, err := c.Compress(bytes.Clone(prefix), src)
			if err != nil || len(out)-len(prefix) >= len(src) {
				continue // stored as it is by the spill store
			}
			if !bytes.Equal(out[:len(prefix)], prefix) {
				t.Fatalf("%s/%s: Compress did not append to dst", name, in)
			}
			dst := make([]byte, len(src))
			if err := c.Decompress(dst, out[len(prefix):]); err != nil {
				t.Fatalf("%s/%s: %v", name, in, err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatalf("%s/%s: round trip differs", name, in)
			}
			if in == "text" && len(out)-len(prefix) > len(src)/4 {
				t.Errorf("%s: text compressed to %d of %d bytes", name, len(out)-len(prefix), len(src))
			}
			// Damaged or wrongly sized input is an error, never a panic.
			if err := c.Decompress(make([]byte, len(src)+1), out[len(prefix):]); err == nil {
				t.Errorf("%s/%s: decompressing into a longer buffer succeeded", name, in)
			}
			bad := bytes.Clone(out[len(prefix):])
			for i := range bad {
				bad[i] ^= 0x5a
			}
			_ = c.Decompress(dst, bad)
		}
	}
}

// TestStore spills through a store with each codec.
func TestStore(t *testing.T) {
	for name, c := range codecs {
		s, err := spill.Open(spill.Options{Dir: t.TempDir(), Compressor: c, BufferSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		l, _ := s.Create()
		var want [][]byte
		var raw int64
		for i := range 2000 {
			rec := []byte("insert into test values (" + string(rune('0'+i%10)) + ")")
			want = append(want, rec)
			raw += int64(len(rec)) + 8 // uncompressed: a CRC and a length each
			if err := l.Append(rec); err != nil {
				t.Fatal(err)
			}
		}
		r := l.NewReader()
		for i := 0; ; i++ {
			rec, err := r.Next()
			if err == io.EOF {
				if i != len(want) {
					t.Fatalf("%s: %d records, want %d", name, i, len(want))
				}
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !bytes.Equal(rec, want[i]) {
				t.Fatalf("%s: record %d differs", name, i)
			}
		}
		r.Close()
		if w := s.WrittenBytes(); w > raw/4 {
			t.Errorf("%s: %d bytes written for %d of records", name, w, raw)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
