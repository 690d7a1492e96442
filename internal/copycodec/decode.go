// Package copycodec encodes and decodes the data of COPY's text and binary formats: apply
// encodes the rows it sends with COPY ... FROM STDIN, snapshot decodes what COPY ... TO STDOUT
// sends. Values are never converted: a field is the bytes of its type's text output or send
// format, as pgoutput sends them too.
package copycodec

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/pgreorder/pgreorder/decoding"
)

// binarySignature starts the output of COPY ... (FORMAT binary).
const binarySignature = "PGCOPY\n\xff\r\n\x00"

// RowReader parses the data of COPY ... TO STDOUT, in the text or the binary format, into
// tuples of a known number of columns. It is an io.Writer: pgconn's CopyTo writes each CopyData
// message to it, and the rows are handed to emit as soon as they are complete, in whatever pieces
// the data arrives.
//
// A tuple handed to emit, and the Data of its columns, are valid until emit returns: they alias
// the data being written or the reader's own buffers.
type RowReader struct {
	binary bool
	ncols  int
	// kinds gives the Kind of each non-NULL column: decoding.ColumnText, or ColumnBinary (binary
	// format only).
	kinds []byte
	emit  func(decoding.Tuple) error

	pending []byte // the start of a row not complete yet
	unesc   []byte // unescaped text values of the current row
	offs    []int  // where each value of the current row starts in unesc; -1 for NULL
	tuple   decoding.Tuple
	header  bool  // binary: the header was read
	trailer bool  // binary: the trailer was read
	rows    int64 // rows emitted
}

// FormatError reports COPY data that does not parse.
type FormatError struct {
	Row     int64 // the row, from 1
	Problem string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("malformed COPY data at row %d: %s", e.Row, e.Problem)
}

// NewRowReader returns a reader of rows of len(kinds) columns, in the binary format or the text
// format, that hands each row to emit.
func NewRowReader(binary bool, kinds []byte, emit func(decoding.Tuple) error) *RowReader {
	return &RowReader{binary: binary, ncols: len(kinds), kinds: kinds, emit: emit,
		tuple: make(decoding.Tuple, len(kinds)), offs: make([]int, len(kinds))}
}

// Write parses p, emitting every row it completes. The part of a row that p leaves incomplete
// is kept for the next Write. An error from emit is returned as it is.
func (r *RowReader) Write(p []byte) (int, error) {
	n := len(p)
	data := p
	if len(r.pending) > 0 {
		r.pending = append(r.pending, p...)
		data = r.pending
	}
	for len(data) > 0 {
		used, err := r.next(data)
		if err != nil {
			return 0, err
		}
		if used == 0 {
			break
		}
		data = data[used:]
	}
	if len(r.pending) > 0 {
		// data is a suffix of pending.
		r.pending = r.pending[:copy(r.pending, data)]
	} else {
		r.pending = append(r.pending, data...)
	}
	return n, nil
}

// Rows returns the number of rows emitted.
func (r *RowReader) Rows() int64 { return r.rows }

// Finish reports an error if the data ended inside a row, or (binary) without its trailer.
func (r *RowReader) Finish() error {
	if len(r.pending) > 0 {
		return &FormatError{Row: r.rows + 1, Problem: fmt.Sprintf("data ends inside a row (%d bytes left)", len(r.pending))}
	}
	if r.binary && !r.trailer {
		return &FormatError{Row: r.rows + 1, Problem: "binary data ends without its trailer"}
	}
	return nil
}

// next parses one row (or the binary header or trailer) at the start of data and returns the
// number of bytes it used, 0 if data does not hold a complete one yet.
func (r *RowReader) next(data []byte) (int, error) {
	if r.binary {
		return r.nextBinary(data)
	}
	return r.nextText(data)
}

// nextText parses one line of the text format: values separated by tabs, \N for NULL,
// backslash escapes for the rest.
func (r *RowReader) nextText(data []byte) (int, error) {
	end := bytes.IndexByte(data, '\n')
	if end < 0 {
		return 0, nil
	}
	line := data[:end]
	if r.ncols == 0 {
		// A table without columns: each row is an empty line.
		if end != 0 {
			return 0, r.textError("more than 0 values")
		}
		if err := r.row(); err != nil {
			return 0, err
		}
		return 1, nil
	}
	r.unesc = r.unesc[:0]
	col := 0
	for start := 0; ; col++ {
		stop := bytes.IndexByte(line[start:], '\t')
		last := stop < 0
		if last {
			stop = len(line)
		} else {
			stop += start
		}
		if col >= r.ncols {
			return 0, r.textError(fmt.Sprintf("more than %d values", r.ncols))
		}
		field := line[start:stop]
		switch {
		case len(field) == 2 && field[0] == '\\' && field[1] == 'N':
			r.offs[col] = -1
			r.tuple[col] = decoding.Column{Kind: decoding.ColumnNull}
		case bytes.IndexByte(field, '\\') < 0:
			// Nothing to unescape: the value is the field itself.
			r.offs[col] = -2
			r.tuple[col] = decoding.Column{Kind: r.kinds[col], Data: field}
		default:
			r.offs[col] = len(r.unesc)
			var err error
			if r.unesc, err = unescape(r.unesc, field); err != nil {
				return 0, r.textError(err.Error())
			}
			r.tuple[col] = decoding.Column{Kind: r.kinds[col]}
		}
		if last {
			break
		}
		start = stop + 1
	}
	if col+1 != r.ncols {
		return 0, r.textError(fmt.Sprintf("%d values, want %d", col+1, r.ncols))
	}
	// The unescaped values, now that unesc no longer moves.
	for i := range r.ncols {
		if o := r.offs[i]; o >= 0 {
			e := len(r.unesc)
			for j := i + 1; j < r.ncols; j++ {
				if r.offs[j] >= 0 {
					e = r.offs[j]
					break
				}
			}
			r.tuple[i].Data = r.unesc[o:e:e]
		}
	}
	if err := r.row(); err != nil {
		return 0, err
	}
	return end + 1, nil
}

func (r *RowReader) textError(problem string) error {
	return &FormatError{Row: r.rows + 1, Problem: "text format: " + problem}
}

// unescape appends the value of a text-format field with backslash escapes to dst.
func unescape(dst, field []byte) ([]byte, error) {
	for i := 0; i < len(field); i++ {
		c := field[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		if i == len(field) {
			return dst, fmt.Errorf("value ends with a lone backslash")
		}
		c = field[i]
		switch c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'v':
			dst = append(dst, '\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			// Up to three octal digits.
			v := int(c - '0')
			for k := 0; k < 2 && i+1 < len(field) && field[i+1] >= '0' && field[i+1] <= '7'; k++ {
				i++
				v = v*8 + int(field[i]-'0')
			}
			dst = append(dst, byte(v))
		case 'x':
			// Up to two hex digits; "\x" alone is an x.
			v, k := 0, 0
			for ; k < 2 && i+1 < len(field) && isHex(field[i+1]); k++ {
				i++
				v = v*16 + hexVal(field[i])
			}
			if k == 0 {
				dst = append(dst, 'x')
			} else {
				dst = append(dst, byte(v))
			}
		case 'N':
			return dst, fmt.Errorf(`\N inside a value`)
		default:
			dst = append(dst, c) // any other character stands for itself
		}
	}
	return dst, nil
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	default:
		return int(c-'A') + 10
	}
}

// nextBinary parses the header, one tuple or the trailer of the binary format.
func (r *RowReader) nextBinary(data []byte) (int, error) {
	if r.trailer {
		return 0, r.binaryError(fmt.Sprintf("%d bytes after the trailer", len(data)))
	}
	if !r.header {
		// Signature, flags, header extension length, extension.
		if len(data) < len(binarySignature) {
			if !bytes.HasPrefix([]byte(binarySignature), data) {
				return 0, r.binaryError("bad signature")
			}
			return 0, nil
		}
		if string(data[:len(binarySignature)]) != binarySignature {
			return 0, r.binaryError("bad signature")
		}
		if len(data) < len(binarySignature)+8 {
			return 0, nil
		}
		flags := binary.BigEndian.Uint32(data[11:])
		if flags&(1<<16) != 0 {
			return 0, r.binaryError("rows carry OIDs")
		}
		if flags&0xffff != 0 {
			return 0, r.binaryError(fmt.Sprintf("unknown critical flags %#x", flags&0xffff))
		}
		ext := binary.BigEndian.Uint32(data[15:])
		if uint64(len(data)) < 19+uint64(ext) {
			if ext > 1<<20 {
				return 0, r.binaryError(fmt.Sprintf("header extension of %d bytes", ext))
			}
			return 0, nil
		}
		r.header = true
		return 19 + int(ext), nil
	}
	if len(data) < 2 {
		return 0, nil
	}
	count := int16(binary.BigEndian.Uint16(data))
	if count == -1 {
		r.trailer = true
		if len(data) > 2 {
			return 0, r.binaryError(fmt.Sprintf("%d bytes after the trailer", len(data)-2))
		}
		return 2, nil
	}
	if int(count) != r.ncols {
		return 0, r.binaryError(fmt.Sprintf("%d values, want %d", count, r.ncols))
	}
	pos := 2
	for i := range r.ncols {
		if len(data) < pos+4 {
			return 0, nil
		}
		size := int32(binary.BigEndian.Uint32(data[pos:]))
		pos += 4
		switch {
		case size == -1:
			r.tuple[i] = decoding.Column{Kind: decoding.ColumnNull}
			continue
		case size < 0:
			return 0, r.binaryError(fmt.Sprintf("value %d has length %d", i+1, size))
		case len(data)-pos < int(size):
			return 0, nil
		}
		r.tuple[i] = decoding.Column{Kind: r.kinds[i], Data: data[pos : pos+int(size) : pos+int(size)]}
		pos += int(size)
	}
	if err := r.row(); err != nil {
		return 0, err
	}
	return pos, nil
}

func (r *RowReader) binaryError(problem string) error {
	return &FormatError{Row: r.rows + 1, Problem: "binary format: " + problem}
}

func (r *RowReader) row() error {
	r.rows++
	return r.emit(r.tuple)
}
