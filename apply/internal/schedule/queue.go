package schedule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/pgreorder/pgreorder/spill"
)

// A Queue holds what the leader handed to one job and its worker has not applied yet: records
// (changes, parts the worker reads where the reorder buffer holds them, rollbacks, waits, the
// end), in order. Records stay in memory while the queues' shared budget (the room the reorder
// buffer leaves them) and the queue's own share allow, and go to a spill log otherwise, as
// PostgreSQL's leader apply worker "partially serializes" to a file when its parallel worker
// cannot keep up. The leader never waits for a worker to make room: a slow worker costs disk,
// never the other transactions. The worker replays the segments in order.
type Queue struct {
	st     *SpillStore
	budget *Budget
	share  int64 // the most bytes this queue may hold in memory

	mu      sync.Mutex
	segs    []*segment
	mem     int64 // bytes of records in memory
	held    int64 // bytes of the parts its worker reads where the reorder buffer holds them (Hold)
	wake    chan struct{}
	err     error // a spill error: sticky
	closed  bool
	spilled *atomic.Int64 // bytes written to spill logs, of every queue
}

// segment is a run of records: in memory, or in a spill log. A spill segment is sealed once its
// worker starts reading it (a log is not read and appended at once); later records go to a new
// segment.
type segment struct {
	mem    [][]byte
	head   int
	log    *spill.Log
	rd     *spill.Reader
	sealed bool
}

// Room is the memory the queues take their bytes from: the session's reorderbuffer.Memory, the
// one limit they share with its reorder buffer.
type Room interface {
	Take(n int64) bool // counts n bytes if they fit, and reports whether they did
	Give(n int64)      // uncounts n bytes taken
}

// Budget is the memory all queues of a session share, taken from a Room.
type Budget struct {
	mem  Room
	used atomic.Int64 // the queues' bytes
	peak *atomic.Int64
}

// NewBudget returns the queues' budget within mem.
func NewBudget(mem Room) *Budget { return &Budget{mem: mem} }

// TrackPeak makes the budget raise peak to the most bytes the queues have held at once.
func (b *Budget) TrackPeak(peak *atomic.Int64) { b.peak = peak }

func (b *Budget) take(n int64) bool {
	if !b.mem.Take(n) {
		return false
	}
	u := b.used.Add(n)
	if b.peak != nil {
		for p := b.peak.Load(); u > p && !b.peak.CompareAndSwap(p, u); p = b.peak.Load() {
		}
	}
	return true
}

func (b *Budget) give(n int64) {
	b.mem.Give(n)
	b.used.Add(-n)
}

// SpillStore is a spill.Store shared by the queues of a session, used under its lock (a Store
// and its logs are not safe for concurrent use). It is opened on first use.
type SpillStore struct {
	mu       sync.Mutex
	dir      string
	comp     spill.Compressor
	maxFiles int
	st       *spill.Store
}

// NewSpillStore returns a store of spill files in dir ("": the system's temporary directory),
// compressed by comp (nil: not compressed).
func NewSpillStore(dir string, comp spill.Compressor) *SpillStore {
	return &SpillStore{dir: dir, comp: comp}
}

// SetMaxOpenFiles sets the store's spill.Options.MaxOpenFiles (0, the default: spill's own), before
// its first use.
func (s *SpillStore) SetMaxOpenFiles(n int) { s.maxFiles = n }

func (s *SpillStore) create() (*spill.Log, error) {
	if s.st == nil {
		st, err := spill.Open(spill.Options{Dir: s.dir, Compressor: s.comp, MaxOpenFiles: s.maxFiles})
		if err != nil {
			return nil, fmt.Errorf("apply: opening a spill store: %w", err)
		}
		s.st = st
	}
	return s.st.Create()
}

// Close closes the store, if it was opened.
func (s *SpillStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		return nil
	}
	err := s.st.Close()
	s.st = nil
	return err
}

// NewQueue returns an empty queue spilling to st, holding up to share bytes in memory while b
// allows; spilled counts the bytes it writes to spill logs.
func NewQueue(st *SpillStore, b *Budget, share int64, spilled *atomic.Int64) *Queue {
	return &Queue{st: st, budget: b, share: share, wake: make(chan struct{}, 1), spilled: spilled}
}

// ErrQueueClosed is returned by push and pop after close.
var ErrQueueClosed = errors.New("apply: queue closed")

// Push appends rec, which the queue takes ownership of, and wakes a Pop waiting for it.
func (q *Queue) Push(rec []byte) error { return q.push(rec, true) }

// Append is Push without waking a waiting Pop: the record waits for the next Push or Wake. A
// producer that appends many small records at once wakes its consumer once for them.
func (q *Queue) Append(rec []byte) error { return q.push(rec, false) }

// Wake wakes a Pop waiting for the records appended so far.
func (q *Queue) Wake() { q.signal() }

func (q *Queue) push(rec []byte, wake bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrQueueClosed
	}
	if q.err != nil {
		return q.err
	}
	n := int64(len(rec))
	var tail *segment
	if len(q.segs) > 0 {
		tail = q.segs[len(q.segs)-1]
	}
	// Once spilling, keep spilling until the worker catches up (seals the log): the records
	// stay in order and the segments few.
	if tail == nil || tail.log == nil || tail.sealed {
		if q.mem+q.held+n <= q.share && q.budget.take(n) {
			if tail == nil || tail.log != nil {
				tail = &segment{}
				q.segs = append(q.segs, tail)
			}
			tail.mem = append(tail.mem, rec)
			q.mem += n
			if wake {
				q.signal()
			}
			return nil
		}
		q.st.mu.Lock()
		l, err := q.st.create()
		q.st.mu.Unlock()
		if err != nil {
			q.err = err
			return err
		}
		tail = &segment{log: l}
		q.segs = append(q.segs, tail)
	}
	q.st.mu.Lock()
	err := tail.log.Append(rec)
	q.st.mu.Unlock()
	if err != nil {
		q.err = fmt.Errorf("apply: spilling a queue: %w", err)
		return q.err
	}
	q.spilled.Add(n)
	if wake {
		q.signal()
	}
	return nil
}

// Hold counts n bytes of a part that the job's worker reads where the reorder buffer holds it
// (reorderbuffer.Txn.Keep) against the queue's share of memory, if they fit beside what it holds
// already, and reports whether they did: a part that does not fit is copied into the queue
// instead, which spills once it is full. The reorder buffer counts those bytes against the
// session's one limit itself, so the queues' budget does not take them again. Unhold uncounts
// them once the part is let go of.
func (q *Queue) Hold(n int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.err != nil || q.mem+q.held+n > q.share {
		return false
	}
	q.held += n
	return true
}

// Unhold uncounts n bytes counted by Hold.
func (q *Queue) Unhold(n int64) {
	q.mu.Lock()
	q.held -= n
	q.mu.Unlock()
}

func (q *Queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Pop returns the next record, waiting for one until ctx is done; waiting (if not nil) is called
// before it waits. The record is valid until the next pop.
func (q *Queue) Pop(ctx context.Context, waiting func()) ([]byte, error) {
	for {
		rec, ok, err := q.TryPop()
		if err != nil || ok {
			return rec, err
		}
		if waiting != nil {
			waiting()
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-q.wake:
		}
	}
}

// TryPop returns the next record if there is one (ok), without waiting. The record is valid
// until the next pop.
func (q *Queue) TryPop() (rec []byte, ok bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed {
			return nil, false, ErrQueueClosed
		}
		if q.err != nil {
			return nil, false, q.err
		}
		if len(q.segs) == 0 {
			return nil, false, nil
		}
		s := q.segs[0]
		if s.log == nil {
			if s.head < len(s.mem) {
				rec := s.mem[s.head]
				s.mem[s.head] = nil
				s.head++
				q.mem -= int64(len(rec))
				q.budget.give(int64(len(rec)))
				if s.head == len(s.mem) {
					q.drop(s)
				}
				return rec, true, nil
			}
			if q.drop(s) {
				return nil, false, nil
			}
			continue
		}
		q.st.mu.Lock()
		if !s.sealed {
			s.sealed = true
			s.rd = s.log.NewReader()
		}
		rec, err := s.rd.Next()
		if errors.Is(err, io.EOF) {
			err = s.rd.Close()
			if rerr := s.log.Remove(); err == nil {
				err = rerr
			}
			q.st.mu.Unlock()
			if err != nil {
				q.err = err
				return nil, false, err
			}
			q.segs = q.segs[1:]
			continue
		}
		q.st.mu.Unlock()
		if err != nil {
			q.err = fmt.Errorf("apply: reading a spilled queue: %w", err)
			return nil, false, q.err
		}
		return rec, true, nil
	}
}

// drop removes the read memory segment s, the first. The last segment, if small, is kept
// empty for the next records instead (reused: true), so that a queue its worker keeps up with
// allocates nothing per record but the record.
func (q *Queue) drop(s *segment) (reused bool) {
	if len(q.segs) == 1 && cap(s.mem) <= maxReused {
		s.mem, s.head = s.mem[:0], 0
		return true
	}
	q.segs = q.segs[1:]
	return false
}

// maxReused is the most records an emptied memory segment may have room for to be reused.
const maxReused = 1024

// Close drops what the queue holds, giving back its memory and removing its spill logs. It is
// safe to call twice.
func (q *Queue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	q.budget.give(q.mem)
	q.mem = 0
	var errs []error
	for _, s := range q.segs {
		if s.log != nil {
			q.st.mu.Lock()
			if s.rd != nil {
				errs = append(errs, s.rd.Close())
			}
			errs = append(errs, s.log.Remove())
			q.st.mu.Unlock()
		}
	}
	q.segs = nil
	q.signal() // a waiting pop sees closed
	return errors.Join(errs...)
}
