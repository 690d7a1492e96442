// Package capture reads and writes pgoutput captures: one message per line, in the columns of
// pg_logical_slot_peek_binary_changes:
//
//	lsn<TAB>xid<TAB>hex(data)
//
// The LSN is printed as PostgreSQL prints it (%X/%X) and the xid in decimal. Either may be 0 (the
// walsender sends LSN 0/0 for Relation messages, and the xid column is not always known), so no
// reader of captures may rely on them. The data column may start with \x, as psql prints bytea.
// Empty lines and lines starting with '#' are comments. A Reader also reads gzip-compressed
// captures, recognized by their first bytes.
//
// Memory: a Reader decodes the hex column as it reads it, so it holds about twice the largest
// message at most (its pieces, then the message in one slice), never the line; a Writer encodes
// in pieces too.
package capture

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
)

// Record is one captured message.
type Record struct {
	LSN  decoding.LSN
	Xid  uint32
	Data []byte
}

// ErrSyntax is wrapped by every error a Reader returns for a malformed line.
var ErrSyntax = errors.New("capture: malformed line")

// LineError names the line of a capture that could not be read.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("capture: line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// MaxLineBytes bounds the length of one line (a pgoutput message is at most 1 GiB on the server).
const MaxLineBytes = 2<<30 + 64

const (
	readSize  = 64 << 10 // read buffer
	pieceSize = 1 << 20  // beyond this, a message is decoded into pieces of this size
	maxHeader = 64       // longest lsn<TAB>xid<TAB> accepted
)

// gzipMagic starts every gzip stream.
var gzipMagic = []byte{0x1f, 0x8b}

// Reader reads records from a capture.
type Reader struct {
	src     io.Reader
	size    int
	br      *bufio.Reader
	started bool
	err     error // sticky: a read error or a malformed line
	line    int

	buf    []byte   // the message being decoded (reused while at most pieceSize)
	pieces [][]byte // its continuation, for large messages
	whole  []byte   // a large message joined; dropped by the next call
	carry  byte     // a hex digit left over at the end of a piece
	odd    bool     // carry holds a digit
	n      int      // bytes decoded so far
	prefix uint8    // 0: data column not started, 1: read its '\\', 2: past an optional \x
}

// NewReader returns a Reader over r, which may be gzip-compressed.
func NewReader(r io.Reader) *Reader { return newReaderSize(r, readSize) }

func newReaderSize(r io.Reader, size int) *Reader { return &Reader{src: r, size: size} }

// Line returns the number of the line last read (1-based).
func (r *Reader) Line() int { return r.line }

func (r *Reader) start() error {
	r.started = true
	br := bufio.NewReaderSize(r.src, r.size)
	if magic, _ := br.Peek(len(gzipMagic)); bytes.Equal(magic, gzipMagic) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		r.br = bufio.NewReaderSize(zr, r.size)
		return nil
	}
	r.br = br
	return nil
}

// Release lets the Reader drop the memory of the record Next returned last: call it when done
// with Record.Data (for example once Buffer.Add copied it) so that a large message is not kept
// until the next call to Next.
func (r *Reader) Release() {
	r.whole = nil
	if cap(r.buf) > pieceSize {
		r.buf = nil
	}
}

// Next returns the next record, or io.EOF after the last one. Record.Data is valid until the next
// call to Next or Release. After an error other than io.EOF, Next keeps returning that error.
func (r *Reader) Next() (Record, error) {
	if r.err != nil {
		return Record{}, r.err
	}
	if !r.started {
		if err := r.start(); err != nil {
			r.err = &LineError{Line: 1, Err: err}
			return Record{}, r.err
		}
	}
	r.whole = nil // let the collector have the last large message
	for {
		chunk, err := r.br.ReadSlice('\n')
		if len(chunk) == 0 && err != nil {
			if err == io.EOF {
				return Record{}, io.EOF
			}
			r.err = &LineError{Line: r.line + 1, Err: err}
			return Record{}, r.err
		}
		r.line++
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !full && err != io.EOF {
			r.err = &LineError{Line: r.line, Err: err}
			return Record{}, r.err
		}
		if !full {
			chunk = trimEOL(chunk)
		}
		if len(chunk) == 0 {
			continue
		}
		if chunk[0] == '#' {
			if full {
				if err := r.skipLine(); err != nil {
					r.err = &LineError{Line: r.line, Err: err}
					return Record{}, r.err
				}
			}
			continue
		}
		rec, err := r.parse(chunk, full)
		if err != nil {
			r.err = &LineError{Line: r.line, Err: err}
			return Record{}, r.err
		}
		return rec, nil
	}
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte{'\n'})
	return bytes.TrimSuffix(b, []byte{'\r'})
}

// skipLine reads up to and including the end of the current line.
func (r *Reader) skipLine() error {
	for {
		_, err := r.br.ReadSlice('\n')
		if err == nil || err == io.EOF {
			return nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}

var errColumns = fmt.Errorf("%w: want 3 tab-separated columns", ErrSyntax)

// parse reads a record whose line starts with chunk; full means the line goes on beyond it.
func (r *Reader) parse(chunk []byte, full bool) (Record, error) {
	lsnText, rest, ok := bytes.Cut(chunk, []byte{'\t'})
	if !ok {
		return Record{}, errColumns
	}
	xidText, hexText, ok := bytes.Cut(rest, []byte{'\t'})
	if !ok || len(chunk)-len(hexText) > maxHeader {
		return Record{}, errColumns
	}
	lsn, err := decoding.ParseLSN(string(lsnText))
	if err != nil {
		return Record{}, fmt.Errorf("%w: lsn %q", ErrSyntax, lsnText)
	}
	var xid uint64
	if len(xidText) > 0 {
		xid, err = strconv.ParseUint(string(xidText), 10, 32)
		if err != nil {
			return Record{}, fmt.Errorf("%w: xid %q", ErrSyntax, xidText)
		}
	}
	r.buf, r.pieces, r.odd, r.n, r.prefix = r.buf[:0], nil, false, 0, 0
	if cap(r.buf) > pieceSize {
		r.buf = nil
	}
	text, more := hexText, full
	for {
		// A '\r' at the end of a read ends the line only if the line ends right after it.
		cr := more && len(text) > 0 && text[len(text)-1] == '\r'
		if cr {
			text = text[:len(text)-1]
		}
		if err := r.decode(text); err != nil {
			return Record{}, err
		}
		if !more {
			break
		}
		chunk, err := r.br.ReadSlice('\n')
		more = errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !more && err != io.EOF {
			return Record{}, err
		}
		if cr && len(chunk) > 0 && chunk[0] != '\n' {
			return Record{}, fmt.Errorf("%w: data: invalid byte '\\r'", ErrSyntax)
		}
		if !more {
			chunk = trimEOL(chunk)
		}
		text = chunk
	}
	if r.odd {
		return Record{}, fmt.Errorf("%w: odd number of hex digits", ErrSyntax)
	}
	if r.prefix == 1 {
		return Record{}, fmt.Errorf("%w: data: a lone backslash", ErrSyntax)
	}
	if r.n == 0 {
		return Record{}, fmt.Errorf("%w: empty message", ErrSyntax)
	}
	return Record{LSN: lsn, Xid: uint32(xid), Data: r.data()}, nil
}

// decode appends the bytes of the hex digits in text, the next part of the data column, to the
// message.
func (r *Reader) decode(text []byte) error {
	if i := bytes.IndexByte(text, '\t'); i >= 0 {
		return errColumns
	}
	for r.prefix < 2 && len(text) > 0 { // an optional \x, as psql prints bytea
		switch {
		case r.prefix == 0 && text[0] == '\\':
			r.prefix, text = 1, text[1:]
		case r.prefix == 1 && text[0] != 'x':
			return fmt.Errorf("%w: data: a lone backslash", ErrSyntax)
		case r.prefix == 1:
			r.prefix, text = 2, text[1:]
		default:
			r.prefix = 2
		}
	}
	if r.odd && len(text) > 0 {
		pair := [2]byte{r.carry, text[0]}
		var b [1]byte
		if _, err := hex.Decode(b[:], pair[:]); err != nil {
			return fmt.Errorf("%w: data: %v", ErrSyntax, err)
		}
		r.append(b[:])
		r.odd = false
		text = text[1:]
	}
	for len(text) >= 2 {
		// Decode in steps that fit the current piece.
		dst := r.room()
		n := min(len(dst), len(text)/2)
		if _, err := hex.Decode(dst[:n], text[:2*n]); err != nil {
			return fmt.Errorf("%w: data: %v", ErrSyntax, err)
		}
		r.grow(n)
		text = text[2*n:]
	}
	if len(text) == 1 {
		r.carry, r.odd = text[0], true
	}
	if r.n > MaxLineBytes/2 {
		return fmt.Errorf("%w: message longer than %d bytes", ErrSyntax, MaxLineBytes/2)
	}
	return nil
}

// room returns free space to decode into: in buf while it is small, else in the last piece.
func (r *Reader) room() []byte {
	if len(r.pieces) == 0 {
		if len(r.buf) < pieceSize {
			if cap(r.buf) == len(r.buf) {
				r.buf = slices.Grow(r.buf, min(max(cap(r.buf), 512), pieceSize-len(r.buf)))
			}
			return r.buf[len(r.buf):cap(r.buf)]
		}
		r.pieces = append(r.pieces, make([]byte, 0, pieceSize))
	}
	p := r.pieces[len(r.pieces)-1]
	if len(p) == cap(p) {
		p = make([]byte, 0, pieceSize)
		r.pieces = append(r.pieces, p)
	}
	return p[len(p):cap(p)]
}

// grow extends the message by n bytes just decoded into room().
func (r *Reader) grow(n int) {
	r.n += n
	if len(r.pieces) == 0 {
		r.buf = r.buf[:len(r.buf)+n]
		return
	}
	p := &r.pieces[len(r.pieces)-1]
	*p = (*p)[:len(*p)+n]
}

func (r *Reader) append(b []byte) {
	dst := r.room()
	copy(dst, b)
	r.grow(len(b))
}

// data returns the message as one slice.
func (r *Reader) data() []byte {
	if len(r.pieces) == 0 {
		return r.buf
	}
	whole := make([]byte, 0, r.n)
	whole = append(whole, r.buf...)
	for _, p := range r.pieces {
		whole = append(whole, p...)
	}
	r.pieces = nil
	r.whole = whole
	return whole
}

// Writer writes a capture.
type Writer struct {
	w   *bufio.Writer
	hex []byte
}

// NewWriter returns a Writer to w. Call Flush when done.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriter(w)} }

// Comment writes each line of text as a comment line.
func (w *Writer) Comment(text string) error {
	for l := range strings.SplitSeq(text, "\n") {
		if _, err := fmt.Fprintf(w.w, "# %s\n", l); err != nil {
			return err
		}
	}
	return nil
}

// Write writes one record.
func (w *Writer) Write(rec Record) error {
	w.hex = fmt.Appendf(w.hex[:0], "%s\t%d\t", rec.LSN, rec.Xid)
	for data := rec.Data; len(data) > 0; {
		n := min(len(data), 16<<10)
		w.hex = hex.AppendEncode(w.hex, data[:n])
		data = data[n:]
		if _, err := w.w.Write(w.hex); err != nil {
			return err
		}
		w.hex = w.hex[:0]
	}
	w.hex = append(w.hex, '\n')
	_, err := w.w.Write(w.hex)
	return err
}

// Flush writes any buffered data.
func (w *Writer) Flush() error { return w.w.Flush() }
