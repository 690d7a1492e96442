package reorderbuffer

import "encoding/binary"

// memlog is a transaction's in-memory, append-only sequence of records.
//
// Records are framed as uvarint(len) || bytes and packed into chunks that grow geometrically from
// minChunk to maxChunk bytes; a record never spans two chunks (a record larger than maxChunk gets a
// chunk of its own, sized exactly). The bytes a memlog retains are exactly the capacities of its
// chunks, which is what the buffer accounts: no hidden per-record allocations, no pointers for the
// garbage collector to trace.
//
// Positions are byte offsets into the concatenation of all framed records, counted from the start of
// the memlog (0 after reset). A position returned by end() is a record boundary until the memlog is
// truncated before it or reset.
type memlog struct {
	chunks []chunk
	size   int64 // position after the last record
	capSum int64 // sum of cap(chunks[i].b)
}

// chunk is one of a memlog's chunks and the position of its first byte.
type chunk struct {
	b     []byte
	start int64
}

const (
	minChunk = 256
	maxChunk = 64 << 10
)

// end returns the position after the last record.
func (m *memlog) end() int64 { return m.size }

// bytes returns the memory the memlog retains.
func (m *memlog) bytes() int64 { return m.capSum }

// chunkFor returns the capacity of the chunk that appending a record of n bytes would
// allocate, or 0 if the record fits in the last chunk. Chunks grow up to maxSize (at least
// minChunk, at most maxChunk), or to the record's size if larger.
func (m *memlog) chunkFor(n, maxSize int) int {
	need := uvarintLen(uint64(n)) + n
	last := len(m.chunks) - 1
	if last >= 0 && cap(m.chunks[last].b)-len(m.chunks[last].b) >= need {
		return 0
	}
	size := minChunk
	if last >= 0 {
		size = min(2*cap(m.chunks[last].b), maxSize)
	}
	return max(size, need)
}

// appendRecord appends a record made of the concatenation of parts. If chunkFor said a chunk
// is needed, chunk must be an empty slice of at least that capacity; it becomes the last chunk.
func (m *memlog) appendRecord(c []byte, parts ...[]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if c != nil {
		m.addChunk(c)
	}
	last := len(m.chunks) - 1
	c = binary.AppendUvarint(m.chunks[last].b, uint64(n))
	for _, p := range parts {
		c = append(c, p...)
	}
	m.chunks[last].b = c
	m.size += int64(uvarintLen(uint64(n)) + n)
}

// addChunk makes c, an empty slice, the last chunk. The list of chunks starts with room for
// two: the first chunk is small, so most small transactions take a second one, and the list is
// allocated once.
func (m *memlog) addChunk(c []byte) {
	if m.chunks == nil {
		m.chunks = make([]chunk, 0, 2)
	}
	m.chunks = append(m.chunks, chunk{b: c[:0], start: m.size})
	m.capSum += int64(cap(c))
}

// appendRecord2 is appendRecord of the two parts head and body, without the slice of parts.
func (m *memlog) appendRecord2(c, head, body []byte) {
	n := len(head) + len(body)
	if c != nil {
		m.addChunk(c)
	}
	last := &m.chunks[len(m.chunks)-1]
	b := last.b
	if i := len(b); n < 0x80 && cap(b)-i > n { // the record fits (chunkFor said so): write it in place
		b = b[:i+1+n]
		b[i] = byte(n)
		if len(head) == 1 { // an in-stream change's type byte: no call to copy it
			b[i+1] = head[0]
		} else {
			copy(b[i+1:], head)
		}
		copy(b[i+1+len(head):], body)
		last.b = b
		m.size += int64(1 + n)
		return
	}
	b = binary.AppendUvarint(b, uint64(n))
	b = append(b, head...)
	last.b = append(b, body...)
	m.size += int64(uvarintLen(uint64(n)) + n)
}

// truncate drops every record at or after pos, which must be a record boundary. Each chunk it
// drops is offered to recycle; it returns the capacity of the chunks recycle did not keep.
func (m *memlog) truncate(pos int64, recycle func([]byte) bool) (released int64) {
	if pos >= m.size {
		return 0
	}
	if pos <= 0 {
		return m.reset(recycle)
	}
	// The chunk holding pos is the last one starting at or before it.
	i := len(m.chunks) - 1
	for i > 0 && m.chunks[i].start > pos {
		i--
	}
	m.chunks[i].b = m.chunks[i].b[:pos-m.chunks[i].start]
	keep := i + 1
	if len(m.chunks[i].b) == 0 {
		keep = i
	}
	for j := keep; j < len(m.chunks); j++ {
		c := m.chunks[j].b
		m.capSum -= int64(cap(c))
		if !recycle(c) {
			released += int64(cap(c))
		}
		m.chunks[j] = chunk{}
	}
	m.chunks = m.chunks[:keep]
	m.size = pos
	return released
}

// reset drops every record, offering each chunk to recycle, and returns the capacity of the
// chunks recycle did not keep. Positions start again at 0. The list of chunks goes too, so that
// an emptied memlog (a spilled transaction's) costs nothing besides itself.
func (m *memlog) reset(recycle func([]byte) bool) (released int64) {
	for _, c := range m.chunks {
		if !recycle(c.b) {
			released += int64(cap(c.b))
		}
	}
	m.chunks = nil
	m.size, m.capSum = 0, 0
	return released
}

// at returns the record at chunk index *idx, byte offset *off, and moves them past it; ok is
// false after the last record. Start with both at 0. The slice aliases the memlog and is valid
// until the memlog is next modified. Unlike all, a caller may stop and resume at will, and a
// memlog reset in between ends the walk instead of reading freed chunks.
func (m *memlog) at(idx, off *int) (rec []byte, ok bool) {
	for *idx < len(m.chunks) {
		c := m.chunks[*idx].b
		if *off < len(c) {
			l, k := binary.Uvarint(c[*off:])
			start := *off + k
			end := start + int(l)
			*off = end
			return c[start:end:end], true
		}
		*idx++
		*off = 0
	}
	return nil, false
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}
