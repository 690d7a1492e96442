package engine

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/plan"
	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Eager and parallel apply. The leader (the goroutine that reads the stream) turns each source
// transaction into a job:
//
//   - a streamed transaction is applied by a worker (a goroutine with a target connection of its
//     own) while it is still running on the source: the leader hands each part to the job's queue
//     (kept where the reorder buffer holds it, or copied: kept.go), with a ROLLBACK TO SAVEPOINT
//     when a subtransaction aborts; the worker applies the changes as they come, with a SAVEPOINT
//     before the first change of each subtransaction. Without a free worker the
//     job is spooled: queued the same way, and applied by the leader at its commit.
//   - a non-streamed transaction (committed on the source before its first change is sent) is
//     applied by the leader on its own connection as its parts arrive (Eager), or by a free worker
//     (Parallel).
//
// Every job gets a sequence number when its commit arrives (a non-streamed one at its first
// part: nothing can commit in between) and commits only after the job before it (order), with the
// progress row, in the same target transaction. The acknowledgement to the source follows the
// commit; the leader sends them (a worker's commits wake it up when it waits for the stream).
//
// This file is the leader's side of it; worker.go the workers', parallel.go the runs, chains and
// dependencies of Parallel.

// A job's queue holds schedule's records; a schedule.RecChange is the reorder buffer's record of
// the change (the pgoutput message) behind the registry ids of its relations (encodeChange), a
// schedule.RecPart names a part the worker reads where the buffer holds it (keptPart).

// Worker states, for the watchdog.
const (
	wsIdle     = schedule.WorkerIdle
	wsApplying = schedule.WorkerApplying
	wsWaiting  = schedule.WorkerWaiting
)

// job is one source transaction being applied in parts.
type job struct {
	schedule.Job // the commit order (Seq; 0 until known), and for Parallel the tracker's state

	xid      uint32
	streamed bool
	q        *schedule.Queue // nil for a direct job
	direct   bool            // applied on the leader's connection as its parts arrive
	spooled  bool            // applied on the leader's connection at its commit
	stepwise bool            // applied one statement at a time (Session.Stepwise, read when the job begins)

	// Set by the leader before it queues schedule.RecCommit; read by the worker after.
	ref    Ref
	commit *reorderbuffer.Txn
	// known is the commit of a transaction that arrived with it (a whole committed one), set
	// before the job is handed out, or of a spooled one, set before the leader applies it: what
	// its conflicts are resolved with from the start (last_update_wins compares commit times).
	// nil for a job applied before its commit arrived.
	known *detect.SourceCommit

	// A run (Parallel): consecutive whole committed transactions applied in one target
	// transaction, set-based. The leader appends to members under mu; the worker reads the
	// member a schedule.RecTxn names under mu, and all of them after schedule.RecCommit.
	isRun   bool
	mu      sync.Mutex
	members []groupMember
	// The parts the worker reads where the reorder buffer holds them: the leader appends under
	// mu, the worker reads the one a schedule.RecPart names under mu.
	parts       []*keptPart
	spilledKept int      // under mu: parts kept that are read back from a spill log (keep)
	pr          plan.Run // leader only: what decides when the run is full, and whether it is chained
	unwoken     int      // leader only: records appended to a run's queue since its worker was woken (see runWake)

	// Leader only.
	begun  bool       // direct: the target transaction has begun
	failed error      // direct: a change the target refused (reported at the commit)
	waits  plan.Waits // the sequence numbers a schedule.RecWait (and relaxed, a RecAfter) was queued for
}

// runIncremental is the leader's loop in Eager and Parallel.
func (e *Engine) runIncremental(ctx context.Context) error {
	defer e.abandonGroup()
	for {
		if err := e.ackCommitted(ctx); err != nil {
			return err
		}
		if done, err := e.caughtUp(ctx); done || err != nil {
			return cmp.Or(err, ErrCaughtUp)
		}
		e.askPosition()
		t, err := e.next(ctx)
		if err != nil {
			if errors.Is(err, errIdle) && e.group.Open() { // nothing more to read: commit
				err = e.endGroup(ctx)
			} else if errors.Is(err, errIdle) && e.run != nil && e.runStartable() {
				err = e.sealRun()
			} else {
				err = e.wakeUp(ctx, err)
			}
			if err != nil {
				return err
			}
			continue
		}
		if e.groupable(t) {
			if err := e.runGrouped(ctx, t); err != nil {
				return err
			}
			continue
		}
		if err := e.endGroup(ctx); err != nil {
			return err
		}
		if e.runnable(t) {
			if err := e.addToRun(ctx, t); err != nil {
				return err
			}
			continue
		}
		if err := e.sealRun(); err != nil {
			return err
		}
		switch {
		case t.NonTransactional:
			if err := e.stream.Ack(t); err != nil {
				return err
			}
		case t.Part == reorderbuffer.Advance:
			err = e.advanced(ctx, t)
		case t.Part == reorderbuffer.PartChanges || t.Part == reorderbuffer.PartCommit:
			err = e.part(ctx, t)
		case t.Part == reorderbuffer.PartSubAbort:
			err = e.subAbort(t)
		case t.Part == reorderbuffer.PartAbort:
			err = e.abort(ctx, t)
		default:
			err = fmt.Errorf("apply: unexpected %v transaction %d from an incremental stream", t.Part, t.Xid)
		}
		if err != nil {
			return err
		}
	}
}

// xids returns the source transactions of j: its own, or a run's.
func (j *job) xids() []uint32 {
	if !j.isRun {
		return []uint32{j.xid}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	xs := make([]uint32, len(j.members))
	for i, m := range j.members {
		xs[i] = m.ref.Xid
	}
	return xs
}

// part handles a part with changes (PartChanges or PartCommit).
func (e *Engine) part(ctx context.Context, t *reorderbuffer.Txn) error {
	if e.alreadyApplied(t) {
		return e.skipApplied(ctx, t)
	}
	j := e.jobs[t.Xid]
	if j == nil {
		var err error
		if j, err = e.newJob(ctx, t); err != nil {
			return err
		}
		e.jobs[t.Xid] = j
		e.log.Debug("transaction", "xid", t.Xid, "streamed", t.Streamed, "direct", j.direct, "spooled", j.spooled, "seq", j.Seq.Load())
	}
	var err error
	if j.direct {
		err = e.applyDirect(ctx, j, t)
	} else {
		err = e.enqueue(ctx, j, t)
	}
	if err != nil {
		return err
	}
	if t.Part == reorderbuffer.PartCommit {
		return e.commitJob(ctx, j, t)
	}
	return nil
}

// newJob decides who applies a transaction whose first part arrived.
func (e *Engine) newJob(ctx context.Context, t *reorderbuffer.Txn) (*job, error) {
	j := &job{xid: t.Xid, streamed: t.Streamed, stepwise: e.stepwise(t.Xid)}
	if t.Part == reorderbuffer.PartCommit {
		j.known = SourceCommit(t)
	}
	if !t.Streamed {
		// Committed on the source already: it is next in commit order.
		j.Seq.Store(e.order.Assign())
		if !e.mode.onWorker(t) {
			j.direct = true
			return j, nil
		}
		w, err := e.takeWorker(ctx)
		if err != nil {
			return nil, err
		}
		if w == nil {
			j.direct = true
			return j, nil
		}
		j.q = schedule.NewQueue(e.store, e.budget, e.share, &e.stats.QueueSpilled)
		w.cur.Store(j)
		w.jobs <- j
		return j, nil
	}
	j.q = schedule.NewQueue(e.store, e.budget, e.share, &e.stats.QueueSpilled)
	if e.serial[t.Xid] {
		j.spooled = true
		return j, nil
	}
	select {
	case w := <-e.free:
		w.cur.Store(j)
		w.jobs <- j
	default:
		j.spooled = true
		e.stats.Spooled.Add(1)
	}
	return j, nil
}

// takeWorker returns a free worker for a committed transaction (Parallel), waiting for one if a
// busy worker holds a committed transaction (it frees up without the leader); nil when every
// busy worker holds a streamed transaction still open, which only the leader can move on: the
// leader then applies the transaction itself.
func (e *Engine) takeWorker(ctx context.Context) (*worker, error) {
	select {
	case w := <-e.free:
		return w, nil
	default:
	}
	finishing := false
	for _, w := range e.workers {
		if j := w.cur.Load(); j != nil && j.Seq.Load() != 0 {
			finishing = true
		}
	}
	if !finishing {
		return nil, nil
	}
	select {
	case w := <-e.free:
		return w, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// applyDirect applies a part of a non-streamed transaction on the leader's connection, after
// every earlier transaction committed. A change the target refuses is remembered and reported
// at the commit, when the commit LSN is known.
func (e *Engine) applyDirect(ctx context.Context, j *job, t *reorderbuffer.Txn) error {
	if j.failed != nil {
		return nil
	}
	if err := e.order.Wait(ctx, j.Seq.Load()-1); err != nil {
		return err
	}
	e.leaderJob.Store(j)
	tg := e.leader
	var failed error // a change the target refused: no further change of t is applied
	err := e.eachChange(t, func(m decoding.Message, rels []*target.Relation) error {
		if !j.begun {
			tg.Stepwise(j.stepwise)
			tg.Begin(j.xid, j.known)
			j.begun = true
		}
		failed = tg.Change(ctx, m, rels)
		return failed
	})
	if failed != nil {
		return e.directFailed(ctx, j, failed)
	}
	return err
}

// directFailed handles an error of a direct job: a refused change is kept for the commit, any
// other error ends the session.
func (e *Engine) directFailed(ctx context.Context, j *job, err error) error {
	var ce *target.ChangeError
	if !errors.As(err, &ce) {
		return e.conflict(j, err)
	}
	j.failed = err
	j.begun = false
	return e.leader.Rollback(ctx)
}

// conflict turns an error that concurrency may have caused (a deadlock detected by the target, a
// serialization failure, a lock timeout) into a restart that applies the transactions involved
// alone: j and the streamed ones other connections hold open. Other errors pass.
func (e *Engine) conflict(j *job, err error) error {
	if !target.Concurrent(err) {
		return err
	}
	xids := j.xids()
	for _, w := range e.workers {
		if o := w.cur.Load(); o != nil && o != j {
			xids = append(xids, o.xids()...)
		}
	}
	return e.host.Restart(xids, err)
}

// enqueue hands a part's changes to the job's queue: the part itself, kept where the reorder
// buffer holds it, or a copy of each change (they are valid only until the next Next). A streamed
// transaction's changes get a wait for the transactions that committed before them (its worker
// takes a savepoint before each subtransaction's first change), a committed one's (Parallel) a
// wait for those in flight it depends on; the waits go before the part.
func (e *Engine) enqueue(ctx context.Context, j *job, t *reorderbuffer.Txn) error {
	kp := e.keep(j, t)
	changed := false
	// A streamed transaction's changes need only their relations here: they are parsed once, by
	// the worker. A committed one's are parsed for their keys too (depend).
	err := e.eachRecord(t, j.streamed, func(h reorderbuffer.Head, rels []*target.Relation) error {
		if !j.streamed {
			if err := e.depend(ctx, j, h.Msg, rels); err != nil {
				return err
			}
		} else if last := e.order.Last(); j.waits.Prefix(last, e.order.Committed()) {
			// The change came after every transaction committed so far: it may read their rows.
			if err := j.q.Push(schedule.WaitRecord(last)); err != nil {
				return err
			}
		}
		if kp != nil {
			kp.note(rels)
			changed = true
			return nil
		}
		rec, err := encodeChange(h.Change, rels)
		if err != nil {
			return err
		}
		return j.q.Push(rec)
	})
	if kp == nil {
		return err
	}
	if err != nil || !changed {
		j.letGo(kp)
		return err
	}
	if err := e.addPart(j, kp); err != nil {
		return err
	}
	j.q.Wake()
	return nil
}

// encodeChange makes a schedule.RecChange record of c: the one copy of the change the queue
// holds. It is the reorder buffer's record (c.Raw, the pgoutput message) behind a header: a flag
// byte (recInStream: the message is in the in-stream form), a u16 relation count and the u32
// registry ids. A change without a record (its producer keeps none) is encoded from c.Msg.
func encodeChange(c decoding.Change, rels []*target.Relation) ([]byte, error) {
	head := 4 + 4*len(rels)
	var rec []byte
	if c.Raw != nil {
		rec = make([]byte, head, head+len(c.Raw))
	} else {
		rec = make([]byte, head, head+64)
	}
	rec[0] = schedule.RecChange
	if c.Raw != nil && c.InStream {
		rec[1] = recInStream
	}
	binary.BigEndian.PutUint16(rec[2:], uint16(len(rels)))
	for i, r := range rels {
		binary.BigEndian.PutUint32(rec[4+4*i:], r.ID)
	}
	if c.Raw != nil {
		return append(rec, c.Raw...), nil
	}
	return decoding.Append(rec, c.Msg, false, decoding.Options{})
}

// recInStream flags a schedule.RecChange record whose message is in the in-stream form.
const recInStream = 1

// decodeChange reads a schedule.RecChange record. The message is valid until the parser's next
// use, and aliases rec.
func (e *Engine) decodeChange(p *decoding.Parser, rec []byte, rels []*target.Relation) (decoding.Message, []*target.Relation, error) {
	if len(rec) < 4 {
		return nil, nil, errors.New("apply: short queue record")
	}
	inStream := rec[1]&recInStream != 0
	n := int(binary.BigEndian.Uint16(rec[2:]))
	rec = rec[4:]
	if len(rec) < 4*n {
		return nil, nil, errors.New("apply: short queue record")
	}
	rels = rels[:0]
	for i := range n {
		rels = append(rels, e.reg.Get(binary.BigEndian.Uint32(rec[4*i:])))
	}
	m, err := p.Parse(rec[4*n:], inStream)
	return m, rels, err
}

// subAbort undoes a subtransaction of a streamed job: its worker rolls back to the savepoint it
// took before the subtransaction's first change, if it took one.
func (e *Engine) subAbort(t *reorderbuffer.Txn) error {
	j := e.jobs[t.Xid]
	if j == nil || j.direct {
		return nil
	}
	return j.q.Push(schedule.RollbackRecord(t.SubXid))
}

// abort undoes a job that will not commit.
func (e *Engine) abort(ctx context.Context, t *reorderbuffer.Txn) error {
	j := e.jobs[t.Xid]
	if j == nil {
		return nil
	}
	delete(e.jobs, t.Xid)
	delete(e.serial, t.Xid)
	delete(e.stepwiseXids, t.Xid)
	if e.deps != nil {
		e.deps.Release(&j.Job)
	}
	switch {
	case j.direct:
		defer e.leaderJob.Store(nil)
		if j.begun {
			if err := e.leader.Rollback(ctx); err != nil {
				return err
			}
		}
		// Its sequence number is the last one handed out: nothing to commit under it.
		seq := j.Seq.Load()
		if err := e.order.Wait(ctx, seq-1); err != nil {
			return err
		}
		e.order.Finish(seq)
		return nil
	case j.spooled:
		defer j.letGoParts()
		return j.q.Close()
	default:
		return j.q.Push([]byte{schedule.RecAbort})
	}
}

// commitJob handles the commit of a job: the leader commits a direct job at once, applies a
// spooled one now, and queues the commit of a worker's.
func (e *Engine) commitJob(ctx context.Context, j *job, t *reorderbuffer.Txn) error {
	delete(e.jobs, j.xid)
	delete(e.serial, j.xid)
	delete(e.stepwiseXids, j.xid)
	j.ref = Ref{Xid: t.Xid, Streamed: t.Streamed, CommitLSN: t.CommitLSN, EndLSN: t.EndLSN}
	j.commit = t
	if j.Seq.Load() == 0 {
		j.Seq.Store(e.order.Assign())
	}
	switch {
	case j.direct:
		defer e.leaderJob.Store(nil)
		if j.failed != nil {
			return e.host.TxnError(j.ref, j.failed)
		}
		if err := e.order.Wait(ctx, j.Seq.Load()-1); err != nil {
			return err
		}
		if err := e.commitOn(ctx, e.leader, j, j.begun, nil); err != nil {
			var ce *target.ChangeError
			if errors.As(err, &ce) { // applied alone, after every earlier transaction
				return e.host.TxnError(j.ref, err)
			}
			return e.conflict(j, err)
		}
		return e.ackCommitted(ctx)
	case j.spooled:
		j.known = SourceCommit(t) // applied from here on, on this goroutine
		if err := j.q.Push([]byte{schedule.RecCommit}); err != nil {
			return err
		}
		if err := e.order.Wait(ctx, j.Seq.Load()-1); err != nil {
			return err
		}
		e.leaderJob.Store(j)
		defer e.leaderJob.Store(nil)
		if err := e.runJob(ctx, e.leader, j, nil); err != nil {
			var ce *target.ChangeError
			if errors.As(err, &ce) { // applied alone, after every earlier transaction
				return e.host.TxnError(j.ref, err)
			}
			return err
		}
		return e.ackCommitted(ctx)
	default:
		if j.streamed && e.deps != nil {
			e.deps.After(j.Seq.Load()) // its keys are not tracked
		}
		return j.q.Push([]byte{schedule.RecCommit})
	}
}
