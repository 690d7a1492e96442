package target

import (
	"encoding/binary"
	"math"
	"strconv"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgreorder/pgreorder/decoding"
)

// The value arrays of set statements (see coalesce.go).

// setArgs are the parameters of a set statement: one array per column, each of the column's
// array type, in the text or the binary format (see columnArray).
type setArgs struct {
	vals [][]byte
	oids []uint32
	fmts []int16
}

// add appends the array of column c's values in rows.
func (a *setArgs) add(m *Table, rows []decoding.Tuple, c int) {
	v, f := columnArray(m, rows, c)
	a.vals, a.oids, a.fmts = append(a.vals, v), append(a.oids, m.cols[c].arrayOID), append(a.fmts, f)
}

// keyArrays returns the arrays of the key columns of rows.
func keyArrays(m *Table, key []int, rows []decoding.Tuple) setArgs {
	a := setArgs{make([][]byte, 0, len(key)), make([]uint32, 0, len(key)), make([]int16, 0, len(key))}
	for _, c := range key {
		a.add(m, rows, c)
	}
	return a
}

// allArrays returns the arrays of every column of rows.
func allArrays(m *Table, rows []decoding.Tuple) setArgs {
	n := len(m.cols)
	a := setArgs{make([][]byte, 0, n), make([]uint32, 0, n), make([]int16, 0, n)}
	for c := range m.cols {
		a.add(m, rows, c)
	}
	return a
}

// columnArray returns the array of column c's values in rows, and its format (0 text, 1
// binary). An array of text, varchar or bpchar goes in the binary format, its elements the
// values' own bytes, and so does one of int2, int4 or int8, its elements the values parsed:
// the server then reads neither quotes nor escapes, and runs no element's input function (in
// array_in, the text of a long value costs a call per byte). Any other array goes as text.
func columnArray(m *Table, rows []decoding.Tuple, c int) ([]byte, int16) {
	if elem, size, ok := binaryElem(m.cols[c].arrayOID); ok {
		if b, ok := binaryArray(rows, c, elem, size); ok {
			return b, 1
		}
	}
	return textArray(rows, c, m.cols[c].delim), 0
}

// binaryElem returns, for an array type whose binary format set statements use, its element
// type and the size of an integer element (0: a text type, whose binary form is its text).
func binaryElem(arrayOID uint32) (elem uint32, size int, ok bool) {
	switch arrayOID {
	case pgtype.Int2ArrayOID:
		return pgtype.Int2OID, 2, true
	case pgtype.Int4ArrayOID:
		return pgtype.Int4OID, 4, true
	case pgtype.Int8ArrayOID:
		return pgtype.Int8OID, 8, true
	case pgtype.TextArrayOID:
		return pgtype.TextOID, 0, true
	case pgtype.VarcharArrayOID:
		return pgtype.VarcharOID, 0, true
	case pgtype.BPCharArrayOID:
		return pgtype.BPCharOID, 0, true
	}
	return 0, 0, false
}

// binaryArray returns column c's values in rows as a one-dimensional array of elem in the
// binary format (array_recv's): the dimensions, then each element's length (-1 for NULL) and
// bytes. With size > 0 each value is the text of an integer of that many bytes; ok is false if
// one is not.
func binaryArray(rows []decoding.Tuple, c int, elem uint32, size int) (b []byte, ok bool) {
	n, null := 20, false
	for _, r := range rows {
		switch v := r[c]; {
		case v.Kind == decoding.ColumnNull:
			null = true
			n += 4
		case size > 0:
			n += 4 + size
		default:
			n += 4 + len(v.Data)
		}
	}
	b = make([]byte, 0, n)
	hasNull := uint32(0)
	if null {
		hasNull = 1
	}
	b = binary.BigEndian.AppendUint32(b, 1) // dimensions
	b = binary.BigEndian.AppendUint32(b, hasNull)
	b = binary.BigEndian.AppendUint32(b, elem)
	b = binary.BigEndian.AppendUint32(b, uint32(len(rows)))
	b = binary.BigEndian.AppendUint32(b, 1) // lower bound
	for _, r := range rows {
		v := r[c]
		switch {
		case v.Kind == decoding.ColumnNull:
			b = binary.BigEndian.AppendUint32(b, math.MaxUint32) // -1
		case size > 0:
			x, err := strconv.ParseInt(string(v.Data), 10, 8*size)
			if err != nil {
				return nil, false
			}
			b = binary.BigEndian.AppendUint32(b, uint32(size))
			switch size {
			case 2:
				b = binary.BigEndian.AppendUint16(b, uint16(x))
			case 4:
				b = binary.BigEndian.AppendUint32(b, uint32(x))
			default:
				b = binary.BigEndian.AppendUint64(b, uint64(x))
			}
		default:
			b = binary.BigEndian.AppendUint32(b, uint32(len(v.Data)))
			b = append(b, v.Data...)
		}
	}
	return b, true
}

// textArray returns the text of the array of column c's values in rows, its elements separated
// by delim: each element quoted (so that neither the delimiter nor braces, spaces or the word
// NULL in a value mean anything), NULL unquoted.
func textArray(rows []decoding.Tuple, c int, delim byte) []byte {
	n := 2
	for _, r := range rows {
		n += len(r[c].Data) + 3
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, r := range rows {
		if i > 0 {
			b = append(b, delim)
		}
		v := r[c]
		if v.Kind == decoding.ColumnNull {
			b = append(b, "NULL"...)
			continue
		}
		b = append(b, '"')
		for _, ch := range v.Data {
			if ch == '"' || ch == '\\' {
				b = append(b, '\\')
			}
			b = append(b, ch)
		}
		b = append(b, '"')
	}
	return append(b, '}')
}
