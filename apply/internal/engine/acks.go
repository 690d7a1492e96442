package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/plan"
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
// the target's WAL flush while the stream keeps delivering: every plan.AsyncGroup-th commit, or the
// first one Config.AsyncDelay after an unflushed one, is made synchronous (SET LOCAL synchronous_commit
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
	DefaultAsyncDelay = 10 * time.Millisecond
	idleProbe         = time.Millisecond
)

// commitRef is a committed transaction (or an idle advance) waiting for its acknowledgement.
type commitRef = plan.Commit[ackOf]

// ackOf is what an acknowledgement needs of a commit: the transaction, and its job (nil on the
// leader's groups) whose dependencies it releases.
type ackOf struct {
	txn *reorderbuffer.Txn
	job *job
}

// commitOf returns the commitRef of t, sequence number seq, committed by job j with a progress
// row at progress (0: none) when the committed prefix was before.
func commitOf(seq uint64, t *reorderbuffer.Txn, j *job, progress decoding.LSN, before uint64) commitRef {
	return commitRef{Seq: seq, End: t.EndLSN, Progress: progress, Before: before, Value: ackOf{txn: t, job: j}}
}

// acks is plan.Acks under a lock, with the wake-up of the leader's wait for the stream. The
// leader and every committing goroutine share it.
type acks struct {
	mu sync.Mutex
	plan.Acks[ackOf]
	waiting bool // the leader waits in Next on wake
	wake    context.Context
	cancel  context.CancelFunc
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
	// ErrStreamLost: the replication connection broke while the leader was woken.
	ErrStreamLost = retry.Retry("apply: the replication connection was lost")
)

// syncCommit says whether the commit about to be sent must be synchronous: always while the
// stream is quiet, else one in plan.AsyncGroup or the first Config.AsyncDelay after an unflushed one.
func (e *Engine) syncCommit() bool {
	if e.cfg.SynchronousCommit {
		return true
	}
	a := &e.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.SyncCommit(time.Now(), e.cfg.AsyncDelay) // the wall clock: a flush is due in real time
}

// committed records a commit, in commit order; durable says that it, and so every commit before
// it, is durable on the target.
func (e *Engine) committed(c commitRef, durable bool) {
	e.commits.Record(c.Value.txn)
	a := &e.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	a.Committed(c, durable)
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
func (e *Engine) finished() {
	e.acks.mu.Lock()
	e.acks.wakeLocked()
	e.acks.mu.Unlock()
}

// markFlushed records that every commit up to seq is durable, and a progress row at pos.
func (e *Engine) markFlushed(seq uint64, pos decoding.LSN) {
	a := &e.acks
	a.mu.Lock()
	a.MarkFlushed(seq, pos)
	a.mu.Unlock()
}

// ackCommitted acknowledges the durable commits and sends a status update.
func (e *Engine) ackCommitted(ctx context.Context) error {
	prefix := e.order.Committed()
	a := &e.acks
	a.mu.Lock()
	ready := a.Take(prefix)
	a.mu.Unlock()
	if len(ready) == 0 {
		return nil
	}
	for _, c := range ready {
		if c.Value.job != nil && e.deps != nil {
			e.deps.Release(&c.Value.job.Job)
		}
		if err := e.stream.Ack(c.Value.txn); err != nil {
			return err
		}
	}
	return e.stream.SendStatus(ctx, false)
}

// next returns the stream's next transaction or part. While it waits, a commit (a worker's)
// makes it return errWoken. Finding nothing to read for idleProbe makes the stream quiet (see
// Acknowledgements) and next return errIdle when commits wait to be made durable (or a group or a
// run to be committed), errQuiet otherwise; while the stream is quiet, next returns errIdle at
// once for them, and waits for the stream without a limit.
func (e *Engine) next(ctx context.Context) (*reorderbuffer.Txn, error) {
	prefix := e.order.Committed()
	a := &e.acks
	a.mu.Lock()
	if a.HeadReady(prefix) {
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
	unflushed := (a.Unflushed(prefix) && !e.leader.InTxn()) || e.group.Open() || (e.run != nil && e.runStartable())
	quiet := a.Quiet
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
	if !quiet || e.confirming {
		until = time.Now().Add(idleProbe)
	}
	t, err := e.stream.NextBefore(wake, until)
	a.mu.Lock()
	a.waiting = false
	busy := err == nil && quiet && t.Part != reorderbuffer.Advance
	if busy {
		a.Quiet = false
	}
	a.mu.Unlock()
	if busy {
		if err := e.host.Hook(ctx, "busy", Ref{}); err != nil {
			return nil, err
		}
	}
	if err == nil && t.Part != reorderbuffer.Advance && !t.NonTransactional {
		if err := e.host.Admit(t); err != nil {
			return nil, err
		}
	}
	if err != nil && ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		switch {
		case wake.Err() != nil:
			return nil, errWoken
		case !until.IsZero() && !time.Now().Before(until):
			if !quiet { // (a quiet stream waits with a limit only while caughtUp confirms)
				a.mu.Lock()
				a.Quiet = true
				a.mu.Unlock()
				if err := e.host.Hook(ctx, "quiet", Ref{}); err != nil {
					return nil, err
				}
			}
			if unflushed {
				return nil, errIdle
			}
			return nil, errQuiet
		}
		// The stream keeps the cancellation of an earlier wait as its error when the
		// connection broke at the same time: it is lost.
		return nil, ErrStreamLost
	}
	return t, err
}

// wakeUp handles next's errors that are not the stream's: a wake-up, a stream gone quiet, or a
// quiet stream with commits to make durable. Other errors are returned.
func (e *Engine) wakeUp(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, errWoken), errors.Is(err, errQuiet):
		return nil
	case errors.Is(err, errIdle):
		return e.flushNow(ctx)
	}
	return err
}

// flushNow makes every commit so far durable, and the progress row reach the last of them (a
// transaction with nothing to apply or an idle advance may be ahead of the last progress row
// written), with the flushing transaction of flushWAL on the leader's connection.
func (e *Engine) flushNow(ctx context.Context) error {
	if e.leader.InTxn() {
		return nil
	}
	done, pos := e.prefix()
	if err := e.leader.FlushWAL(ctx, e.flushSQL, e.key.Args(pos)); err != nil {
		return err
	}
	e.markFlushed(done, pos)
	e.tstats.Applied(pos)
	return nil
}

// prefix returns the committed prefix: its last sequence number, and the end of its last source
// transaction (or idle advance) committed and recorded here, or acknowledged before. Every
// transaction that ends at or before that position and was handed out is committed on the target,
// its commit having returned. A commit recorded late (its Finish seen, not yet its commitRef)
// only makes the position lower than it could be.
func (e *Engine) prefix() (uint64, decoding.LSN) {
	done := e.order.Committed()
	a := &e.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	return done, a.Position(done)
}
