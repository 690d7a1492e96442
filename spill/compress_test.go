package spill_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
)

// rle is a run-length codec for the tests (package spill has no compressor of its own): each
// run of up to 255 equal bytes becomes its length and the byte.
type rle struct{}

func (rle) Compress(dst, src []byte) ([]byte, error) {
	for i := 0; i < len(src); {
		j := i + 1
		for j < len(src) && j-i < 255 && src[j] == src[i] {
			j++
		}
		dst = append(dst, byte(j-i), src[i])
		i = j
	}
	return dst, nil
}

func (rle) Decompress(dst, src []byte) error {
	n := 0
	for i := 0; i+1 < len(src); i += 2 {
		k := int(src[i])
		if k == 0 || n+k > len(dst) {
			return errors.New("rle: too long")
		}
		for j := range k {
			dst[n+j] = src[i+1]
		}
		n += k
	}
	if n != len(dst) || len(src)%2 != 0 {
		return errors.New("rle: wrong length")
	}
	return nil
}

// compressibleRecord returns a record of n bytes in runs, as rle compresses.
func compressibleRecord(rng *rand.Rand, n int) []byte {
	b := make([]byte, 0, n)
	for len(b) < n {
		b = append(b, bytes.Repeat([]byte{byte(rng.Uint32())}, min(n-len(b), 1+rng.IntN(40)))...)
	}
	return b
}

// TestCompressedModel runs the log against a model with a codec: appends (compressible and
// not), truncations to any earlier Size (inside blocks, at their starts, in the write buffer),
// reads, removals, in many logs sharing the write buffer.
func TestCompressedModel(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	for _, cfg := range []spill.Options{
		{BufferSize: 64, MaxOpenFiles: 1, Compressor: rle{}},
		{BufferSize: 500, MaxOpenFiles: 3, Compressor: rle{}},
		{Compressor: rle{}},
	} {
		t.Run(fmt.Sprintf("buf=%d,fds=%d", cfg.BufferSize, cfg.MaxOpenFiles), func(t *testing.T) {
			runModel(t, openStore(t, cfg), rng, true)
		})
	}
}

// compressedLog writes 30 compressible records of 100 bytes into one block (flushed by a
// reader) and returns the log, the Size before each record, and the records.
func compressedLog(t *testing.T, opts spill.Options) (*spill.Log, []int64, [][]byte) {
	t.Helper()
	opts.Compressor = rle{}
	s := openStore(t, opts)
	l := create(t, s)
	var sizes []int64
	var recs [][]byte
	for i := range 30 {
		sizes = append(sizes, l.Size())
		r := rec(i, 100)
		recs = append(recs, r)
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	sizes = append(sizes, l.Size())
	got, err := readAll(l)
	if err != nil {
		t.Fatal(err)
	}
	equalRecords(t, got, recs)
	return l, sizes, recs
}

func TestCompressedTruncateInsideBlock(t *testing.T) {
	l, sizes, recs := compressedLog(t, spill.Options{})
	fi, err := os.Stat(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() >= sizes[30]/10 {
		t.Fatalf("file of %d bytes for %d bytes of records: not compressed", fi.Size(), sizes[30])
	}
	// Inside the one block, then at its start; then appending goes on after the cut.
	for _, k := range []int{17, 9, 0} {
		if err := l.Truncate(sizes[k]); err != nil {
			t.Fatal(err)
		}
		got, err := readAll(l)
		if err != nil {
			t.Fatal(err)
		}
		equalRecords(t, got, recs[:k])
	}
	if err := l.Append([]byte("after")); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(l)
	if err != nil {
		t.Fatal(err)
	}
	equalRecords(t, got, [][]byte{[]byte("after")})
	// Not a record boundary: refused, and not sticky.
	if err := l.Truncate(3); !errors.Is(err, spill.ErrInvalidOffset) {
		t.Fatalf("Truncate inside a record: %v", err)
	}
	if _, err := readAll(l); err != nil {
		t.Fatal(err)
	}
}

func TestCompressedTruncateEarlierBlock(t *testing.T) {
	// Many blocks (a small buffer); a cut inside an early one walks the block headers.
	s := openStore(t, spill.Options{BufferSize: 256, Compressor: rle{}})
	l := create(t, s)
	var sizes []int64
	var recs [][]byte
	for i := range 200 {
		sizes = append(sizes, l.Size())
		r := rec(i, 1+i%90)
		recs = append(recs, r)
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []int{150, 149, 101, 40, 3, 1} {
		if err := l.Truncate(sizes[k]); err != nil {
			t.Fatal(err)
		}
		got, err := readAll(l)
		if err != nil {
			t.Fatal(err)
		}
		equalRecords(t, got, recs[:k])
	}
}

func TestCompressedCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(b []byte) []byte
		want   error
	}{
		{"flipped stored byte", func(b []byte) []byte { b[len(b)-3] ^= 0x40; return b }, nil},
		{"flipped length", func(b []byte) []byte { b[spill.HeaderSize+5] ^= 0x01; return b }, nil},
		{"cut inside the block", func(b []byte) []byte { return b[:len(b)-5] }, io.ErrUnexpectedEOF},
		{"cut inside the block header", func(b []byte) []byte { return b[:spill.HeaderSize+6] }, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _, _ := compressedLog(t, spill.Options{})
			b, err := os.ReadFile(l.Path())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(l.Path(), tc.damage(b), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readAll(l)
			var ce *spill.CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, spill.ErrCorrupt) {
				t.Fatalf("read %d records of a damaged block, error %v; want a CorruptError", len(got), err)
			}
			if len(got) != 0 {
				t.Fatalf("%d records of a damaged block were returned", len(got))
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

func TestCompressedTruncateCorruptBlock(t *testing.T) {
	// A cut inside a damaged block cannot write its start again: the damage is reported, and
	// sticks.
	l, sizes, _ := compressedLog(t, spill.Options{})
	b, err := os.ReadFile(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0x40
	if err := os.WriteFile(l.Path(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Truncate(sizes[10]); !errors.Is(err, spill.ErrCorrupt) {
		t.Fatalf("Truncate inside a damaged block: %v", err)
	}
	if err := l.Append([]byte("x")); !errors.Is(err, spill.ErrCorrupt) {
		t.Fatalf("Append after: %v (the error must stick)", err)
	}
}

func TestCompressedTruncateENOSPC(t *testing.T) {
	// The disk fills up while the start of the cut block is written again: the error sticks,
	// and no record of the torn block is ever returned.
	ffs := faultfs.New(vfs.OS())
	l, sizes, _ := compressedLog(t, spill.Options{FS: ffs})
	ffs.Add(faultfs.Rule{Op: faultfs.OpWrite, Match: func(p string) bool { return p == l.Path() }, Err: syscall.ENOSPC, Partial: true})
	if err := l.Truncate(sizes[12]); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Truncate: %v, want ENOSPC", err)
	}
	if _, err := readAll(l); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("read after: %v, want the sticky ENOSPC", err)
	}
	if err := l.Append([]byte("x")); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Append after: %v, want the sticky ENOSPC", err)
	}
}

func TestCompressedENOSPCOnFlush(t *testing.T) {
	ffs := faultfs.New(vfs.OS())
	s := openStore(t, spill.Options{FS: ffs, BufferSize: 256, Compressor: rle{}})
	l := create(t, s)
	ffs.Add(faultfs.Rule{Op: faultfs.OpWrite, Match: func(p string) bool { return p == l.Path() }, Skip: 2, Err: syscall.ENOSPC, Partial: true})
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		err = l.Append(rec(i, 50))
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Append: %v, want ENOSPC", err)
	}
	got, err := readAll(l)
	if !errors.Is(err, syscall.ENOSPC) || len(got) != 0 {
		t.Fatalf("read after: %d records, %v; want the sticky ENOSPC", len(got), err)
	}
}

func TestCompressedLargeRecord(t *testing.T) {
	// A record larger than the write buffer is a block of its own; cuts before and after it.
	s := openStore(t, spill.Options{BufferSize: 64, Compressor: rle{}})
	l := create(t, s)
	small, big := []byte("small"), bytes.Repeat([]byte{7}, 5000)
	if err := l.Append(small); err != nil {
		t.Fatal(err)
	}
	mid := l.Size()
	if err := l.Append(big); err != nil {
		t.Fatal(err)
	}
	end := l.Size()
	if err := l.Append(small); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(l)
	if err != nil {
		t.Fatal(err)
	}
	equalRecords(t, got, [][]byte{small, big, small})
	if err := l.Truncate(end); err != nil {
		t.Fatal(err)
	}
	if got, err = readAll(l); err != nil {
		t.Fatal(err)
	}
	equalRecords(t, got, [][]byte{small, big})
	if err := l.Truncate(mid); err != nil {
		t.Fatal(err)
	}
	if got, err = readAll(l); err != nil {
		t.Fatal(err)
	}
	equalRecords(t, got, [][]byte{small})
}

// padded is rle with its output padded with zeros to size(len(src)) bytes (when longer than
// rle's), so that a test chooses how much a block's compression saves; it counts its calls.
type padded struct {
	size                   func(n int) int
	compresses, decompress *int
}

func (c padded) Compress(dst, src []byte) ([]byte, error) {
	*c.compresses++
	n := len(dst)
	dst, _ = rle{}.Compress(dst, src)
	for len(dst)-n < c.size(len(src)) {
		dst = append(dst, 0)
	}
	return dst, nil
}

func (c padded) Decompress(dst, src []byte) error {
	*c.decompress++
	// The runs up to len(dst), then only padding.
	n, i := 0, 0
	for ; n < len(dst) && i+1 < len(src); i += 2 {
		n += int(src[i])
	}
	if n != len(dst) || bytes.ContainsFunc(src[i:], func(r rune) bool { return r != 0 }) {
		return errors.New("padded: wrong length")
	}
	return rle{}.Decompress(dst, src[:i])
}

// TestRawBlocks checks when a store with a codec stores a block as it is (stored length = raw
// length): when it is below 128 bytes (the codec is not called), or when compressing it saves
// less than an eighth; such a block is read back without the codec, and its damage detected.
func TestRawBlocks(t *testing.T) {

	for _, tc := range []struct {
		name      string
		recs, rec int
		size      func(n int) int // the codec's output for n bytes
		raw       bool            // the block is stored as it is
		calls     int             // Compress calls
	}{
		{"saves an eighth", 10, 98, func(n int) int { return n - n/8 }, false, 1},
		{"saves less than an eighth", 10, 98, func(n int) int { return n - n/8 + 1 }, true, 1},
		{"grows", 10, 98, func(n int) int { return n + 10 }, true, 1},
		{"127 bytes", 1, 126, func(int) int { return 0 }, true, 0},
		{"128 bytes", 1, 126 + 1, func(int) int { return 0 }, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var compresses, decompresses int
			s := openStore(t, spill.Options{Compressor: padded{tc.size, &compresses, &decompresses}})
			l := create(t, s)
			var recs [][]byte
			for i := range tc.recs {
				recs = append(recs, rec(i, tc.rec))
				if err := l.Append(recs[i]); err != nil {
					t.Fatal(err)
				}
			}
			raw := l.Size()
			got, err := readAll(l) // flushes the one block
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, got, recs)
			if compresses != tc.calls {
				t.Fatalf("Compress called %d times, want %d", compresses, tc.calls)
			}
			fi, err := os.Stat(l.Path())
			if err != nil {
				t.Fatal(err)
			}
			stored := fi.Size() - spill.HeaderSize - spill.BlockHeaderSize
			if tc.raw {
				if stored != raw || decompresses != 0 {
					t.Fatalf("%d bytes stored for %d raw, %d decompressions; want the block as it is", stored, raw, decompresses)
				}
			} else if stored >= raw || decompresses != 1 {
				t.Fatalf("%d bytes stored for %d raw, %d decompressions; want it compressed", stored, raw, decompresses)
			}
			if !tc.raw {
				return
			}
			// A damaged byte of the raw block: detected, and none of its records returned.
			b, err := os.ReadFile(l.Path())
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-int(raw)/2] ^= 0x10
			if err := os.WriteFile(l.Path(), b, 0o600); err != nil {
				t.Fatal(err)
			}
			got, err = readAll(l)
			if !errors.Is(err, spill.ErrCorrupt) || len(got) != 0 {
				t.Fatalf("damaged raw block: %d records, %v; want a CorruptError and none", len(got), err)
			}
		})
	}

}

// TestRawBlockTruncate cuts inside a block stored as it is, with a codec that does not shrink
// it: the records before the cut are written again, read back, and appending goes on.
func TestRawBlockTruncate(t *testing.T) {
	var compresses, decompresses int
	s := openStore(t, spill.Options{BufferSize: 4096, Compressor: padded{func(n int) int { return n }, &compresses, &decompresses}})
	l := create(t, s)
	var sizes []int64
	var recs [][]byte
	for i := range 100 {
		sizes = append(sizes, l.Size())
		recs = append(recs, rec(i, 1+i*7%200))
		if err := l.Append(recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []int{90, 57, 33, 2} {
		if err := l.Truncate(sizes[k]); err != nil {
			t.Fatal(err)
		}
		got, err := readAll(l)
		if err != nil {
			t.Fatal(err)
		}
		equalRecords(t, got, recs[:k])
	}
	if compresses == 0 || decompresses != 0 {
		t.Fatalf("%d compressions, %d decompressions: want blocks tried and all stored as they are", compresses, decompresses)
	}
	if w, _ := os.Stat(l.Path()); w.Size() != spill.HeaderSize+spill.BlockHeaderSize+sizes[2] {
		t.Fatalf("file of %d bytes for %d of records in one block", w.Size(), sizes[2])
	}
}
