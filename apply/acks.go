package apply

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Acknowledgements. A transaction is acknowledged to the source once its target commit is
// durable. With Config.SynchronousCommit that is when COMMIT returns. Otherwise commits do not
// wait for the target's WAL flush: every asyncGroup-th commit, or the first one asyncDelay after
// an unflushed one, is made synchronous (SET LOCAL synchronous_commit = on), and when the leader
// finds nothing to read from the stream for idleProbe it commits an empty synchronous
// transaction. The target flushes its WAL through a synchronous commit, so every commit that
// returned before it is durable too: one flush serves many transactions, as PostgreSQL's
// subscriber gets from committing asynchronously and reporting only flushed positions.
const (
	asyncGroup = 64
	asyncDelay = 10 * time.Millisecond
	idleProbe  = time.Millisecond
)

// commitRef is a committed transaction waiting for its acknowledgement.
type commitRef struct {
	seq uint64
	txn *reorderbuffer.Txn
	job *job // nil in Buffered
}

// acks holds the commits made and not yet acknowledged, in commit order.
type acks struct {
	mu      sync.Mutex
	list    []commitRef
	flushed uint64 // every commit up to this sequence number is durable
	waiting bool   // the leader waits in Next on wake
	wake    context.Context
	cancel  context.CancelFunc

	unsynced      int       // commits since the last synchronous one
	firstUnsynced time.Time // when the first of them committed
}

// Reasons next returns without a transaction.
var (
	// errWoken: a commit became durable while the leader waited for the stream.
	errWoken = errors.New("apply: woken")
	// errIdle: nothing came from the stream for idleProbe while commits wait to be made durable.
	errIdle = errors.New("apply: idle")
	// errStreamLost: the replication connection broke while the leader was woken.
	errStreamLost = errors.New("apply: the replication connection was lost")
)

// syncCommit says whether the commit about to be sent must be synchronous.
func (s *session) syncCommit() bool {
	if s.cfg.SynchronousCommit {
		return true
	}
	a := &s.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unsynced+1 >= asyncGroup || (a.unsynced > 0 && time.Since(a.firstUnsynced) >= asyncDelay) {
		a.unsynced = 0
		return true
	}
	if a.unsynced == 0 {
		a.firstUnsynced = time.Now()
	}
	a.unsynced++
	return false
}

// committed records a commit, in commit order; durable says that it, and so every commit before
// it, is durable on the target.
func (s *session) committed(c commitRef, durable bool) {
	a := &s.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	a.list = append(a.list, c)
	if durable {
		a.flushed = max(a.flushed, c.seq)
	}
	// Wake the leader either way: durable, the commit is to be acknowledged; not durable, the
	// leader may be waiting for the stream with no commit to flush when it went to wait, and the
	// source may be waiting for this one (synchronous replication): nothing more would come.
	if a.waiting && a.cancel != nil {
		a.cancel()
	}
}

// flushed records that every commit up to seq is durable.
func (s *session) markFlushed(seq uint64) {
	a := &s.acks
	a.mu.Lock()
	a.flushed = max(a.flushed, seq)
	a.unsynced = 0
	a.mu.Unlock()
}

// ackCommitted acknowledges the durable commits and sends a status update.
func (s *session) ackCommitted(ctx context.Context) error {
	a := &s.acks
	a.mu.Lock()
	n := 0
	for n < len(a.list) && a.list[n].seq <= a.flushed {
		n++
	}
	ready := a.list[:n:n]
	a.list = a.list[n:]
	if len(a.list) == 0 {
		a.list = nil
	}
	a.mu.Unlock()
	if n == 0 {
		return nil
	}
	for _, c := range ready {
		if c.job != nil && s.deps != nil {
			s.deps.release(c.job)
		}
		if err := s.stream.Ack(c.txn); err != nil {
			return err
		}
	}
	return s.stream.SendStatus(ctx, false)
}

// next returns the stream's next transaction or part. While it waits, a commit that becomes
// durable (a worker's) makes it return errWoken; with commits waiting to be made durable, finding
// nothing to read for idleProbe makes it return errIdle.
func (s *session) next(ctx context.Context) (*reorderbuffer.Txn, error) {
	a := &s.acks
	a.mu.Lock()
	if len(a.list) > 0 && a.list[0].seq <= a.flushed {
		a.mu.Unlock()
		return nil, errWoken
	}
	// An open transaction on the leader's connection (a committed transaction arriving in
	// parts) is about to be followed by its next part: no flush before. An open group
	// (Buffered) commits as soon as nothing more is ready.
	unflushed := (len(a.list) > 0 && !s.leader.inTxn) || s.group.open()
	if a.wake == nil || a.wake.Err() != nil {
		a.wake, a.cancel = context.WithCancel(ctx)
	}
	wake := a.wake
	a.waiting = true
	a.mu.Unlock()
	nctx := wake
	if unflushed {
		var cancel context.CancelFunc
		nctx, cancel = context.WithTimeout(wake, idleProbe)
		defer cancel()
	}
	t, err := s.stream.Next(nctx)
	a.mu.Lock()
	a.waiting = false
	a.mu.Unlock()
	if err != nil && ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		switch {
		case wake.Err() != nil:
			return nil, errWoken
		case nctx.Err() != nil:
			return nil, errIdle
		}
		// The stream keeps the cancellation of an earlier wait as its error when the
		// connection broke at the same time: it is lost.
		return nil, errStreamLost
	}
	return t, err
}

// wakeUp handles next's errors that are not the stream's: a wake-up, or an idle stream with
// commits to make durable. Other errors are returned.
func (s *session) wakeUp(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, errWoken):
		return nil
	case errors.Is(err, errIdle):
		return s.flushNow(ctx)
	}
	return err
}

// flushNow makes every commit so far durable with an empty synchronous commit on the leader's
// connection (it writes a commit record: the target flushes its WAL through it).
func (s *session) flushNow(ctx context.Context) error {
	if s.leader.inTxn {
		return nil
	}
	done := s.order.committed()
	if err := s.leader.flushWAL(ctx); err != nil {
		return err
	}
	s.markFlushed(done)
	return nil
}
