package spill

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/pgreorder/pgreorder/vfs"
)

// Compressor compresses the blocks of records a Store writes (Options.Compressor). Package spill holds no
// compressor of its own; a Compressor wraps one. Both methods must be safe to call from several
// goroutines at once (a Reader of Log.OpenReader decompresses on its own goroutine).
type Compressor interface {
	// Compress appends the compressed form of src to dst and returns the extended slice, like
	// append (it may grow dst). Compressed bytes that save less than an eighth of src, or an
	// error, make the store write the block as it is; blocks of fewer than 128 bytes are written
	// as they are without a call.
	Compress(dst, src []byte) ([]byte, error)
	// Decompress fills dst, which has exactly the uncompressed length of the block, from src.
	// It returns an error if src does not decompress to exactly len(dst) bytes.
	Decompress(dst, src []byte) error
}

// The file format (see the package documentation): the file header, then blocks, each a block
// header and its stored bytes. The stored bytes are the block's records compressed, or as they
// are (stored length = raw length: what marks a block stored raw) without a codec, for a block
// below minCompress bytes, or when compressing does not save an eighth of them.
// Inside a block, each record is its length as a uvarint, then its bytes.
const (
	blockHeaderSize = 12 // CRC-32C, stored length, raw length
	maxRecHeader    = binary.MaxVarintLen32

	// minCompress is the fewest raw bytes of a block the codec is tried on.
	minCompress = 128
)

// frameSize returns the raw bytes a record of n bytes takes in a block: its uvarint length and
// itself.
func frameSize(n int) int {
	k := 1
	for x := uint(n); x >= 0x80; x >>= 7 {
		k++
	}
	return k + n
}

// recordAt returns the length of the uvarint before the record at raw[at:] and the record's end,
// or ok false if the record does not lie within raw.
func recordAt(raw []byte, at int) (k, end int, ok bool) {
	n, k := binary.Uvarint(raw[at:])
	if k <= 0 || n > uint64(len(raw)-at-k) {
		return 0, 0, false
	}
	return k, at + k + int(n), true
}

var (
	errBlockLength = errors.New("block length beyond end of log")
	errDecompress  = errors.New("block does not decompress")
	errRecInBlock  = errors.New("record length beyond end of block")
)

// putBlockHeader writes the header of a block of raw bytes stored as stored into h (whose
// stored bytes follow), with the CRC of the lengths and stored.
func putBlockHeader(h []byte, stored []byte, raw int) {
	binary.LittleEndian.PutUint32(h[4:], uint32(len(stored)))
	binary.LittleEndian.PutUint32(h[8:], uint32(raw))
	crc := crc32.Update(crc32.Checksum(h[4:blockHeaderSize], castagnoli), castagnoli, stored)
	binary.LittleEndian.PutUint32(h[:4], crc)
}

// blockHeader is a block's header as read from a file, with the CRC of its lengths.
type blockHeader struct {
	crc, lensCRC uint32
	stored, raw  int64
}

// readBlockHeader reads the header of l's block at file offset foff, which must lie below
// fileEnd, into h (blockHeaderSize bytes: memory of the caller's, so that reading a block
// allocates nothing). The lengths are checked against the file and limit (the most raw bytes
// the block may hold).
func readBlockHeader(f vfs.File, l *Log, h []byte, foff, fileEnd, limit int64) (blockHeader, error) {
	h = h[:blockHeaderSize]
	if fileEnd-foff < blockHeaderSize {
		return blockHeader{}, &CorruptError{Log: l.Path(), Offset: foff, Err: io.ErrUnexpectedEOF}
	}
	n, err := f.ReadAt(h, foff)
	if n < len(h) {
		if err == nil || errors.Is(err, io.EOF) {
			return blockHeader{}, &CorruptError{Log: l.Path(), Offset: foff + int64(n), Err: io.ErrUnexpectedEOF}
		}
		return blockHeader{}, ioError("read", l.Path(), err)
	}
	bh := blockHeader{
		crc:     binary.LittleEndian.Uint32(h[:4]),
		lensCRC: crc32.Checksum(h[4:], castagnoli),
		stored:  int64(binary.LittleEndian.Uint32(h[4:])),
		raw:     int64(binary.LittleEndian.Uint32(h[8:])),
	}
	if bh.stored > bh.raw || bh.raw > limit || bh.raw < 1 || bh.stored > fileEnd-foff-blockHeaderSize {
		return blockHeader{}, &CorruptError{Log: l.Path(), Offset: foff, Err: errBlockLength}
	}
	return bh, nil
}

// readBlock reads l's block at foff, whose header is bh, checks its CRC and returns its raw
// bytes in *raw (grown as needed), using *stored for the compressed bytes.
func readBlock(f vfs.File, l *Log, codec Compressor, foff int64, bh blockHeader, raw, stored *[]byte) error {
	if int64(cap(*raw)) < bh.raw {
		*raw = make([]byte, bh.raw)
	}
	*raw = (*raw)[:bh.raw]
	dst := *raw
	if bh.stored < bh.raw {
		if int64(cap(*stored)) < bh.stored {
			// Room for the stored bytes of any block the write buffer makes (shorter than
			// its raw bytes), so that the buffer grows once.
			c := bh.stored
			if bh.raw <= int64(l.s.bufSize) {
				c = int64(l.s.bufSize)
			}
			*stored = make([]byte, bh.stored, c)
		}
		dst = (*stored)[:bh.stored]
	}
	n, err := f.ReadAt(dst, foff+blockHeaderSize)
	if n < len(dst) {
		if err == nil || errors.Is(err, io.EOF) {
			return &CorruptError{Log: l.Path(), Offset: foff + blockHeaderSize + int64(n), Err: io.ErrUnexpectedEOF}
		}
		return ioError("read", l.Path(), err)
	}
	if crc32.Update(bh.lensCRC, castagnoli, dst) != bh.crc {
		return &CorruptError{Log: l.Path(), Offset: foff, Err: errChecksum}
	}
	if bh.stored < bh.raw {
		if codec == nil {
			return &CorruptError{Log: l.Path(), Offset: foff, Err: errDecompress}
		}
		if err := codec.Decompress(*raw, dst); err != nil {
			return &CorruptError{Log: l.Path(), Offset: foff, Err: fmt.Errorf("%w: %v", errDecompress, err)}
		}
	}
	return nil
}

// appendBlocks is Append with a codec (l owns the write buffer): records go into the buffer as
// a length and the bytes, and one too large for it is written through as a block of its own.
func (l *Log) appendBlocks(rec []byte) error {
	s := l.s
	frame := frameSize(len(rec))
	if len(s.wbuf)+frame > cap(s.wbuf) {
		if err := l.flush(); err != nil {
			return err
		}
		s.owner = l
	}
	if frame <= cap(s.wbuf) {
		s.wbuf = append(binary.AppendUvarint(s.wbuf, uint64(len(rec))), rec...)
		return nil
	}
	// A block of its own, stored as it is: headers built in the (empty) buffer's memory.
	f, err := s.file(l)
	if err != nil {
		return err
	}
	hdr := binary.AppendUvarint(s.wmem[:s.front], uint64(len(rec)))
	bh := hdr[headerSize:s.front]
	binary.LittleEndian.PutUint32(bh[4:], uint32(frame))
	binary.LittleEndian.PutUint32(bh[8:], uint32(frame))
	crc := crc32.Update(crc32.Checksum(bh[4:], castagnoli), castagnoli, hdr[s.front:])
	binary.LittleEndian.PutUint32(bh[:4], crc32.Update(crc, castagnoli, rec))
	start := l.blockStart()
	off := start
	if !l.headed {
		s.putHeader(hdr)
		off = 0
	} else {
		hdr = hdr[headerSize:]
	}
	if err := s.writeFull(f, hdr, off); err != nil {
		return l.fail("write", err)
	}
	l.headed = true
	if err := s.writeFull(f, rec, start+blockHeaderSize+int64(frame-len(rec))); err != nil {
		return l.fail("write", err)
	}
	if err := l.maybeSync(f); err != nil {
		return err
	}
	l.lastFile, l.lastLogical = start, l.flushed
	l.fileEnd = start + blockHeaderSize + int64(frame)
	l.flushed += int64(frame)
	return nil
}

// compress appends the compressed form of raw, a block's records, to dst with the store's codec,
// and reports whether the block is to be stored so: not when it is shorter than minCompress
// bytes (too small to be worth the codec's call), nor when compressing fails or saves less than
// an eighth of it (reading it back would cost a decompression for little). Otherwise the block
// is stored as it is, which its header says by a stored length equal to its raw length. The
// slice returned is dst's memory, grown by the codec if it needed more, with or without the
// compressed bytes: the caller keeps it for the next block, so that an incompressible block
// does not cost an allocation each time.
func (s *Store) compress(dst, raw []byte) ([]byte, bool) {
	if len(raw) < minCompress {
		return dst, false
	}
	out, err := s.codec.Compress(dst, raw)
	if err != nil || len(out) < len(dst) || len(out)-len(dst) > len(raw)-len(raw)/8 {
		if cap(out) >= cap(dst) && len(out) >= len(dst) {
			return out[:len(dst)], false
		}
		return dst, false
	}
	return out, true
}

// blockStart returns the file offset of l's next block.
func (l *Log) blockStart() int64 {
	if !l.headed {
		return headerSize
	}
	return l.fileEnd
}

// flushBlock writes l's buffered records (there are some) as one block, compressed if the
// store's compress says so, and releases the buffer.
func (l *Log) flushBlock(f vfs.File) error {
	s := l.s
	raw := s.wbuf
	block, stored := s.wmem[:s.front+len(raw)], raw // as they are, in the room before wbuf
	if s.codec != nil {
		if s.cmem == nil {
			s.cmem = make([]byte, s.front, s.front+s.bufSize)
		}
		out, ok := s.compress(s.cmem[:s.front], raw)
		s.cmem = out[:0]
		if ok {
			block, stored = out, out[s.front:]
		}
	}
	putBlockHeader(block[headerSize:s.front], stored, len(raw))
	start := l.blockStart()
	off := start
	if !l.headed {
		s.putHeader(block)
		off = 0
	} else {
		block = block[headerSize:]
	}
	if err := s.writeFull(f, block, off); err != nil {
		return l.fail("write", err)
	}
	l.headed = true
	if err := l.maybeSync(f); err != nil {
		return err
	}
	l.lastFile, l.lastLogical = start, l.flushed
	l.fileEnd = start + blockHeaderSize + int64(len(stored))
	l.flushed += int64(len(raw))
	s.wbuf = s.wbuf[:0]
	s.owner = nil
	return nil
}

// truncateBlocks is Truncate with a codec, to off < l.flushed. The cut falls at the start of a
// block, or inside one: then the block's records before off are written again, as a new block
// in its place (compressed again). The block is found from the last one's position, or by
// reading the block headers from the start of the file.
func (l *Log) truncateBlocks(f vfs.File, off int64) error {
	s := l.s
	if s.owner == l { // every buffered byte lies beyond off
		s.wbuf = s.wbuf[:0]
		s.owner = nil
	}
	limit := int64(MaxRecordSize + maxRecHeader)
	var (
		foff, lstart int64 // the block holding off
		prevF, prevL int64 // the block before it (prevF 0: none)
		bh           blockHeader
		err          error
		h            [blockHeaderSize]byte
	)
	if l.lastFile != 0 && off > l.lastLogical {
		foff, lstart = l.lastFile, l.lastLogical
		if bh, err = readBlockHeader(f, l, h[:], foff, l.fileEnd, limit); err != nil {
			return l.stick(err)
		}
	} else {
		foff = headerSize
		for {
			if bh, err = readBlockHeader(f, l, h[:], foff, l.fileEnd, limit); err != nil {
				return l.stick(err)
			}
			if lstart+bh.raw > off {
				break
			}
			prevF, prevL = foff, lstart
			foff += blockHeaderSize + bh.stored
			lstart += bh.raw
		}
	}
	var keep []byte // the records of the block before off
	if off > lstart {
		if bh.raw > int64(s.bufSize) {
			// A record larger than the buffer, alone in its block: off is inside it.
			return fmt.Errorf("%w: %d is inside a record", ErrInvalidOffset, off)
		}
		raw := s.spare
		s.spare = nil
		stored := s.cmem
		if err := readBlock(f, l, s.codec, foff, bh, &raw, &stored); err != nil {
			return l.stick(err)
		}
		if cap(stored) > cap(s.cmem) {
			s.cmem = stored[:0]
		}
		defer func() {
			if s.spare == nil && cap(raw) >= s.bufSize {
				s.spare = raw[:s.bufSize]
			}
		}()
		at := 0
		for int64(at) < off-lstart {
			_, end, ok := recordAt(raw, at)
			if !ok {
				return l.stick(&CorruptError{Log: l.Path(), Offset: foff, Err: errRecInBlock})
			}
			at = end
		}
		if int64(at) != off-lstart {
			return fmt.Errorf("%w: %d is inside a record", ErrInvalidOffset, off)
		}
		keep = raw[:at]
	}
	if err := f.Truncate(foff); err != nil {
		return l.fail("truncate", err)
	}
	l.fileEnd, l.flushed = foff, lstart
	l.lastFile, l.lastLogical = prevF, prevL
	if keep != nil {
		block, stored := keep, keep
		if s.codec != nil {
			out, ok := s.compress(s.cmem[:0], keep)
			s.cmem = out[:0]
			if ok {
				block, stored = out, out
			}
		}
		var h [blockHeaderSize]byte
		putBlockHeader(h[:], stored, len(keep))
		if err := s.writeFull(f, h[:], foff); err != nil {
			return l.fail("write", err)
		}
		if err := s.writeFull(f, block, foff+blockHeaderSize); err != nil {
			return l.fail("write", err)
		}
		l.lastFile, l.lastLogical = foff, lstart
		l.fileEnd = foff + blockHeaderSize + int64(len(stored))
		l.flushed = off
	}
	return l.maybeSync(f)
}

// stick makes err, a corrupt block or a read error met by Truncate, l's sticky error.
func (l *Log) stick(err error) error {
	if l.err == nil {
		l.err = err
	}
	return l.err
}
