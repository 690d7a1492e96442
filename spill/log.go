package spill

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"strconv"

	"github.com/pgreorder/pgreorder/internal/ilist"
	"github.com/pgreorder/pgreorder/vfs"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Log is an append-only sequence of records that can be cut back to an earlier end. Create one
// with Store.Create.
//
// A Log is kept small (120 bytes), since a store may hold one for each of 100k open
// transactions: its file's name and path are made from its sequence number when needed.
type Log struct {
	s   *Store
	seq uint64 // the file is log-<seq>.spill in the store's directory

	f       vfs.File         // nil while closed by the descriptor budget (or not yet created)
	lru     ilist.Links[Log] // on the store's LRU while f != nil
	live    ilist.Links[Log] // on the store's list of live logs
	flushed int64            // logical bytes in the file: the raw bytes of its blocks

	// The file's size, and the file offset and logical offset of its last block (lastFile 0: no
	// block).
	fileEnd, lastFile, lastLogical int64

	err     error // sticky I/O error
	created bool  // the file exists on disk
	headed  bool  // the file header is written
	removed bool
	lent    bool // f is held by a reader of OpenReader: out of the LRU and the budget
}

// Path returns the log's file path (the file may not exist yet).
func (l *Log) Path() string { return filepath.Join(l.s.path, l.name()) }

// name returns the log's file name in the store's directory.
func (l *Log) name() string {
	var b [len(logPrefix) + 20 + len(logSuffix)]byte
	n := strconv.AppendUint(append(b[:0], logPrefix...), l.seq, 10)
	return string(append(n, logSuffix...))
}

// Err returns the log's sticky error, if any.
func (l *Log) Err() error { return l.err }

// check returns the error every call on l must return before doing anything.
func (l *Log) check() error {
	if l.removed || l.s.closed {
		return ErrClosed
	}
	return l.err
}

// usable reports whether check returns nil.
func (l *Log) usable() bool { return !l.removed && !l.s.closed && l.err == nil }

// fail makes err sticky on l, unless l already has an error, and returns l's error. It drops l's
// buffered bytes: none of them may ever become readable.
func (l *Log) fail(op string, err error) error {
	if l.err == nil {
		l.err = ioError(op, l.Path(), err)
	}
	if l.s.owner == l {
		l.s.owner = nil
		l.s.wbuf = l.s.wbuf[:0]
	}
	return l.err
}

// Size returns the logical end offset of the log: the bytes of all framed records appended and not
// truncated away, including those still in the write buffer. It is always a record boundary.
func (l *Log) Size() int64 {
	if l.s.owner == l {
		return l.flushed + int64(len(l.s.wbuf))
	}
	return l.flushed
}

// Append adds rec as the log's last record. rec is copied (or written) before Append returns, so
// the caller may reuse it. An I/O error of this log is returned here or from the log's next call,
// and sticks. An I/O error of another log that this call ran into (writing that log's buffered
// records to make room, or closing its file to free a descriptor) is returned as a *LogError; then
// rec is not appended, and this log is unharmed.
func (l *Log) Append(rec []byte) error {
	if err := l.check(); err != nil {
		return err
	}
	if len(rec) > MaxRecordSize {
		return fmt.Errorf("%w: %d bytes", ErrRecordTooLarge, len(rec))
	}
	if err := l.own(); err != nil {
		return err
	}
	return l.appendBlocks(rec)
}

// AppendFramed adds the records of framed, which holds them as the log frames them: each
// record's length as an unsigned varint (encoding/binary's AppendUvarint), then its bytes. It is
// Append of each record in turn, with the same errors, but copies framed into the write buffer
// at once when it fits there. Size grows by len(framed), so the log offset of a record of framed
// is the Size before the call plus the record's offset in framed: each is a record boundary that
// Truncate accepts. A framing that does not end at len(framed) is refused with ErrInvalidRecords,
// without effect, when framed is copied at once; a record of it larger than MaxRecordSize with
// ErrRecordTooLarge.
func (l *Log) AppendFramed(framed []byte) error {
	if err := l.check(); err != nil {
		return err
	}
	if err := l.own(); err != nil {
		return err
	}
	s := l.s
	if len(s.wbuf)+len(framed) > cap(s.wbuf) && len(framed) <= cap(s.wbuf) {
		if err := l.flush(); err != nil {
			return err
		}
		s.owner = l
	}
	if len(s.wbuf)+len(framed) <= cap(s.wbuf) {
		if !framedEnds(framed) {
			return ErrInvalidRecords
		}
		s.wbuf = append(s.wbuf, framed...)
		return nil
	}
	// Larger than the buffer: record by record, so that blocks hold whole records.
	for len(framed) > 0 {
		n, k := binary.Uvarint(framed)
		if k <= 0 || n > uint64(len(framed)-k) {
			return ErrInvalidRecords
		}
		if err := l.Append(framed[k : k+int(n)]); err != nil {
			return err
		}
		framed = framed[k+int(n):]
	}
	return nil
}

// framedEnds reports whether the records of framed end exactly at its end.
func framedEnds(framed []byte) bool {
	i := 0
	for i < len(framed) {
		if n := int(framed[i]); n < 0x80 { // a length of one byte: most records
			i += 1 + n
			continue
		}
		n, k := binary.Uvarint(framed[i:])
		if k <= 0 || n > uint64(len(framed)-i-k) {
			return false
		}
		i += k + int(n)
	}
	return i == len(framed)
}

// own makes l the owner of the store's write buffer, writing the previous owner's records.
func (l *Log) own() error {
	s := l.s
	if s.owner == l {
		return nil
	}
	if o := s.owner; o != nil {
		// o's error sticks to o; the call reports it too, having done nothing to l.
		if err := o.flush(); err != nil {
			return otherLogError(o, err)
		}
	}
	s.owner = l
	if s.wbuf == nil {
		s.wmem = make([]byte, s.front+s.bufSize)
		s.wbuf = s.wmem[s.front:s.front]
	}
	return nil
}

// flush writes l's buffered bytes, if l owns the write buffer, and releases the buffer.
func (l *Log) flush() error {
	s := l.s
	if s.owner != l {
		return l.err
	}
	if len(s.wbuf) == 0 {
		s.owner = nil
		return nil
	}
	f, err := s.file(l)
	if err != nil {
		return err
	}
	return l.flushBlock(f)
}

func (l *Log) maybeSync(f vfs.File) error {
	if !l.s.sync {
		return nil
	}
	if err := f.Sync(); err != nil {
		return l.fail("sync", err)
	}
	return nil
}

// Truncate cuts the log back to off, which must be a value Size returned earlier for this log
// (and not beyond the current Size). Records appended after that point are gone. An offset inside
// a written block that is not a record boundary is refused with ErrInvalidOffset, without effect;
// one among the records still in the write buffer is not detected, and reading would report the
// damage as a *CorruptError.
func (l *Log) Truncate(off int64) error {
	if err := l.check(); err != nil {
		return err
	}
	if off < 0 || off > l.Size() {
		return fmt.Errorf("%w: %d not in [0, %d]", ErrInvalidOffset, off, l.Size())
	}
	s := l.s
	if s.owner == l && off >= l.flushed {
		s.wbuf = s.wbuf[:off-l.flushed]
		return nil
	}
	if off == l.flushed {
		return nil
	}
	f, err := s.file(l)
	if err != nil {
		return err // l is as it was, unless the error is l's own (and sticks)
	}
	return l.truncateBlocks(f, off)
}

// NewReader flushes the log and returns a reader of its records [0, Size()). A flush error is
// returned by the reader's first Next. The log must not be truncated while the reader is in use;
// records appended after NewReader are not read.
func (l *Log) NewReader() *Reader {
	r := &Reader{l: l, codec: l.s.codec, foff: headerSize}
	if r.err = l.check(); r.err != nil {
		return r
	}
	if r.err = l.flush(); r.err != nil {
		return r
	}
	r.end, r.fend = l.flushed, l.fileEnd
	return r
}

// OpenReader flushes the log and returns a reader of its records [0, Size()) that works on its
// own: it opens the log's file and takes its read buffer now, and from then on reads only that
// file and its own buffers, never the store. It may therefore be used on another goroutine while
// the store goes on being used (other logs appended, flushed, read, removed), as long as this log
// is not appended to, truncated or removed, and the store not closed, until the reader is closed.
// Its Close hands the file and the buffer back to the store, so it must not run concurrently with
// other uses of the store. Until then the file stays open outside Options.MaxOpenFiles.
//
// An error flushing or opening the log is returned by the reader's first Next (and by every
// later one, Rewind or not).
func (l *Log) OpenReader() *Reader {
	r := &Reader{l: l, own: true, codec: l.s.codec, foff: headerSize}
	if r.fixed = l.check(); r.fixed != nil {
		return r
	}
	if r.fixed = l.flush(); r.fixed != nil {
		return r
	}
	r.end, r.fend = l.flushed, l.fileEnd
	if r.end == 0 {
		return r // nothing to read: no file needed
	}
	s := l.s
	if l.lent {
		r.fixed = fmt.Errorf("spill: %s: the log already has a reader of OpenReader", l.Path())
		return r
	}
	f, err := s.file(l)
	if err != nil {
		r.fixed = err
		return r
	}
	s.lru.Remove(l)
	s.nOpen--
	l.lent = true
	r.f = f
	r.buf = s.spare
	s.spare = nil
	if r.buf == nil {
		r.buf = make([]byte, s.bufSize)
	}
	r.stored, s.cspare = s.cspare, nil
	return r
}

// giveBack ends the loan of l's file to a reader of OpenReader: it goes back to the LRU.
func (l *Log) giveBack() {
	if !l.lent {
		return
	}
	l.lent = false
	if l.f != nil && !l.removed && !l.s.closed {
		l.s.nOpen++
		l.s.lru.PushFront(l)
	}
}

// closeFile closes l's file, if open, and takes it out of the LRU. A close error sticks to l.
func (l *Log) closeFile() error {
	if l.f == nil {
		return nil
	}
	s := l.s
	if !l.lent {
		s.lru.Remove(l)
		s.nOpen--
	}
	f := l.f
	l.f = nil
	if err := f.Close(); err != nil {
		return l.fail("close", err)
	}
	return nil
}

// release closes and deletes l's file and forgets its buffered bytes.
func (l *Log) release() error {
	s := l.s
	l.removed = true
	if s.owner == l {
		s.owner = nil
		s.wbuf = s.wbuf[:0]
	}
	var errs []error
	if l.f != nil {
		prev := l.err
		if err := l.closeFile(); err != nil && err != prev {
			errs = append(errs, err)
		}
	}
	if l.created {
		if err := s.dir.Remove(l.name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		l.created = false
	}
	return errors.Join(errs...)
}

// Remove deletes the log and its file. The log's sticky error, if any, does not prevent the
// removal and is not returned again; errors closing or removing the file are. Later calls on the
// log return ErrClosed. Remove is safe to call twice.
func (l *Log) Remove() error {
	if l.removed || l.s.closed {
		return nil
	}
	l.s.logs.Remove(l)
	if err := l.release(); err != nil {
		return fmt.Errorf("spill: remove: %w", err)
	}
	return nil
}
