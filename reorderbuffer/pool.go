package reorderbuffer

// pool accounts the memory that holds transaction records and keeps the chunks let go of by
// spilling, truncation and release, by size class (the powers of two from minChunk to the
// largest chunk), for the next records, up to freeCap bytes: spilling a large transaction then
// turns over the same memory instead of making garbage for the collector.
//
// Invariants (checked by the buffer's CheckInvariants):
//   - mem is the capacity of every chunk a transaction holds plus freeBytes;
//   - freeBytes is the capacity of the free chunks, each empty and of its class's size;
//   - freeBytes <= freeCap.
type pool struct {
	limit     int64
	shared    *Memory // Config.Memory: mem is counted there too, with the consumer's bytes
	mem       int64   // bytes counted: chunks held by transactions, and free chunks
	peak      int64   // highest mem
	chunkMax  int     // largest memlog chunk: a power of two near a quarter of the limit, within [minChunk, maxChunk]
	spare     [9][][]byte
	freeBytes int64
	freeCap   int64 // most bytes of free chunks kept: min(limit, DefaultWorkMem)
}

func newPool(limit int64, shared *Memory) pool {
	p := pool{limit: limit, shared: shared, chunkMax: minChunk, freeCap: min(limit, DefaultWorkMem)}
	if shared != nil {
		p.freeCap = min(limit/4, DefaultWorkMem) // free chunks count against the consumer's room too
	}
	for int64(p.chunkMax*2) <= limit/4 && p.chunkMax < maxChunk {
		p.chunkMax *= 2
	}
	return p
}

func chunkClass(size int) int {
	c := 0
	for s := minChunk; s < size; s <<= 1 {
		c++
	}
	return c
}

// hasFree reports whether a free chunk of exactly size bytes is kept.
func (p *pool) hasFree(size int) bool {
	k := chunkClass(size)
	return p.freeBytes > 0 && k < len(p.spare) && minChunk<<k == size && len(p.spare[k]) > 0
}

// takeFree returns a free chunk of exactly size bytes, or nil. Its bytes stay counted in mem.
func (p *pool) takeFree(size int) []byte {
	if !p.hasFree(size) {
		return nil
	}
	k := chunkClass(size)
	l := p.spare[k]
	c := l[len(l)-1]
	l[len(l)-1] = nil
	p.spare[k] = l[:len(l)-1]
	p.freeBytes -= int64(cap(c))
	return c
}

// alloc returns a new chunk of size bytes and counts it. The caller has made room for it.
func (p *pool) alloc(size int) []byte {
	p.count(int64(size))
	p.peak = max(p.peak, p.mem)
	return make([]byte, 0, size)
}

// recycle keeps c, a chunk a transaction lets go of, as a free chunk if there is room; it
// reports whether it did. A chunk not kept is the caller's to uncount (release).
func (p *pool) recycle(c []byte) bool {
	n := cap(c)
	k := chunkClass(n)
	if k >= len(p.spare) || minChunk<<k != n || p.freeBytes+int64(n) > p.freeCap {
		return false
	}
	p.spare[k] = append(p.spare[k], c[:0])
	p.freeBytes += int64(n)
	return true
}

// release uncounts n bytes of chunks let go of and not recycled.
func (p *pool) release(n int64) { p.count(-n) }

// count adds n (which may be negative) to the bytes counted.
func (p *pool) count(n int64) {
	p.mem += n
	if p.shared != nil {
		p.shared.add(n)
	}
}

// over reports whether n more bytes would exceed the limit: the pool's bytes, and with a shared
// Memory the consumer's too.
func (p *pool) over(n int64) bool {
	used := p.mem
	if p.shared != nil {
		used = p.shared.used.Load()
	}
	return used+n > p.limit
}

// close uncounts everything, for a Buffer that is closed: a shared Memory keeps only the
// consumer's bytes.
func (p *pool) close() {
	p.count(-p.mem)
	p.spare = [len(p.spare)][][]byte{}
	p.freeBytes = 0
}

// dropFree lets go of the largest free chunk; it reports whether there was one.
func (p *pool) dropFree() bool {
	for k := len(p.spare) - 1; k >= 0; k-- {
		if l := p.spare[k]; len(l) > 0 {
			n := int64(cap(l[len(l)-1]))
			l[len(l)-1] = nil
			p.spare[k] = l[:len(l)-1]
			p.freeBytes -= n
			p.count(-n)
			return true
		}
	}
	return false
}

// check verifies the free lists against freeBytes.
func (p *pool) check() error {
	var free int64
	for k, l := range p.spare {
		for _, c := range l {
			if cap(c) != minChunk<<k || len(c) != 0 {
				return errorf("pool: free chunk of cap %d len %d in class %d", cap(c), len(c), k)
			}
			free += int64(cap(c))
		}
	}
	if free != p.freeBytes {
		return errorf("pool: free chunks hold %d bytes, counted %d", free, p.freeBytes)
	}
	if p.freeBytes > p.freeCap {
		return errorf("pool: %d bytes of free chunks, more than the cap %d", p.freeBytes, p.freeCap)
	}
	return nil
}
