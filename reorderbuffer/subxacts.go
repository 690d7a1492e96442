package reorderbuffer

import "encoding/binary"

// subxacts remembers, for one streamed transaction, where the first change of each subtransaction
// sits in the transaction's record sequence, in the order the subtransactions first appeared — the
// list PostgreSQL's subscriber keeps in its .subxacts file (worker.c, subxact_info_add).
//
// A Stream Abort of subtransaction s cuts the transaction back to s's position and forgets s and
// every subtransaction that appeared after it.
//
// Entries whose records are still in memory hold memlog positions (mem); eviction converts them to
// spill-log offsets and moves them into compact blocks (spilled). Both parts are split into blocks
// of blockLen entries carrying the minimum and maximum xid they hold, so that a membership test
// skips most blocks even with a million subtransactions, and the spilled part costs about 4 bytes
// per subtransaction.
type subxacts struct {
	spilled []spillBlock
	mem     []memSub
	memMin  []uint32 // per blockLen entries of mem
	memMax  []uint32
	maxXid  uint32 // largest xid present (raw comparison); a larger xid is certainly new
	last    uint32 // the xid found or added last: the common case of consecutive changes
	hasLast bool
	n       int
}

const blockLen = 128

type memSub struct {
	xid uint32
	pos int64
}

// spillBlock holds up to blockLen entries: the first in base fields, the others delta-encoded in
// data as zigzag-varint(xid - previous xid), uvarint(offset - previous offset).
type spillBlock struct {
	minXid, maxXid uint32
	firstXid       uint32
	firstOff       int64
	lastXid        uint32
	lastOff        int64
	n              int
	data           []byte
}

// overhead returns an estimate of the bytes the list retains.
func (s *subxacts) overhead() int64 {
	b := int64(cap(s.mem))*16 + int64(cap(s.memMin)+cap(s.memMax))*4 + int64(cap(s.spilled))*80
	for i := range s.spilled {
		b += int64(cap(s.spilled[i].data))
	}
	return b
}

// contains reports whether xid has an entry.
func (s *subxacts) contains(xid uint32) bool {
	if s.hasLast && xid == s.last {
		return true
	}
	if s.n == 0 || xid > s.maxXid {
		return false
	}
	if i := s.findMem(xid); i >= 0 {
		return true
	}
	b, _, _ := s.findSpilled(xid)
	return b >= 0
}

// addMem records that xid's first change is at memlog position pos.
func (s *subxacts) addMem(xid uint32, pos int64) {
	i := len(s.mem)
	if i%blockLen == 0 {
		s.memMin = append(s.memMin, xid)
		s.memMax = append(s.memMax, xid)
	} else {
		b := i / blockLen
		s.memMin[b] = min(s.memMin[b], xid)
		s.memMax[b] = max(s.memMax[b], xid)
	}
	s.mem = append(s.mem, memSub{xid, pos})
	if s.n == 0 || xid > s.maxXid {
		s.maxXid = xid
	}
	s.n++
	s.last, s.hasLast = xid, true
}

// findMem returns the index in mem of xid's entry, or -1, searching from the tail.
func (s *subxacts) findMem(xid uint32) int {
	for b := len(s.memMin) - 1; b >= 0; b-- {
		if xid < s.memMin[b] || xid > s.memMax[b] {
			continue
		}
		hi := min((b+1)*blockLen, len(s.mem))
		for i := hi - 1; i >= b*blockLen; i-- {
			if s.mem[i].xid == xid {
				return i
			}
		}
	}
	return -1
}

// findSpilled returns the block and entry index of xid's entry and its spill offset, or b = -1.
func (s *subxacts) findSpilled(xid uint32) (b, j int, off int64) {
	for b = len(s.spilled) - 1; b >= 0; b-- {
		blk := &s.spilled[b]
		if xid < blk.minXid || xid > blk.maxXid {
			continue
		}
		found := -1
		var foundOff int64
		blk.each(func(k int, x uint32, o int64) {
			if x == xid { // xids are unique within the list; keep scanning is harmless
				found, foundOff = k, o
			}
		})
		if found >= 0 {
			return b, found, foundOff
		}
	}
	return -1, 0, 0
}

// each calls f for every entry of the block in order.
func (blk *spillBlock) each(f func(k int, xid uint32, off int64)) {
	if blk.n == 0 {
		return
	}
	x, o := blk.firstXid, blk.firstOff
	f(0, x, o)
	p := 0
	for k := 1; k < blk.n; k++ {
		dx, n1 := binary.Varint(blk.data[p:])
		p += n1
		do, n2 := binary.Uvarint(blk.data[p:])
		p += n2
		x = uint32(int64(x) + dx)
		o += int64(do)
		f(k, x, o)
	}
}

func (blk *spillBlock) add(xid uint32, off int64) {
	if blk.n == 0 {
		blk.firstXid, blk.firstOff = xid, off
		blk.minXid, blk.maxXid = xid, xid
		if blk.data == nil {
			blk.data = make([]byte, 0, 3*blockLen)
		}
	} else {
		blk.data = binary.AppendVarint(blk.data, int64(xid)-int64(blk.lastXid))
		blk.data = binary.AppendUvarint(blk.data, uint64(off-blk.lastOff))
		blk.minXid = min(blk.minXid, xid)
		blk.maxXid = max(blk.maxXid, xid)
	}
	blk.lastXid, blk.lastOff = xid, off
	blk.n++
}

func (s *subxacts) addSpilled(xid uint32, off int64) {
	if len(s.spilled) == 0 || s.spilled[len(s.spilled)-1].n == blockLen {
		s.spilled = append(s.spilled, spillBlock{})
	}
	s.spilled[len(s.spilled)-1].add(xid, off)
}

// cutMem forgets the in-memory entry i and every entry after it.
func (s *subxacts) cutMem(i int) {
	s.mem = s.mem[:i]
	nb := (i + blockLen - 1) / blockLen
	s.memMin = s.memMin[:nb]
	s.memMax = s.memMax[:nb]
	if nb > 0 { // recompute the bounds of the last, now partial, block
		lo := (nb - 1) * blockLen
		s.memMin[nb-1], s.memMax[nb-1] = s.mem[lo].xid, s.mem[lo].xid
		for _, e := range s.mem[lo:] {
			s.memMin[nb-1] = min(s.memMin[nb-1], e.xid)
			s.memMax[nb-1] = max(s.memMax[nb-1], e.xid)
		}
	}
	s.recount()
}

// cutSpilled forgets spilled entry (b, j), every later spilled entry and every in-memory entry.
func (s *subxacts) cutSpilled(b, j int) {
	old := s.spilled[b]
	s.spilled = s.spilled[:b]
	if j > 0 {
		var nb spillBlock
		old.each(func(k int, x uint32, o int64) {
			if k < j {
				nb.add(x, o)
			}
		})
		s.spilled = append(s.spilled, nb)
	}
	s.mem, s.memMin, s.memMax = s.mem[:0], s.memMin[:0], s.memMax[:0]
	s.recount()
}

// recount recomputes n and maxXid after a cut, and drops the last-xid cache.
func (s *subxacts) recount() {
	s.n = len(s.mem)
	s.maxXid = 0
	for _, blk := range s.spilled {
		s.n += blk.n
		s.maxXid = max(s.maxXid, blk.maxXid)
	}
	for _, m := range s.memMax {
		s.maxXid = max(s.maxXid, m)
	}
	s.hasLast = false
}
