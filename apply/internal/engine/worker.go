package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Workers (Eager and Parallel): the goroutines with a target connection of their own that apply
// the jobs the leader hands them (see eager.go), each committed in its turn with the progress
// row, or with relaxed commit order at once with the worker's row of the ahead table.

// worker is a goroutine with a target connection that applies one job at a time.
type worker struct {
	id    int
	tg    *target.Conn
	jobs  chan *job
	state atomic.Int32
	cur   atomic.Pointer[job]
	ahead schedule.Ahead // relaxed commit order: what its row of the ahead table records
}

// startWorkers connects the workers and starts their goroutines and the watchdog's.
func (e *Engine) startWorkers(ctx context.Context) error {
	e.order = schedule.NewOrder()
	e.jobs = map[uint32]*job{}
	e.store = schedule.NewSpillStore(e.cfg.SpillDir, e.cfg.SpillCompressor)
	e.store.SetMaxOpenFiles(e.cfg.QueueFiles)
	if e.cfg.Memory == nil { // a reorder buffer of its own limit: the queues get a default one
		e.cfg.Memory = reorderbuffer.NewMemory(0)
	}
	e.budget = schedule.NewBudget(e.cfg.Memory)
	e.budget.TrackPeak(&e.stats.QueuePeak)
	e.share = max(e.cfg.Memory.Limit()/int64(max(e.cfg.Workers, 1)), 64<<10)
	e.free = make(chan *worker, e.cfg.Workers)
	if e.cfg.Mode == Parallel {
		e.deps = schedule.NewTracker()
	}
	for i := range e.cfg.Workers {
		tg, err := e.host.ConnectWorker(ctx, i+1)
		if err != nil {
			return err
		}
		w := &worker{id: i + 1, tg: tg, jobs: make(chan *job, 1)}
		tg.SetSettle(func(ctx context.Context) (bool, error) { return e.settle(ctx, w) })
		e.workers = append(e.workers, w)
		e.free <- w
	}
	for _, w := range e.workers {
		e.goRun(func() error { return e.work(ctx, w) })
	}
	e.goRun(func() error { return e.watchdog(ctx) })
	return nil
}

// goRun runs f on its own goroutine; its error ends the session.
func (e *Engine) goRun(f func() error) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := f(); err != nil {
			e.cancel(err)
		}
	}()
}

// stopWorkers waits for the workers to stop (the session's context is done) and closes their
// connections (the server rolls back what they had open) and the queues.
func (e *Engine) stopWorkers(ctx context.Context) {
	e.wg.Wait()
	for _, w := range e.workers {
		w.tg.Close(context.WithoutCancel(ctx))
	}
	for _, j := range e.jobs {
		if j.q != nil {
			j.q.Close()
			j.letGoParts()
		}
	}
	for _, w := range e.workers {
		if j := w.cur.Load(); j != nil && j.q != nil {
			j.q.Close()
			j.letGoParts()
		}
	}
	if j := e.run; j != nil {
		j.q.Close()
		j.letGoParts()
	}
	if err := e.store.Close(); err != nil {
		e.log.Warn("removing spill files", "err", err)
	}
}

// settle is what w's connection calls before it resolves a conflict of a unique index (see
// target.Conn.SetSettle): the conflicting row may belong to a transaction before w's in commit
// order that is still in flight and deletes it, or moves it off the value, which the dependency
// tracker cannot see (a DELETE or UPDATE sends the replica identity key, not the other unique
// columns of the old row). The job waits, as it waits for its turn, holding its locks (the
// watchdog breaks the waits that would never end), until every transaction before it committed:
// those with a lower sequence number, or every one numbered so far while its commit has not
// arrived (those that commit later on the source were not there when it made its change).
// Then the target's rows say whether the source had the conflict.
func (e *Engine) settle(ctx context.Context, w *worker) (bool, error) {
	j := w.cur.Load()
	if j == nil {
		return false, nil
	}
	if err := e.host.Hook(ctx, "conflict", Ref{Xid: j.xid, Streamed: j.streamed}); err != nil {
		return false, err
	}
	upto := e.order.Last()
	if seq := j.Seq.Load(); seq != 0 {
		upto = seq - 1
	}
	if e.order.Committed() >= upto {
		return false, nil
	}
	if err := e.host.Hook(ctx, "conflict-settle", Ref{Xid: j.xid, Streamed: j.streamed}); err != nil {
		return false, err
	}
	prev := w.state.Swap(wsWaiting)
	defer w.state.Store(prev)
	e.stats.ConflictWaits.Add(1)
	return true, e.order.Wait(ctx, upto)
}

// work is a worker's loop.
func (e *Engine) work(ctx context.Context, w *worker) error {
	for {
		w.state.Store(wsIdle)
		select {
		case <-ctx.Done():
			return nil
		case j := <-w.jobs:
			err := e.runJob(ctx, w.tg, j, w)
			w.cur.Store(nil)
			if err != nil {
				return err
			}
			e.free <- w
		}
	}
}

// runJob applies a job's records on tg until its end: its commit, in order, or its abort. A
// change the target refuses rolls the job back; if the job then commits, it is retried alone
// (Host.Restart): it ran alongside transactions that committed before it, which may have been the
// cause.
func (e *Engine) runJob(ctx context.Context, tg *target.Conn, j *job, w *worker) error {
	tg.Coalesce(j.isRun)
	tg.Stepwise(j.stepwise)
	defer j.letGoParts()
	return schedule.RunJob(ctx, j.q, &jobRun{e: e, tg: tg, j: j, w: w})
}

// jobRun applies a job's records on a target connection (schedule.JobTarget).
type jobRun struct {
	e    *Engine
	tg   *target.Conn
	j    *job
	w    *worker // nil on the leader's connection
	p    decoding.Parser
	rels []*target.Relation
	cur  *reorderbuffer.Txn // a run's transaction being applied
	subs []uint32           // a streamed job's subtransactions with a savepoint, in order
	seen map[uint32]bool    // a streamed job's subtransactions seen
}

func (r *jobRun) State(st int32) {
	if r.w != nil {
		r.w.state.Store(st)
	}
}

func (r *jobRun) Record(ctx context.Context) error {
	if !r.e.cfg.Hooks {
		return nil
	}
	return r.e.host.Hook(ctx, "record", Ref{Xid: r.j.xid, Streamed: r.j.streamed})
}

func (r *jobRun) Begin() {
	if r.cur != nil { // a run: its current transaction
		r.tg.Begin(r.cur.Xid, SourceCommit(r.cur))
		return
	}
	r.tg.Begin(r.j.xid, r.j.known)
}

func (r *jobRun) Txn(ctx context.Context, i uint32) error {
	r.j.mu.Lock()
	if int(i) >= len(r.j.members) {
		r.j.mu.Unlock()
		return schedule.Fatal(fmt.Errorf("apply: run of transaction %d: no transaction %d", r.j.xid, i))
	}
	t := r.j.members[i].txn
	r.j.mu.Unlock()
	// Conflicts name their own source transaction.
	r.cur = t
	r.tg.Source(t.Xid, SourceCommit(t))
	return nil
}

func (r *jobRun) Change(ctx context.Context, rec []byte) error {
	var m decoding.Message
	var err error
	m, r.rels, err = r.e.decodeChange(&r.p, rec, r.rels)
	if err != nil {
		return schedule.Fatal(err)
	}
	return r.change(ctx, m, r.rels)
}

func (r *jobRun) Part(ctx context.Context, i uint32) error { return r.applyPart(ctx, i) }

// change applies m of a streamed job's subtransaction after the savepoint it takes before the
// subtransaction's first change.
func (r *jobRun) change(ctx context.Context, m decoding.Message, rels []*target.Relation) error {
	if r.j.streamed {
		if sub := decoding.ChangeXid(m); sub != 0 && sub != r.j.xid && !r.seen[sub] {
			if r.seen == nil {
				r.seen = map[uint32]bool{}
			}
			r.seen[sub] = true
			r.subs = append(r.subs, sub)
			if err := r.tg.Savepoint(ctx, sub); err != nil {
				return err
			}
		}
	}
	return r.tg.Change(ctx, m, rels)
}

// RollbackTo rolls back to the savepoint of subtransaction sub, if it took one; the savepoints
// taken after it go too. A subtransaction without one wrote nothing the job applied.
func (r *jobRun) RollbackTo(ctx context.Context, sub uint32) error {
	for i, s := range r.subs {
		if s == sub {
			r.subs = r.subs[:i]
			r.e.stats.SubAborts.Add(1)
			return r.tg.RollbackTo(ctx, sub)
		}
	}
	return nil
}

func (r *jobRun) Flush(ctx context.Context) error {
	if r.j.isRun { // a run's changes go as one group (commitOn)
		return nil
	}
	return r.tg.SendAhead(ctx)
}

func (r *jobRun) Wait(ctx context.Context, seq uint64) error { return r.e.order.Wait(ctx, seq) }

func (r *jobRun) WaitFor(ctx context.Context, seq uint64) error { return r.e.order.WaitFor(ctx, seq) }

func (r *jobRun) Failed(ctx context.Context, err error) (failed, fatal error) {
	return r.e.jobFailed(ctx, r.tg, r.j, err)
}

func (r *jobRun) Abort(ctx context.Context, begun bool) error {
	if begun {
		r.e.stats.Aborts.Add(1)
		if err := r.tg.Rollback(ctx); err != nil {
			return err
		}
	}
	if seq := r.j.Seq.Load(); seq != 0 {
		// A committed transaction the consumer turned out to have already (see
		// reorderbuffer.PartAbort): nothing to commit under its number.
		if err := r.e.order.Wait(ctx, seq-1); err != nil {
			return err
		}
		r.e.order.Finish(seq)
		r.e.finished()
	}
	return nil
}

func (r *jobRun) Commit(ctx context.Context, begun bool, failed error) error {
	if failed != nil {
		return r.e.host.Restart(r.j.xids(), failed)
	}
	err := r.e.commitOn(ctx, r.tg, r.j, begun, r.w)
	var ce *target.ChangeError
	if errors.As(err, &ce) {
		return r.e.host.Restart(r.j.xids(), err)
	}
	if err != nil {
		return r.e.conflict(r.j, err)
	}
	return nil
}

// jobFailed handles an error while applying a job's records: a change the target refused rolls
// the job back and is returned as failed (the job then only waits for its end); any other error
// ends the session.
func (e *Engine) jobFailed(ctx context.Context, tg *target.Conn, j *job, err error) (failed, fatal error) {
	var ce *target.ChangeError
	if !errors.As(err, &ce) {
		return nil, e.conflict(j, err)
	}
	if rerr := tg.Rollback(ctx); rerr != nil {
		return nil, rerr
	}
	return err, nil
}

// commitOn commits j on tg in its turn, with the progress row, and hands it over for
// acknowledgement. begun says whether it has a target transaction (otherwise there was nothing
// to apply). With relaxed commit order, a committed transaction a worker applied (not a streamed
// one) commits without waiting for its turn, writing the worker's row of the ahead table.
func (e *Engine) commitOn(ctx context.Context, tg *target.Conn, j *job, begun bool, w *worker) error {
	seq := j.Seq.Load()
	relaxed := e.cfg.Relaxed && w != nil && !j.streamed
	if !relaxed {
		if begun && e.order.Committed() < seq-1 {
			// Not its turn yet: send what is pending meanwhile, so that the commit is one round trip.
			if err := tg.FlushPending(ctx); err != nil {
				return err
			}
		}
		if w != nil {
			w.state.Store(wsWaiting)
		}
		if err := e.order.Wait(ctx, seq-1); err != nil {
			return err
		}
		if w != nil {
			w.state.Store(wsApplying)
		}
	}
	if j.isRun {
		return e.commitRun(ctx, tg, j, begun, w, relaxed)
	}
	durable := e.cfg.SynchronousCommit
	var progress decoding.LSN // the progress row written, if any
	var before uint64
	if begun {
		if err := e.host.Hook(ctx, "before-commit", j.ref); err != nil {
			return err
		}
		durable = e.syncCommit()
		if !durable {
			if err := e.host.Hook(ctx, "async-commit", j.ref); err != nil {
				return err
			}
		}
		tg.Source(j.xid, SourceCommit(j.commit))
		var err error
		before, progress, err = e.commitTarget(ctx, tg, w, relaxed, schedule.Span{First: j.ref.EndLSN, Last: j.ref.EndLSN}, durable)
		if err != nil {
			return err
		}
	} else {
		e.stats.EmptyTxns.Add(1)
	}
	e.order.Finish(seq)
	e.txns.Add(1)
	if err := e.host.Hook(ctx, "after-commit", j.ref); err != nil {
		return err
	}
	e.committed(commitOf(seq, j.commit, j, progress, before), durable)
	return nil
}

// commitTarget commits the open target transaction of the transactions sp on tg, with the
// progress row at sp.Last, or with relaxed, the worker's row of the ahead table: the prefix as it
// is now, and sp with the worker's other spans past it. It returns the committed prefix (a
// sequence number) before the commit was sent, and the position of the progress row written.
func (e *Engine) commitTarget(ctx context.Context, tg *target.Conn, w *worker, relaxed bool, sp schedule.Span, durable bool) (before uint64, progress decoding.LSN, err error) {
	if !relaxed {
		before = e.order.Committed()
		return before, sp.Last, tg.Commit(ctx, e.key, sp.Last, durable)
	}
	before, prefix := e.prefix()
	if j := w.cur.Load(); j != nil && j.Seq.Load() > before+1 {
		e.stats.CommittedAhead.Add(1)
	}
	w.ahead.Prune(prefix)
	w.ahead.Add(sp)
	args := target.AheadArgs(e.key, w.id, prefix, w.ahead.Flat())
	return before, prefix, tg.CommitAhead(ctx, args, sp.Last, durable)
}

// commitRun commits a run on tg, in its turn (or, relaxed, at once), with the progress row of its
// last transaction, and hands its transactions over for acknowledgement, in order: the commit is
// that of each, and the hooks are called for each.
func (e *Engine) commitRun(ctx context.Context, tg *target.Conn, j *job, begun bool, w *worker, relaxed bool) error {
	seq := j.Seq.Load()
	durable := e.cfg.SynchronousCommit
	var progress decoding.LSN // the progress row written, if any
	var before uint64
	if begun {
		for _, m := range j.members {
			if err := e.host.Hook(ctx, "before-commit", m.ref); err != nil {
				return err
			}
		}
		durable = e.syncCommit()
		if !durable {
			for _, m := range j.members {
				if err := e.host.Hook(ctx, "async-commit", m.ref); err != nil {
					return err
				}
			}
		}
		tg.Source(j.commit.Xid, SourceCommit(j.commit))
		sp := schedule.Span{First: j.members[0].ref.EndLSN, Last: j.ref.EndLSN}
		var err error
		if before, progress, err = e.commitTarget(ctx, tg, w, relaxed, sp, durable); err != nil {
			return err
		}
	}
	e.order.Finish(seq)
	if begun {
		e.stats.RunsOnWorkers.Add(1)
	}
	for _, m := range j.members {
		e.txns.Add(1)
		if !m.changed || !begun {
			e.stats.EmptyTxns.Add(1)
		}
		e.committed(commitOf(seq, m.txn, j, progress, before), durable)
	}
	for _, m := range j.members {
		if err := e.host.Hook(ctx, "after-commit", m.ref); err != nil {
			return err
		}
	}
	return nil
}
