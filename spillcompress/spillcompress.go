// Package spillcompress provides the block compressors a reorder buffer's spill files can use
// (spill.Compressor): S2 (github.com/klauspost/compress/s2), LZ4 (github.com/pierrec/lz4/v4) and
// zstd (github.com/klauspost/compress/zstd).
//
// The core packages (spill, reorderbuffer) import nothing outside the standard library, so
// compression is passed in as reorderbuffer.Config.SpillCompressor (replication.Config.Buffer for a
// stream; -spill-compression for the pgreorder command).
//
// Default is S2, chosen by measurement (BENCHMARKS.md, "Spill compression"): on the bulk insert
// and the streamed pgbench workloads, S2 and LZ4 both leave a fifth to a quarter of the bytes
// (zstd at its fastest level a fiftieth to a sixth), and S2 costs the least time per spilled
// change (zstd up to twice as much per change as no compression on the pgbench case).
package spillcompress

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/pgreorder/pgreorder/spill"
)

// Default returns the recommended codec: S2.
func Default() spill.Compressor { return S2() }

// LZ4 returns a codec that compresses each block with LZ4 (github.com/pierrec/lz4/v4, block
// format, fastest level).
func LZ4() spill.Compressor { return lz4Compressor{} }

type lz4Compressor struct{}

var lz4Compressors = sync.Pool{New: func() any { return new(lz4.Compressor) }}

func (lz4Compressor) Compress(dst, src []byte) ([]byte, error) {
	n, bound := len(dst), lz4.CompressBlockBound(len(src))
	dst = grow(dst, bound)
	c := lz4Compressors.Get().(*lz4.Compressor)
	k, err := c.CompressBlock(src, dst[n:n+bound])
	lz4Compressors.Put(c)
	if err != nil {
		return dst[:n], err
	}
	if k == 0 { // incompressible
		return dst[:n], errIncompressible
	}
	return dst[:n+k], nil
}

func (lz4Compressor) Decompress(dst, src []byte) error {
	k, err := lz4.UncompressBlock(src, dst)
	if err != nil {
		return err
	}
	if k != len(dst) {
		return fmt.Errorf("lz4: %d bytes, want %d", k, len(dst))
	}
	return nil
}

// S2 returns a codec that compresses each block with S2 (github.com/klauspost/compress/s2,
// block format, default level).
func S2() spill.Compressor { return s2Compressor{} }

type s2Compressor struct{}

func (s2Compressor) Compress(dst, src []byte) ([]byte, error) {
	n, bound := len(dst), s2.MaxEncodedLen(len(src))
	dst = grow(dst, bound)
	out := s2.Encode(dst[n:n+bound], src)
	return dst[:n+len(out)], nil
}

func (s2Compressor) Decompress(dst, src []byte) error {
	if k, err := s2.DecodedLen(src); err != nil {
		return err
	} else if k != len(dst) {
		return fmt.Errorf("s2: %d bytes, want %d", k, len(dst))
	}
	_, err := s2.Decode(dst, src)
	return err
}

// Zstd returns a codec that compresses each block with zstd (github.com/klauspost/compress/zstd,
// its fastest level, one block per frame).
func Zstd() spill.Compressor { return zstdCompressor{} }

type zstdCompressor struct{}

var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdDec  *zstd.Decoder
	zstdErr  error
)

func zstdInit() error {
	zstdOnce.Do(func() {
		zstdEnc, zstdErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true))
		if zstdErr == nil {
			zstdDec, zstdErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
		}
	})
	return zstdErr
}

func (zstdCompressor) Compress(dst, src []byte) ([]byte, error) {
	if err := zstdInit(); err != nil {
		return dst, err
	}
	return zstdEnc.EncodeAll(src, dst), nil
}

func (zstdCompressor) Decompress(dst, src []byte) error {
	if err := zstdInit(); err != nil {
		return err
	}
	out, err := zstdDec.DecodeAll(src, dst[:0])
	if err != nil {
		return err
	}
	if len(out) != len(dst) || (len(out) > 0 && &out[0] != &dst[0]) {
		return fmt.Errorf("zstd: %d bytes, want %d", len(out), len(dst))
	}
	return nil
}

var errIncompressible = errors.New("spillcompress: block does not compress")

// grow returns b with room for n more bytes.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n][:len(b)]
	}
	nb := make([]byte, len(b), len(b)+n)
	copy(nb, b)
	return nb
}
