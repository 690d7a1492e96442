package copycodec

import "encoding/binary"

// COPY ... FROM STDIN encoders. pgoutput sends each column in its type's text output format
// ('t') or, with binary 'true', in its send format ('b'); those are exactly the field formats of
// COPY's text and binary formats, so a run of inserts becomes COPY data without converting any
// value.

// BinaryHeader opens COPY binary data: the signature, a flags field (no OIDs) and an empty
// header extension.
var BinaryHeader = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// BinaryTrailer ends COPY binary data: a field count of -1.
var BinaryTrailer = []byte{0xff, 0xff}

// TextNull is how COPY's text format writes NULL by default.
const TextNull = `\N`

// escape[c] is the character that follows a backslash for a byte that COPY's text format
// must escape, or 0 for a byte written as is. Backslash introduces escapes, tab separates
// fields, and newline and carriage return end rows; every other byte (the server checks the
// encoding) stands for itself.
var escape = [256]byte{'\\': '\\', '\t': 't', '\n': 'n', '\r': 'r'}

// AppendTextValue appends v as one field of COPY's text format.
func AppendTextValue(dst, v []byte) []byte {
	start := 0
	for i, c := range v {
		if e := escape[c]; e != 0 {
			dst = append(dst, v[start:i]...)
			dst = append(dst, '\\', e)
			start = i + 1
		}
	}
	return append(dst, v[start:]...)
}

// AppendTextRow appends one row of COPY's text format: the fields separated by tabs, NULL
// as \N, and a newline.
func AppendTextRow(dst []byte, fields []Field) []byte {
	for i, f := range fields {
		if i > 0 {
			dst = append(dst, '\t')
		}
		if f.Null {
			dst = append(dst, TextNull...)
			continue
		}
		dst = AppendTextValue(dst, f.Data)
	}
	return append(dst, '\n')
}

// AppendBinaryRow appends one tuple of COPY's binary format: the field count, then each
// field's length (-1 for NULL) and bytes.
func AppendBinaryRow(dst []byte, fields []Field) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(fields)))
	for _, f := range fields {
		if f.Null {
			dst = binary.BigEndian.AppendUint32(dst, 0xffffffff)
			continue
		}
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(f.Data)))
		dst = append(dst, f.Data...)
	}
	return dst
}

// Field is one value of a row to send: its bytes (in the format of the COPY data: the type's
// text output or its send format) or NULL.
type Field struct {
	Data []byte
	Null bool
}
