package decoding

// Row changes (Insert, Update, Delete) are nearly all of a stream. Their layouts (layout.go) are
// walked here a second time, by hand, for the two calls that see every one of them:
// Decoder.Accept, which only needs to know that a change is well formed, and Parser.Parse, which
// decodes what the reorder buffer hands out. Both take these paths only for what they accept;
// anything else goes to the codec, which reports exactly what is wrong, so that the errors are the
// codec's in every case. FuzzParse and FuzzDecoder check that the paths agree on every
// input.

// rowStart returns the offset of what follows the relation id of a row change: the leading xid
// inside a stream, then the relation id, after the type byte. ok is false if data is too short.
func rowStart(data []byte, inStream bool) (off int, ok bool) {
	off = 5
	if inStream {
		off = 9
	}
	return off, len(data) >= off
}

// validRow reports whether data, whose type byte is that of a row change, is one that the codec
// would decode without error: the fields of its layout, and nothing after them.
func validRow(data []byte, inStream bool) bool {
	off, ok := rowStart(data, inStream)
	if !ok || off >= len(data) {
		return false
	}
	switch MessageType(data[0]) {
	case MsgInsert:
		if data[off] != 'N' {
			return false
		}
		off, ok = skipTuple(data, off+1)
	case MsgUpdate:
		if k := data[off]; k == 'K' || k == 'O' {
			if off, ok = skipTuple(data, off+1); !ok || off >= len(data) {
				return false
			}
		}
		if data[off] != 'N' {
			return false
		}
		off, ok = skipTuple(data, off+1)
	case MsgDelete:
		if k := data[off]; k != 'K' && k != 'O' {
			return false
		}
		off, ok = skipTuple(data, off+1)
	default:
		return false
	}
	return ok && off == len(data)
}

// skipTuple returns the offset after the TupleData at b[off:], and false if it is not one that
// codec.tuple accepts.
func skipTuple(b []byte, off int) (int, bool) {
	if len(b)-off < 2 {
		return 0, false
	}
	n := int(be.Uint16(b[off:]))
	off += 2
	if n > len(b)-off {
		return 0, false
	}
	for range n {
		if off >= len(b) {
			return 0, false
		}
		k := b[off]
		off++
		switch k {
		case ColumnNull, ColumnUnchanged:
		case ColumnText, ColumnBinary:
			if len(b)-off < 4 {
				return 0, false
			}
			l := int(int32(be.Uint32(b[off:])))
			off += 4
			if uint(l) > uint(len(b)-off) { // a negative l is a huge uint
				return 0, false
			}
			off += l
		default:
			return 0, false
		}
	}
	return off, true
}

// parseRow decodes the row change data into p's reused message, as the codec does (same
// columns, same buffers, same aliasing), and reports false, having decoded nothing that matters,
// for anything the codec would reject.
func (p *Parser) parseRow(data []byte, inStream bool) (Message, bool) {
	off, ok := rowStart(data, inStream)
	if !ok || off >= len(data) {
		return nil, false
	}
	var xid uint32
	if inStream {
		xid = be.Uint32(data[1:])
	}
	rel := be.Uint32(data[off-4:])
	switch MessageType(data[0]) {
	case MsgInsert:
		if data[off] != 'N' {
			return nil, false
		}
		m := &p.msgs.insert
		if m.New, off, ok = p.tuple(data, off+1, newTuple); !ok || off != len(data) {
			return nil, false
		}
		m.Xid, m.RelationID = xid, rel
		return m, true
	case MsgUpdate:
		m := &p.msgs.update
		m.OldKind, m.Old = 0, nil
		if k := data[off]; k == 'K' || k == 'O' {
			m.OldKind = k
			if m.Old, off, ok = p.tuple(data, off+1, oldTuple); !ok || off >= len(data) {
				return nil, false
			}
		}
		if data[off] != 'N' {
			return nil, false
		}
		if m.New, off, ok = p.tuple(data, off+1, newTuple); !ok || off != len(data) {
			return nil, false
		}
		m.Xid, m.RelationID = xid, rel
		return m, true
	case MsgDelete:
		m := &p.msgs.delete
		k := data[off]
		if k != 'K' && k != 'O' {
			return nil, false
		}
		if m.Old, off, ok = p.tuple(data, off+1, oldTuple); !ok || off != len(data) {
			return nil, false
		}
		m.Xid, m.RelationID, m.OldKind = xid, rel, k
		return m, true
	}
	return nil, false
}

// tuple decodes the TupleData at b[off:] into column buffer buf, as codec.tuple does, and returns
// the offset after it.
func (p *Parser) tuple(b []byte, off, buf int) (Tuple, int, bool) {
	if len(b)-off < 2 {
		return nil, 0, false
	}
	n := int(be.Uint16(b[off:]))
	off += 2
	if n > len(b)-off {
		return nil, 0, false
	}
	var cols Tuple
	switch {
	case n == 0:
		return noColumns[:], off, true
	case n <= len(p.bufs[buf]):
		cols = p.bufs[buf][:n:n]
	default:
		cols = make(Tuple, n)
		p.bufs[buf] = cols
	}
	for i := range cols {
		if off >= len(b) {
			return nil, 0, false
		}
		k := b[off]
		off++
		switch k {
		case ColumnNull, ColumnUnchanged:
			cols[i] = Column{Kind: k}
		case ColumnText, ColumnBinary:
			if len(b)-off < 4 {
				return nil, 0, false
			}
			l := int(int32(be.Uint32(b[off:])))
			off += 4
			if uint(l) > uint(len(b)-off) {
				return nil, 0, false
			}
			cols[i] = Column{Kind: k, Data: b[off : off+l : off+l]}
			off += l
		default:
			return nil, 0, false
		}
	}
	return cols, off, true
}
