package spill

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"

	"github.com/pgreorder/pgreorder/vfs"
)

// Reader streams a log's records in order. Memory: one buffer of Options.BufferSize, plus one
// buffer as large as the largest record that does not fit in it.
type Reader struct {
	l      *Log
	end    int64    // logical end of the records to read
	off    int64    // logical offset of the next record
	buf    []byte   // the read buffer, which holds a block's raw bytes
	big    []byte   // holds a record larger than buf
	header bool     // file header checked
	err    error    // sticky until Rewind
	own    bool     // made by OpenReader: reads f, never the store
	f      vfs.File // own: the log's file
	fixed  error    // own: an error from OpenReader, returned for good

	// The current block's raw bytes blk (in buf or big), the next record at
	// blk[bi:], the block at file offset bfoff, the next one at foff, the file's size fend.
	codec      Compressor
	blk        []byte
	bi         int
	bfoff      int64
	foff, fend int64
	stored     []byte // with a codec, a block's stored (compressed) bytes
	hdr        [blockHeaderSize]byte
}

// Next returns the next record, or io.EOF after the last one. The slice is valid until the next
// call to Next or Close. Damaged data gives a *CorruptError; any error is returned again by every
// later call.
func (r *Reader) Next() ([]byte, error) {
	// Most records lie in the block in hand, with a length of one byte: return one of them
	// without the checks of reading a block (the log's state is the same as for next's own).
	if bi := r.bi; bi < len(r.blk) && r.err == nil && r.off < r.end && (r.own || r.l.usable()) {
		if n := int(r.blk[bi]); n < 0x80 && n < len(r.blk)-bi {
			end := bi + 1 + n
			r.bi = end
			r.off += int64(1 + n)
			return r.blk[bi+1 : end : end], nil
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	if r.fixed != nil {
		return nil, r.fixed
	}
	rec, err := r.next()
	if err != nil {
		r.err = err
	}
	return rec, err
}

func (r *Reader) next() ([]byte, error) {
	l := r.l
	if !r.own {
		if err := l.check(); err != nil {
			return nil, err
		}
	}
	if r.off == r.end {
		return nil, io.EOF
	}
	if !r.header {
		if err := r.checkHeader(); err != nil {
			return nil, err
		}
		r.header = true
	}
	if r.buf == nil {
		r.buf = l.s.spare
		l.s.spare = nil
		if r.buf == nil {
			r.buf = make([]byte, l.s.bufSize)
		}
	}
	if r.codec != nil && r.stored == nil && !r.own {
		r.stored, l.s.cspare = l.s.cspare, nil
	}
	return r.nextInBlock()
}

// file returns the log's file: the reader's own, or the store's.
func (r *Reader) file() (vfs.File, error) {
	if r.own {
		return r.f, nil
	}
	return r.l.s.file(r.l)
}

func (r *Reader) checkHeader() error {
	f, err := r.file()
	if err != nil {
		return err
	}
	var hdr [headerSize]byte
	n, err := f.ReadAt(hdr[:], 0)
	if n < headerSize {
		if err == nil || errors.Is(err, io.EOF) {
			return &CorruptError{Log: r.l.Path(), Offset: int64(n), Err: io.ErrUnexpectedEOF}
		}
		return ioError("read", r.l.Path(), err)
	}
	if !bytes.Equal(hdr[:4], []byte(magic)) {
		return &CorruptError{Log: r.l.Path(), Offset: 0, Err: errBadMagic}
	}
	if binary.LittleEndian.Uint32(hdr[4:]) != r.l.s.version() {
		return &CorruptError{Log: r.l.Path(), Offset: 4, Err: errBadVersion}
	}
	return nil
}

// Rewind makes the reader start again from the first record, also after an error (which the
// reader then meets again if it is in the data). It does nothing once the reader is closed.
func (r *Reader) Rewind() {
	if r.err == ErrClosed {
		return
	}
	r.err, r.off = nil, 0
	r.blk, r.bi, r.foff = nil, 0, headerSize
}

// nextInBlock returns the next record of the current block, reading the next
// block when it is used up.
func (r *Reader) nextInBlock() ([]byte, error) {
	if r.bi == len(r.blk) {
		f, err := r.file()
		if err != nil {
			return nil, err
		}
		bh, err := readBlockHeader(f, r.l, r.hdr[:], r.foff, r.fend, r.end-r.off)
		if err != nil {
			return nil, err
		}
		dst := &r.buf
		if bh.raw > int64(len(r.buf)) {
			dst = &r.big
		}
		if err := readBlock(f, r.l, r.codec, r.foff, bh, dst, &r.stored); err != nil {
			return nil, err
		}
		if dst == &r.buf {
			r.blk = r.buf[:bh.raw]
			r.buf = r.buf[:cap(r.buf)]
		} else {
			r.blk = r.big
		}
		r.bi, r.bfoff = 0, r.foff
		r.foff += blockHeaderSize + bh.stored
	}
	at := r.bi
	k, end, ok := recordAt(r.blk, at)
	if !ok {
		return nil, &CorruptError{Log: r.l.Path(), Offset: r.bfoff, Err: errRecInBlock}
	}
	r.bi = end
	r.off += int64(end - at)
	return r.blk[at+k : end : end], nil
}

// Close releases the reader's buffers (and, for a reader of OpenReader, hands the log's file
// back to the store); later calls to Next return ErrClosed. It is safe to call twice and always
// returns nil.
func (r *Reader) Close() error {
	if r.err == ErrClosed {
		return nil
	}
	if r.buf != nil && !r.l.s.closed && r.l.s.spare == nil {
		r.l.s.spare = r.buf
	}
	if r.stored != nil && !r.l.s.closed && cap(r.stored) > cap(r.l.s.cspare) {
		r.l.s.cspare = r.stored[:0]
	}
	if r.own && r.f != nil {
		r.l.giveBack()
		r.f = nil
	}
	r.buf, r.big, r.stored, r.blk = nil, nil, nil, nil
	r.err = ErrClosed
	return nil
}
