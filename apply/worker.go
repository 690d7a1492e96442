package apply

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
func (s *session) startWorkers(ctx context.Context) error {
	s.order = schedule.NewOrder()
	s.jobs = map[uint32]*job{}
	s.store = schedule.NewSpillStore(s.cfg.Source.Buffer.Dir, s.cfg.Source.Buffer.SpillCompressor)
	_, files := spillFiles(true)
	s.store.SetMaxOpenFiles(files)
	s.budget = schedule.NewBudget(s.cfg.queueMem())
	s.budget.TrackPeak(&s.stats.queuePeak)
	s.share = max(s.cfg.queueMem()/int64(max(s.cfg.Workers, 1)), 64<<10)
	s.free = make(chan *worker, s.cfg.Workers)
	if s.cfg.Mode == Parallel {
		s.deps = schedule.NewTracker()
	}
	for i := range s.cfg.Workers {
		tg, err := connectTarget(ctx, s.cfg.targetOptions(), "pgreorder apply "+s.cfg.Source.Slot+" w"+strconv.Itoa(i+1), &s.stats.Counters)
		if err != nil {
			return err
		}
		w := &worker{id: i + 1, tg: tg, jobs: make(chan *job, 1)}
		tg.SetSettle(func(ctx context.Context) (bool, error) { return s.settle(ctx, w) })
		s.workers = append(s.workers, w)
		_, key := s.fenceKeys()
		if _, err := target.Query(ctx, tg.PG(), "SELECT pg_catalog.pg_advisory_lock_shared($1::bigint)", strconv.FormatInt(key, 10)); err != nil {
			return fmt.Errorf("apply: locking the slot's progress on the target: %w", err)
		}
		if err := s.prepareProgress(ctx, tg); err != nil {
			return err
		}
		if s.cfg.relaxed() {
			if err := tg.PrepareAhead(ctx, target.AheadSQL(s.aheadTable)); err != nil {
				return err
			}
		}
		if err := s.attachConflicts(ctx, tg, i+1); err != nil {
			return err
		}
		s.free <- w
	}
	for _, w := range s.workers {
		s.goRun(func() error { return s.work(ctx, w) })
	}
	s.goRun(func() error { return s.watchdog(ctx) })
	return nil
}

// goRun runs f on its own goroutine; its error ends the session.
func (s *session) goRun(f func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := f(); err != nil {
			s.cancel(err)
		}
	}()
}

// stopWorkers waits for the workers to stop (the session's context is done) and closes their
// connections (the server rolls back what they had open) and the queues.
func (s *session) stopWorkers(ctx context.Context) {
	s.wg.Wait()
	for _, w := range s.workers {
		w.tg.Close(context.WithoutCancel(ctx))
	}
	for _, j := range s.jobs {
		if j.q != nil {
			j.q.Close()
		}
	}
	for _, w := range s.workers {
		if j := w.cur.Load(); j != nil && j.q != nil {
			j.q.Close()
		}
	}
	if err := s.store.Close(); err != nil {
		s.log.Warn("removing spill files", "err", err)
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
func (s *session) settle(ctx context.Context, w *worker) (bool, error) {
	j := w.cur.Load()
	if j == nil {
		return false, nil
	}
	if err := s.cfg.hook(ctx, "conflict", txnRef{Xid: j.xid, Streamed: j.streamed}); err != nil {
		return false, err
	}
	upto := s.order.Last()
	if seq := j.Seq.Load(); seq != 0 {
		upto = seq - 1
	}
	if s.order.Committed() >= upto {
		return false, nil
	}
	if err := s.cfg.hook(ctx, "conflict-settle", txnRef{Xid: j.xid, Streamed: j.streamed}); err != nil {
		return false, err
	}
	prev := w.state.Swap(wsWaiting)
	defer w.state.Store(prev)
	s.stats.conflictWaits.Add(1)
	return true, s.order.Wait(ctx, upto)
}

// work is a worker's loop.
func (s *session) work(ctx context.Context, w *worker) error {
	for {
		w.state.Store(wsIdle)
		select {
		case <-ctx.Done():
			return nil
		case j := <-w.jobs:
			err := s.runJob(ctx, w.tg, j, w)
			w.cur.Store(nil)
			if err != nil {
				return err
			}
			s.free <- w
		}
	}
}

// runJob applies a job's records on tg until its end: its commit, in order, or its abort. A
// change the target refuses rolls the job back; if the job then commits, it is retried alone
// (restartError): it ran alongside transactions that committed before it, which may have been the
// cause.
func (s *session) runJob(ctx context.Context, tg *target.Conn, j *job, w *worker) error {
	tg.Coalesce(j.isRun)
	tg.Stepwise(j.stepwise)
	return schedule.RunJob(ctx, j.q, &jobRun{s: s, tg: tg, j: j, w: w})
}

// jobRun applies a job's records on a target connection (schedule.JobTarget).
type jobRun struct {
	s    *session
	tg   *target.Conn
	j    *job
	w    *worker // nil on the leader's connection
	p    decoding.Parser
	rels []*target.Relation
	cur  *reorderbuffer.Txn // a run's transaction being applied
}

func (r *jobRun) State(st int32) {
	if r.w != nil {
		r.w.state.Store(st)
	}
}

func (r *jobRun) Record(ctx context.Context) error {
	if r.s.cfg.hooks == nil {
		return nil
	}
	return r.s.cfg.hook(ctx, "record", txnRef{Xid: r.j.xid, Streamed: r.j.streamed})
}

func (r *jobRun) Begin() {
	if r.cur != nil { // a run: its current transaction
		r.tg.Begin(r.cur.Xid, sourceCommit(r.cur))
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
	r.tg.Source(t.Xid, sourceCommit(t))
	return nil
}

func (r *jobRun) Change(ctx context.Context, rec []byte) error {
	var m decoding.Message
	var err error
	m, r.rels, err = r.s.decodeChange(&r.p, rec, r.rels)
	if err != nil {
		return schedule.Fatal(err)
	}
	return r.tg.Change(ctx, m, r.rels)
}

func (r *jobRun) Savepoint(ctx context.Context, sub uint32) error { return r.tg.Savepoint(ctx, sub) }

func (r *jobRun) RollbackTo(ctx context.Context, sub uint32) error {
	r.s.stats.subAborts.Add(1)
	return r.tg.RollbackTo(ctx, sub)
}

func (r *jobRun) Flush(ctx context.Context) error {
	if r.j.isRun { // a run's changes go as one group (commitOn)
		return nil
	}
	return r.tg.FlushPending(ctx)
}

func (r *jobRun) Wait(ctx context.Context, seq uint64) error { return r.s.order.Wait(ctx, seq) }

func (r *jobRun) WaitFor(ctx context.Context, seq uint64) error { return r.s.order.WaitFor(ctx, seq) }

func (r *jobRun) Failed(ctx context.Context, err error) (failed, fatal error) {
	return r.s.jobFailed(ctx, r.tg, r.j, err)
}

func (r *jobRun) Abort(ctx context.Context, begun bool) error {
	if begun {
		r.s.stats.aborts.Add(1)
		if err := r.tg.Rollback(ctx); err != nil {
			return err
		}
	}
	if seq := r.j.Seq.Load(); seq != 0 {
		// A committed transaction the consumer turned out to have already (see
		// reorderbuffer.PartAbort): nothing to commit under its number.
		if err := r.s.order.Wait(ctx, seq-1); err != nil {
			return err
		}
		r.s.order.Finish(seq)
		r.s.finished()
	}
	return nil
}

func (r *jobRun) Commit(ctx context.Context, begun bool, failed error) error {
	if failed != nil {
		return &restartError{xids: r.j.xids(), reason: failed}
	}
	err := r.s.commitOn(ctx, r.tg, r.j, begun, r.w)
	var ce *target.ChangeError
	if errors.As(err, &ce) {
		return &restartError{xids: r.j.xids(), reason: err}
	}
	if err != nil {
		return r.s.conflict(r.j, err)
	}
	return nil
}

// jobFailed handles an error while applying a job's records: a change the target refused rolls
// the job back and is returned as failed (the job then only waits for its end); any other error
// ends the session.
func (s *session) jobFailed(ctx context.Context, tg *target.Conn, j *job, err error) (failed, fatal error) {
	var ce *target.ChangeError
	if !errors.As(err, &ce) {
		return nil, s.conflict(j, err)
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
func (s *session) commitOn(ctx context.Context, tg *target.Conn, j *job, begun bool, w *worker) error {
	seq := j.Seq.Load()
	relaxed := s.cfg.relaxed() && w != nil && !j.streamed
	if !relaxed {
		if begun && s.order.Committed() < seq-1 {
			// Not its turn yet: send what is pending meanwhile, so that the commit is one round trip.
			if err := tg.FlushPending(ctx); err != nil {
				return err
			}
		}
		if w != nil {
			w.state.Store(wsWaiting)
		}
		if err := s.order.Wait(ctx, seq-1); err != nil {
			return err
		}
		if w != nil {
			w.state.Store(wsApplying)
		}
	}
	if j.isRun {
		return s.commitRun(ctx, tg, j, begun, w, relaxed)
	}
	durable := s.cfg.SynchronousCommit
	var progress decoding.LSN // the progress row written, if any
	var before uint64
	if begun {
		if err := s.cfg.hook(ctx, "before-commit", j.ref); err != nil {
			return err
		}
		durable = s.syncCommit()
		if !durable {
			if err := s.cfg.hook(ctx, "async-commit", j.ref); err != nil {
				return err
			}
		}
		tg.Source(j.xid, sourceCommit(j.commit))
		var err error
		before, progress, err = s.commitTarget(ctx, tg, w, relaxed, schedule.Span{First: j.ref.EndLSN, Last: j.ref.EndLSN}, durable)
		if err != nil {
			return err
		}
	} else {
		s.stats.emptyTxns.Add(1)
	}
	s.order.Finish(seq)
	s.stats.txns.Add(1)
	if err := s.cfg.hook(ctx, "after-commit", j.ref); err != nil {
		return err
	}
	s.committed(commitRef{seq: seq, txn: j.commit, job: j, progress: progress, before: before}, durable)
	return nil
}

// commitTarget commits the open target transaction of the transactions sp on tg, with the
// progress row at sp.Last, or with relaxed, the worker's row of the ahead table: the prefix as it
// is now, and sp with the worker's other spans past it. It returns the committed prefix (a
// sequence number) before the commit was sent, and the position of the progress row written.
func (s *session) commitTarget(ctx context.Context, tg *target.Conn, w *worker, relaxed bool, sp schedule.Span, durable bool) (before uint64, progress decoding.LSN, err error) {
	if !relaxed {
		before = s.order.Committed()
		return before, sp.Last, tg.Commit(ctx, s.key, sp.Last, durable)
	}
	before, prefix := s.prefix()
	if j := w.cur.Load(); j != nil && j.Seq.Load() > before+1 {
		s.stats.committedAhead.Add(1)
	}
	w.ahead.Prune(prefix)
	w.ahead.Add(sp)
	args := target.AheadArgs(s.key, w.id, prefix, w.ahead.Flat())
	return before, prefix, tg.CommitAhead(ctx, args, sp.Last, durable)
}

// commitRun commits a run on tg, in its turn (or, relaxed, at once), with the progress row of its
// last transaction, and hands its transactions over for acknowledgement, in order: the commit is
// that of each, and the hooks are called for each.
func (s *session) commitRun(ctx context.Context, tg *target.Conn, j *job, begun bool, w *worker, relaxed bool) error {
	seq := j.Seq.Load()
	durable := s.cfg.SynchronousCommit
	var progress decoding.LSN // the progress row written, if any
	var before uint64
	if begun {
		for _, m := range j.members {
			if err := s.cfg.hook(ctx, "before-commit", m.ref); err != nil {
				return err
			}
		}
		durable = s.syncCommit()
		if !durable {
			for _, m := range j.members {
				if err := s.cfg.hook(ctx, "async-commit", m.ref); err != nil {
					return err
				}
			}
		}
		tg.Source(j.commit.Xid, sourceCommit(j.commit))
		sp := schedule.Span{First: j.members[0].ref.EndLSN, Last: j.ref.EndLSN}
		var err error
		if before, progress, err = s.commitTarget(ctx, tg, w, relaxed, sp, durable); err != nil {
			return err
		}
	}
	s.order.Finish(seq)
	if begun {
		s.stats.runsOnWorkers.Add(1)
	}
	for _, m := range j.members {
		s.stats.txns.Add(1)
		if !m.changed || !begun {
			s.stats.emptyTxns.Add(1)
		}
		s.committed(commitRef{seq: seq, txn: m.txn, job: j, progress: progress, before: before}, durable)
	}
	for _, m := range j.members {
		if err := s.cfg.hook(ctx, "after-commit", m.ref); err != nil {
			return err
		}
	}
	return nil
}
