package engine

import (
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Commits records the last source transaction committed on the target, across sessions: its
// commit time on the source, and when it committed on the target (local clock). The zero value
// is ready; its methods may be called from any goroutine.
type Commits struct {
	mu              sync.Mutex
	source, applied time.Time
}

// Record records that t committed on the target. An idle advance or a non-transactional
// message (no commit time) is not a commit.
func (c *Commits) Record(t *reorderbuffer.Txn) {
	if t.CommitTime.IsZero() {
		return
	}
	now := time.Now()
	c.mu.Lock()
	c.source, c.applied = t.CommitTime, now
	c.mu.Unlock()
}

// Last returns the source commit time of the last transaction committed on the target, and
// when it committed there; zero before the first.
func (c *Commits) Last() (source, applied time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.source, c.applied
}
