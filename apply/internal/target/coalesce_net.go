package target

import (
	"strconv"
	"unsafe"

	"github.com/pgreorder/pgreorder/decoding"
)

// Coalescing (see coalesce.go): what a table's held changes come to, key by key, and the arena
// their values are copied into.

// appendKey appends the key of tup (text values of the key columns) to b, or returns false when
// one is missing, NULL or not text.
func (nt *netTable) appendKey(b []byte, tup decoding.Tuple) ([]byte, bool) {
	for _, i := range nt.key {
		if i >= len(tup) || tup[i].Kind != decoding.ColumnText {
			return b, false
		}
		b = strconv.AppendInt(b, int64(len(tup[i].Data)), 10)
		b = append(b, ':')
		b = append(b, tup[i].Data...)
	}
	return b, true
}

// add holds a change, or returns false, changing nothing, when it cannot be held.
func (nt *netTable) add(op byte, tup, old decoding.Tuple, oldKind byte, src int32) bool {
	m := nt.m
	if !nt.keyed {
		if op != 'I' || len(tup) != len(m.cols) || !textRow(tup, false) {
			return false
		}
		tup = nt.arena.clone(tup)
		nt.log = append(nt.log, held{op: op, tup: tup, src: src})
		nt.rows = append(nt.rows, netRow{first: 'I', row: tup})
		return true
	}
	var ok bool
	switch op {
	case 'I':
		if len(tup) != len(m.cols) || !textRow(tup, false) {
			return false
		}
		nt.kbuf, ok = nt.appendKey(nt.kbuf[:0], tup)
	case 'U':
		if len(tup) != len(m.cols) || !textRow(tup, true) {
			return false
		}
		if !nt.full && len(nt.key) == len(m.cols) {
			return false // a table of only the key: a set UPDATE would write nothing, nor find its row
		}
		nt.kbuf, ok = nt.appendKey(nt.kbuf[:0], tup)
		if nt.full && !wholeRow(m, old, oldKind) {
			return false
		}
		if ok && (oldKind == 'K' || oldKind == 'O') {
			var okOld bool
			nt.obuf, okOld = nt.appendKey(nt.obuf[:0], old)
			ok = okOld && string(nt.obuf) == string(nt.kbuf) // else an update of the key
		}
	case 'D':
		if nt.full {
			if !wholeRow(m, old, oldKind) {
				return false
			}
		} else if oldKind != 'K' && oldKind != 'O' {
			return false
		}
		nt.kbuf, ok = nt.appendKey(nt.kbuf[:0], old)
	}
	if !ok {
		return false
	}
	i, seen := nt.keys[string(nt.kbuf)]
	var r netRow
	if seen {
		r = nt.rows[i]
	}
	switch op {
	case 'I':
		if seen && r.row != nil {
			return false // the row exists: the source would not insert it
		}
	case 'U', 'D':
		if seen && r.row == nil {
			return false // there is no row to change
		}
		if seen && nt.full && !sameTuple(old, r.row) {
			return false // not the row held: row by row finds no row, or another
		}
	}
	final := tup // the row at the end
	if op == 'U' && !textRow(tup, false) {
		if !seen {
			return false // unchanged values of a row not held
		}
		final = make(decoding.Tuple, len(tup))
		for j, c := range tup {
			if c.Kind == decoding.ColumnUnchanged {
				c = r.row[j]
			}
			final[j] = c
		}
	}
	h := held{op: op, oldKind: oldKind, src: src}
	switch op {
	case 'I', 'U':
		h.tup = nt.arena.clone(tup)
		if op == 'U' && (oldKind == 'K' || oldKind == 'O') {
			h.old = nt.arena.clone(old)
		}
	case 'D':
		h.old = nt.arena.clone(old)
	}
	nt.log = append(nt.log, h)
	if !seen {
		if nt.keys == nil {
			nt.keys = map[string]int{}
		}
		i = len(nt.rows)
		nt.keys[nt.arena.str(nt.kbuf)] = i
		r = netRow{first: op, key: h.tup}
		if op == 'D' || (nt.full && op == 'U') {
			r.key = h.old
		}
		nt.rows = append(nt.rows, r)
	}
	switch op {
	case 'I':
		if r.first != 'I' {
			r.del = true // deleted, then inserted again
		}
		r.row = h.tup
	case 'U':
		r.row = h.tup
		if &final[0] != &tup[0] {
			r.row = nt.arena.clone(final)
		}
	case 'D':
		r.row = nil
	}
	nt.rows[i] = r
	return true
}

// wholeRow reports whether old is a FULL old row a set statement can match: sent (kind 'O'),
// every column, text or NULL.
func wholeRow(m *Table, old decoding.Tuple, oldKind byte) bool {
	return oldKind == 'O' && len(old) == len(m.cols) && textRow(old, false)
}

// sameTuple reports whether a and b hold the same values, as sent.
func sameTuple(a, b decoding.Tuple) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Kind != b[i].Kind || string(a[i].Data) != string(b[i].Data) {
			return false
		}
	}
	return true
}

// arena hands out copies of tuples from larger blocks of memory, so that holding a change costs
// no allocation of its own. Memory handed out is never written again: a block is dropped (left
// to the collector, with the tuples that point into it) once full, never reused.
type arena struct {
	cols []decoding.Column
	data []byte
}

// Block sizes of an arena: the first blocks are small (a table with few changes in a group
// holds little), later ones up to the maximum.
const (
	arenaMinCols, arenaMaxCols = 16, 256
	arenaMinData, arenaMaxData = 256, 8 << 10
)

// str returns a string of b's bytes, copied into the arena: its memory is never written again,
// which is what a string needs (unsafe.String).
func (a *arena) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	a.reserve(len(b))
	d := len(a.data)
	a.data = append(a.data, b...)
	return unsafe.String(&a.data[d], len(b))
}

// reserve makes room for n more bytes in the current data block, taking a new one if needed.
func (a *arena) reserve(n int) {
	if a.data == nil || n > cap(a.data)-len(a.data) { // never nil: an empty value is not NULL
		a.data = make([]byte, 0, max(n, min(2*cap(a.data), arenaMaxData), arenaMinData))
	}
}

// clone returns a copy of tup, its values' bytes included, which nothing else refers to.
func (a *arena) clone(tup decoding.Tuple) decoding.Tuple {
	n := 0
	for _, c := range tup {
		n += len(c.Data)
	}
	if a.cols == nil || len(tup) > cap(a.cols)-len(a.cols) { // never nil: a tuple held is not the absent row
		a.cols = make([]decoding.Column, 0, max(len(tup), min(2*cap(a.cols), arenaMaxCols), arenaMinCols))
	}
	a.reserve(n)
	s := len(a.cols)
	a.cols = a.cols[:s+len(tup)]
	out := a.cols[s : s+len(tup) : s+len(tup)]
	for i, c := range tup {
		out[i] = decoding.Column{Kind: c.Kind}
		if c.Data != nil {
			d := len(a.data)
			a.data = append(a.data, c.Data...)
			out[i].Data = a.data[d:len(a.data):len(a.data)]
		}
	}
	return out
}
