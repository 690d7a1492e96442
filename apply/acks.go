package apply

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Acknowledgements. A transaction is acknowledged to the source only once the target holds, on
// disk, both its changes and a progress row at or past its end LSN: the source never sends an
// acknowledged transaction again, so the target must have it whatever crashes next, the target
// server included.
//
// With Config.SynchronousCommit that is when COMMIT returns. Otherwise commits do not wait for
// the target's WAL flush while the stream keeps delivering: every asyncGroup-th commit, or the
// first one asyncDelay after an unflushed one, is made synchronous (SET LOCAL synchronous_commit
// = on). A synchronous commit flushes the target's WAL up to its commit record, so every commit
// that returned before it is durable too: one flush serves many transactions, as PostgreSQL's
// subscriber gets from committing asynchronously and reporting only flushed positions.
//
// Once the stream is quiet (the leader found nothing to read for idleProbe, and nothing came
// since), nothing later would make a commit durable, and the source may be waiting for it
// (synchronous replication: its COMMIT returns only once the flush position is reported past
// it): every commit is then synchronous, and acknowledged with a status update as soon as it
// returned, without a timer in between. A commit made before the stream went quiet is flushed,
// with the flushing transaction of flushWAL, the moment the leader finds the stream quiet. So
// the only wait between the last commit the source waits for and its acknowledgement is the
// idleProbe that tells the stream has nothing more, and it is spent before that commit when the
// commit comes later (a worker applying a large transaction behind the stream): a group (Buffered,
// Eager) or a run (Parallel) is committed because the stream went quiet, and a worker's commit
// after the stream went quiet is synchronous.
//
// Two kinds of entries carry no progress row of their own: transactions with nothing to apply
// on the target, and idle advances (the stream's position moving on while nothing is
// published). They are acknowledged once a flushing transaction wrote a progress row at or past
// their end LSN (persisted), so that the slot's confirmed position never passes the progress row
// on disk: after any crash, a slot found ahead of the progress row means lost transactions.
const (
	asyncGroup = 64
	asyncDelay = 10 * time.Millisecond
	idleProbe  = time.Millisecond
)

// commitRef is a committed transaction (or an idle advance) waiting for its acknowledgement.
type commitRef struct {
	seq      uint64
	txn      *reorderbuffer.Txn
	job      *job         // nil in Buffered
	progress decoding.LSN // the progress row its target transaction wrote; 0 for none
	// before is the committed prefix (a sequence number) when its commit was sent: a durable
	// commit makes those durable too, every earlier commit record being earlier in the WAL.
	before  uint64
	durable bool // its own commit is durable
}

// acks holds the commits made and not yet acknowledged, in the source's commit order (by sequence
// number: with relaxed commit order they are made out of it). Only the committed prefix is
// acknowledged: a transaction whose sequence number is past it waits for the earlier ones.
type acks struct {
	mu        sync.Mutex
	list      []commitRef
	flushed   uint64       // every commit up to this sequence number is durable
	persisted decoding.LSN // a durable progress row is at or past this position
	waiting   bool         // the leader waits in Next on wake
	wake      context.Context
	cancel    context.CancelFunc

	unsynced      int       // commits since the last synchronous one
	firstUnsynced time.Time // when the first of them committed
	// quiet: the leader found nothing to read from the stream for idleProbe, and the stream has
	// handed out nothing since but idle advances. Written by the leader, read by every commit.
	quiet bool
}

// Reasons next returns without a transaction.
var (
	// errWoken: a commit became durable while the leader waited for the stream.
	errWoken = errors.New("apply: woken")
	// errIdle: the stream is quiet while commits wait to be made durable, or a group or a run
	// waits to be committed.
	errIdle = errors.New("apply: idle")
	// errQuiet: the stream has just gone quiet, with nothing waiting for it.
	errQuiet = errors.New("apply: quiet")
	// errStreamLost: the replication connection broke while the leader was woken.
	errStreamLost = retry.Retry("apply: the replication connection was lost")
)

// syncCommit says whether the commit about to be sent must be synchronous: always while the
// stream is quiet, else one in asyncGroup or the first asyncDelay after an unflushed one.
func (s *session) syncCommit() bool {
	if s.cfg.SynchronousCommit {
		return true
	}
	a := &s.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.quiet || a.unsynced+1 >= asyncGroup || (a.unsynced > 0 && time.Since(a.firstUnsynced) >= s.cfg.asyncDelay()) {
		a.unsynced = 0
		return true
	}
	if a.unsynced == 0 {
		a.firstUnsynced = time.Now()
	}
	a.unsynced++
	return false
}

// ready says whether c may be acknowledged: it is in the committed prefix (prefix, the Order's),
// and its commit, and a progress row at or past its end, are durable. Called with a.mu held.
func (a *acks) ready(c commitRef, prefix uint64) bool {
	return c.seq <= prefix && (c.durable || c.seq <= a.flushed) && c.txn.EndLSN <= a.persisted
}

// committed records a commit, in commit order; durable says that it, and so every commit before
// it, is durable on the target.
func (s *session) committed(c commitRef, durable bool) {
	s.a.streams.Applied(c.txn)
	a := &s.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	if durable {
		c.durable = true
		a.flushed = max(a.flushed, c.before)
		a.persisted = max(a.persisted, c.progress)
	}
	i := len(a.list)
	for i > 0 && a.list[i-1].seq > c.seq {
		i--
	}
	a.list = slices.Insert(a.list, i, c)
	// Wake the leader either way: durable, the commit is to be acknowledged; not durable, the
	// leader may be waiting for the stream with no commit to flush when it went to wait, and the
	// source may be waiting for this one (synchronous replication): nothing more would come.
	a.wakeLocked()
}

// wakeLocked makes the leader's wait for the stream, if any, return errWoken. Called with a.mu
// held.
func (a *acks) wakeLocked() {
	if a.waiting && a.cancel != nil {
		a.cancel()
	}
}

// finished wakes the leader after a worker finished a sequence number with nothing to commit:
// an open run may be waiting for it to be sealed (see runStartable).
func (s *session) finished() {
	s.acks.mu.Lock()
	s.acks.wakeLocked()
	s.acks.mu.Unlock()
}

// markFlushed records that every commit up to seq is durable, and a progress row at pos.
func (s *session) markFlushed(seq uint64, pos decoding.LSN) {
	a := &s.acks
	a.mu.Lock()
	a.flushed = max(a.flushed, seq)
	a.persisted = max(a.persisted, pos)
	a.unsynced = 0
	a.mu.Unlock()
}

// ackCommitted acknowledges the durable commits and sends a status update.
func (s *session) ackCommitted(ctx context.Context) error {
	prefix := s.order.Committed()
	a := &s.acks
	a.mu.Lock()
	n := 0
	for n < len(a.list) && a.ready(a.list[n], prefix) {
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
			s.deps.Release(&c.job.Job)
		}
		if err := s.stream.Ack(c.txn); err != nil {
			return err
		}
	}
	return s.stream.SendStatus(ctx, false)
}

// next returns the stream's next transaction or part. While it waits, a commit (a worker's)
// makes it return errWoken. Finding nothing to read for idleProbe makes the stream quiet (see
// Acknowledgements) and next return errIdle when commits wait to be made durable (or a group or a
// run to be committed), errQuiet otherwise; while the stream is quiet, next returns errIdle at
// once for them, and waits for the stream without a limit.
func (s *session) next(ctx context.Context) (*reorderbuffer.Txn, error) {
	prefix := s.order.Committed()
	a := &s.acks
	a.mu.Lock()
	if len(a.list) > 0 && a.ready(a.list[0], prefix) {
		a.mu.Unlock()
		return nil, errWoken
	}
	// An open transaction on the leader's connection (a committed transaction arriving in
	// parts) is about to be followed by its next part: no flush before. An open group
	// (Buffered) commits as soon as nothing more is ready.
	// Commits past the committed prefix (relaxed commit order) wait for it to move, which a
	// commit wakes the leader for: no flush for them.
	// An open run (Parallel) is sealed once nothing more is ready, if it could commit at once;
	// otherwise the commit before it wakes the leader. The order is read under a.mu, which
	// committed takes after Finish: a commit either is seen here or wakes the wait below.
	unflushed := (len(a.list) > 0 && a.list[0].seq <= prefix && !s.leader.InTxn()) || s.group.open() || (s.run != nil && s.runStartable())
	quiet := a.quiet
	if unflushed && quiet {
		// Made after the stream went quiet (a commit that found it busy an instant before): nothing
		// more is coming that would make them durable.
		a.mu.Unlock()
		return nil, errIdle
	}
	if a.wake == nil || a.wake.Err() != nil {
		a.wake, a.cancel = context.WithCancel(ctx)
	}
	wake := a.wake
	a.waiting = true
	a.mu.Unlock()
	var until time.Time // no limit
	if !quiet {
		until = time.Now().Add(idleProbe)
	}
	t, err := s.stream.NextBefore(wake, until)
	a.mu.Lock()
	a.waiting = false
	busy := err == nil && quiet && t.Part != reorderbuffer.Advance
	if busy {
		a.quiet = false
	}
	a.mu.Unlock()
	if busy {
		if err := s.cfg.hook(ctx, "busy", txnRef{}); err != nil {
			return nil, err
		}
	}
	if err != nil && ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		switch {
		case wake.Err() != nil:
			return nil, errWoken
		case !until.IsZero() && !time.Now().Before(until):
			a.mu.Lock()
			a.quiet = true
			a.mu.Unlock()
			if err := s.cfg.hook(ctx, "quiet", txnRef{}); err != nil {
				return nil, err
			}
			if unflushed {
				return nil, errIdle
			}
			return nil, errQuiet
		}
		// The stream keeps the cancellation of an earlier wait as its error when the
		// connection broke at the same time: it is lost.
		return nil, errStreamLost
	}
	return t, err
}

// wakeUp handles next's errors that are not the stream's: a wake-up, a stream gone quiet, or a
// quiet stream with commits to make durable. Other errors are returned.
func (s *session) wakeUp(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, errWoken), errors.Is(err, errQuiet):
		return nil
	case errors.Is(err, errIdle):
		return s.flushNow(ctx)
	}
	return err
}

// flushNow makes every commit so far durable, and the progress row reach the last of them (a
// transaction with nothing to apply or an idle advance may be ahead of the last progress row
// written), with the flushing transaction of flushWAL on the leader's connection.
func (s *session) flushNow(ctx context.Context) error {
	if s.leader.InTxn() {
		return nil
	}
	done, pos := s.prefix()
	if err := s.leader.FlushWAL(ctx, s.flushSQL, s.key.Args(pos)); err != nil {
		return err
	}
	s.markFlushed(done, pos)
	s.stats.Applied(pos)
	return nil
}

// prefix returns the committed prefix: its last sequence number, and the end of its last source
// transaction (or idle advance) committed and recorded here, or acknowledged before. Every
// transaction that ends at or before that position and was handed out is committed on the target,
// its commit having returned. A commit recorded late (its Finish seen, not yet its commitRef)
// only makes the position lower than it could be.
func (s *session) prefix() (uint64, decoding.LSN) {
	done := s.order.Committed()
	a := &s.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	pos := a.persisted
	for _, c := range a.list {
		if c.seq > done {
			break
		}
		pos = max(pos, c.txn.EndLSN)
	}
	return done, pos
}
