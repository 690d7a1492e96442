// Package capture reads and writes pgoutput captures: one message per line, in the columns of
// pg_logical_slot_peek_binary_changes:
//
//	lsn<TAB>xid<TAB>hex(data)
//
// The LSN is printed as PostgreSQL prints it (%X/%X) and the xid in decimal. Either may be 0 (the
// walsender sends LSN 0/0 for Relation messages, and the xid column is not always known), so no
// reader of captures may rely on them. Empty lines and lines starting with '#' are comments.
package capture

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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

// MaxLineBytes bounds the length of one line (a pgoutput message is at most 1 GiB on the server;
// captures used here are far smaller).
const MaxLineBytes = 1 << 30

// Reader reads records from a capture.
type Reader struct {
	sc   *bufio.Scanner
	line int
	buf  []byte
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), MaxLineBytes)
	return &Reader{sc: sc}
}

// Line returns the number of the line last read (1-based).
func (r *Reader) Line() int { return r.line }

// Next returns the next record, or io.EOF after the last one. Record.Data is valid until the next
// call to Next.
func (r *Reader) Next() (Record, error) {
	for r.sc.Scan() {
		r.line++
		text := r.sc.Bytes()
		if len(text) > 0 && text[len(text)-1] == '\r' {
			text = text[:len(text)-1]
		}
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		rec, err := r.parse(string(text))
		if err != nil {
			return Record{}, &LineError{Line: r.line, Err: err}
		}
		return rec, nil
	}
	if err := r.sc.Err(); err != nil {
		return Record{}, &LineError{Line: r.line + 1, Err: err}
	}
	return Record{}, io.EOF
}

func (r *Reader) parse(line string) (Record, error) {
	lsnText, rest, ok := strings.Cut(line, "\t")
	if !ok {
		return Record{}, fmt.Errorf("%w: want 3 tab-separated columns", ErrSyntax)
	}
	xidText, hexText, ok := strings.Cut(rest, "\t")
	if !ok || strings.Contains(hexText, "\t") {
		return Record{}, fmt.Errorf("%w: want 3 tab-separated columns", ErrSyntax)
	}
	lsn, err := decoding.ParseLSN(lsnText)
	if err != nil {
		return Record{}, fmt.Errorf("%w: lsn %q", ErrSyntax, lsnText)
	}
	var xid uint64
	if xidText != "" {
		xid, err = strconv.ParseUint(xidText, 10, 32)
		if err != nil {
			return Record{}, fmt.Errorf("%w: xid %q", ErrSyntax, xidText)
		}
	}
	hexText = strings.TrimPrefix(hexText, `\x`)
	if len(hexText)%2 != 0 {
		return Record{}, fmt.Errorf("%w: odd number of hex digits", ErrSyntax)
	}
	n := len(hexText) / 2
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	data := r.buf[:n]
	if _, err := hex.Decode(data, []byte(hexText)); err != nil {
		return Record{}, fmt.Errorf("%w: data: %v", ErrSyntax, err)
	}
	if n == 0 {
		return Record{}, fmt.Errorf("%w: empty message", ErrSyntax)
	}
	return Record{LSN: lsn, Xid: uint32(xid), Data: data}, nil
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
	w.hex = w.hex[:0]
	w.hex = fmt.Appendf(w.hex, "%s\t%d\t", rec.LSN, rec.Xid)
	w.hex = hex.AppendEncode(w.hex, rec.Data)
	w.hex = append(w.hex, '\n')
	_, err := w.w.Write(w.hex)
	return err
}

// Flush writes any buffered data.
func (w *Writer) Flush() error { return w.w.Flush() }
