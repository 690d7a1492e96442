package reorderbuffer

import "sync/atomic"

// Memory is one memory limit that a Buffer shares with what its consumer keeps of the
// transactions it handed out, such as copies of changes queued for goroutines that apply them
// later (package apply's workers). The two together stay within the limit, each side spilling
// what does not fit, instead of each holding a fixed part of it: while the consumer holds little,
// the Buffer may use the whole limit, and the other way round.
//
// The Buffer counts its records in it (Config.Memory); the consumer takes room with Take and
// gives it back with Give. Its methods are safe for concurrent use. A Memory serves one Buffer
// at a time.
type Memory struct {
	limit int64
	used  atomic.Int64
	peak  *atomic.Int64
	short atomic.Bool // Take refused room: the Buffer drops its free chunks at its next Next
}

// NewMemory returns a Memory whose limit is workMem as Config.WorkMem reads it: 0 means
// DefaultWorkMem, SpillEverything none.
func NewMemory(workMem int64) *Memory {
	c := Config{WorkMem: workMem}
	return &Memory{limit: c.limit()}
}

// TrackPeak makes the Memory raise peak to the most bytes it has counted at once. Call it before
// the Memory is used; several Memories may share one peak (one per session of a consumer).
func (m *Memory) TrackPeak(peak *atomic.Int64) { m.peak = peak }

// add counts n more bytes (n may be negative) and keeps the peak.
func (m *Memory) add(n int64) {
	u := m.used.Add(n)
	if n > 0 {
		m.raisePeak(u)
	}
}

// raisePeak raises the peak to u if it is below.
func (m *Memory) raisePeak(u int64) {
	if m.peak == nil {
		return
	}
	for p := m.peak.Load(); u > p && !m.peak.CompareAndSwap(p, u); p = m.peak.Load() {
	}
}

// Limit returns the limit in bytes.
func (m *Memory) Limit() int64 { return m.limit }

// Used returns the bytes counted now: the Buffer's and the consumer's.
func (m *Memory) Used() int64 { return m.used.Load() }

// Take counts n more bytes of the consumer's if they fit within the limit, and reports whether
// they did. A consumer that was refused keeps those bytes out of memory (on disk); the Buffer then
// lets go of the free chunks it keeps for reuse at its next Next, so that later calls may fit.
func (m *Memory) Take(n int64) bool {
	if n < 0 {
		return false
	}
	for {
		u := m.used.Load()
		if u+n > m.limit {
			if !m.short.Load() {
				m.short.Store(true)
			}
			return false
		}
		if m.used.CompareAndSwap(u, u+n) {
			m.raisePeak(u + n)
			return true
		}
	}
}

// Give uncounts n bytes that Take counted; giving back more than was taken is the caller's error,
// which Used then shows below the Buffer's own bytes.
func (m *Memory) Give(n int64) { m.add(-n) }
