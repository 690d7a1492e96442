package spill_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/spill"
)

// TestAppendFramed appends runs of framed records, some larger than the buffer, with and
// without a codec, between Appends of another log, truncates back to a record boundary inside
// a run, and reads back what is left.
func TestAppendFramed(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	for _, codec := range []spill.Compressor{nil, rle{}} {
		s := openStore(t, spill.Options{BufferSize: 256, MaxOpenFiles: 1, Compressor: codec})
		l, other := create(t, s), create(t, s)
		var want [][]byte
		var bounds []int64 // Size at every record boundary
		bounds = append(bounds, 0)
		for run := range 40 {
			var framed []byte
			size := l.Size()
			for range rng.IntN(12) {
				rec := compressibleRecord(rng, rng.IntN(3)*rng.IntN(200))
				want = append(want, rec)
				framed = append(binary.AppendUvarint(framed, uint64(len(rec))), rec...)
				bounds = append(bounds, size+int64(len(framed)))
			}
			if err := l.AppendFramed(framed); err != nil {
				t.Fatal(err)
			}
			if l.Size() != size+int64(len(framed)) {
				t.Fatalf("Size %d after %d framed bytes at %d", l.Size(), len(framed), size)
			}
			if run%3 == 0 {
				if err := other.Append([]byte("x")); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := readAll(l)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("codec %v: %d records, want %d", codec, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("record %d differs", i)
			}
		}
		k := rng.IntN(len(bounds))
		if err := l.Truncate(bounds[k]); err != nil {
			t.Fatal(err)
		}
		got, err = readAll(l)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != k {
			t.Fatalf("after Truncate(%d): %d records, want %d", bounds[k], len(got), k)
		}
	}
}

func TestAppendFramedInvalid(t *testing.T) {
	s := openStore(t, spill.Options{})
	l := create(t, s)
	for _, framed := range [][]byte{{5, 'a'}, {0x80}, {1, 'a', 2}} {
		if err := l.AppendFramed(framed); !errors.Is(err, spill.ErrInvalidRecords) {
			t.Fatalf("AppendFramed(%q) = %v, want ErrInvalidRecords", framed, err)
		}
	}
	if l.Size() != 0 {
		t.Fatalf("Size %d after refused records", l.Size())
	}
	if err := l.AppendFramed([]byte{1, 'a', 0}); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(l)
	if err != nil || len(got) != 2 || string(got[0]) != "a" || len(got[1]) != 0 {
		t.Fatalf("read %q, %v", got, err)
	}
}
