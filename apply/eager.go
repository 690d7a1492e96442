package apply

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Eager and parallel apply. The leader (the goroutine that reads the stream) turns each source
// transaction into a job:
//
//   - a streamed transaction is applied by a worker (a goroutine with a target connection of its
//     own) while it is still running on the source: the leader copies each part's changes into the
//     job's queue, with a SAVEPOINT before the first change of each subtransaction and a ROLLBACK TO
//     SAVEPOINT when one aborts; the worker applies them as they come. Without a free worker the
//     job is spooled: queued the same way, and applied by the leader at its commit.
//   - a non-streamed transaction (committed on the source before its first change is sent) is
//     applied by the leader on its own connection as its parts arrive (Eager), or by a free worker
//     (Parallel).
//
// Every job gets a sequence number when its commit arrives (a non-streamed one at its first
// part: nothing can commit in between) and commits only after the job before it (order), with the
// progress row, in the same target transaction. The acknowledgement to the source follows the
// commit; the leader sends them (a worker's commits wake it up when it waits for the stream).

// A job's queue holds schedule's records; a schedule.RecChange is the reorder buffer's record of
// the change (the pgoutput message) behind the registry ids of its relations (encodeChange).

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
	stepwise bool            // applied one statement at a time (Applier.stepwise, read when the job begins)

	// Set by the leader before it queues schedule.RecCommit; read by the worker after.
	ref    txnRef
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
	opened  time.Time // leader only: when the run took its first transaction
	changes int       // leader only: the changes queued
	// Leader only (see chain): whether the run before it in commit order was a run too, 1 + the
	// index of its first member with a change, and of the member that first queued a wait for
	// the run before it (0: none; -1: it became serial first).
	afterRun bool
	firstAt  int
	chainAt  int
	probe    bool // leader only: opened as a probe (see chain)
	unwoken  int  // leader only: records appended to a run's queue since its worker was woken (see runWake)

	// Leader only.
	begun   bool            // direct: the target transaction has begun
	failed  error           // direct: a change the target refused (reported at the commit)
	subs    []uint32        // subtransactions with a savepoint, in order
	seen    map[uint32]bool // subtransactions seen
	waitFor uint64          // the highest sequence number a schedule.RecWait was queued for
	after   map[uint64]bool // relaxed: the sequence numbers a schedule.RecAfter was queued for
}

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
	s.store = schedule.NewSpillStore(s.cfg.SpillDir, s.cfg.SpillCodec)
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
		tg, err := connectTarget(ctx, s.cfg.targetOptions(), "pgreorder apply "+s.cfg.Slot+" w"+strconv.Itoa(i+1), &s.stats.Counters)
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

// runIncremental is the leader's loop in Eager and Parallel.
func (s *session) runIncremental(ctx context.Context) error {
	defer s.abandonGroup()
	for {
		if err := s.ackCommitted(ctx); err != nil {
			return err
		}
		if s.caughtUp() {
			return errCaughtUp
		}
		t, err := s.next(ctx)
		if err != nil {
			if errors.Is(err, errIdle) && s.group.open() { // nothing more to read: commit
				err = s.endGroup(ctx)
			} else if errors.Is(err, errIdle) && s.run != nil && s.runStartable() {
				err = s.sealRun()
			} else {
				err = s.wakeUp(ctx, err)
			}
			if err != nil {
				return err
			}
			continue
		}
		if s.groupable(t) {
			if err := s.runGrouped(ctx, t); err != nil {
				return err
			}
			continue
		}
		if err := s.endGroup(ctx); err != nil {
			return err
		}
		if s.runnable(t) {
			if err := s.addToRun(ctx, t); err != nil {
				return err
			}
			continue
		}
		if err := s.sealRun(); err != nil {
			return err
		}
		switch {
		case t.NonTransactional:
			if err := s.stream.Ack(t); err != nil {
				return err
			}
		case t.Part == reorderbuffer.Advance:
			err = s.advanced(ctx, t)
		case t.Part == reorderbuffer.PartChanges || t.Part == reorderbuffer.PartCommit:
			err = s.part(ctx, t)
		case t.Part == reorderbuffer.PartSubAbort:
			err = s.subAbort(t)
		case t.Part == reorderbuffer.PartAbort:
			err = s.abort(ctx, t)
		default:
			err = fmt.Errorf("apply: unexpected %v transaction %d from an incremental stream", t.Part, t.Xid)
		}
		if err != nil {
			return err
		}
	}
}

// Runs (Eager). A committed transaction that arrives whole (one PartCommit, not streamed) while no
// other transaction is in flight (none open on a worker, every earlier one committed) is applied
// on the leader's connection in the open group, as Buffered applies it (applyGrouped): the
// consecutive whole transactions the stream has already delivered form one run, applied
// set-based in one target transaction that ends with the progress row of its last. Anything
// else the stream hands out (a part of a streamed or large transaction, an abort, an idle
// advance, a transaction to apply alone) commits the run first, so the sequence numbers the
// run's transactions take at its commit are the next ones in commit order, and a streamed
// transaction's changes come after the run's commit, which they may read.
//
// The run stays on the leader because handing it to a worker would cost a round trip of
// handoff per run while gaining nothing when each run depends on the one before (rows every
// transaction updates, as in pgbench): the leader's connection applies runs as fast as
// Buffered does, and workers keep the streamed transactions, which they apply while the leader
// reads on.

// groupable says whether t joins the open run (or opens one): in Eager, and in Parallel while
// its runs are chained (see chain).
func (s *session) groupable(t *reorderbuffer.Txn) bool {
	if s.cfg.Mode == Parallel {
		return !(s.cfg.hooks != nil && s.cfg.hooks.workersOnly) && s.chain.leads() && s.run == nil && len(s.jobs) == 0 && s.runnable(t)
	}
	return s.cfg.Mode == Eager && !t.NonTransactional && t.Part == reorderbuffer.PartCommit && !t.Streamed &&
		len(s.jobs) == 0 && !s.a.serial[t.Xid]
}

// runGrouped applies t in the open run, opening one, after every earlier transaction
// committed, if there is none.
func (s *session) runGrouped(ctx context.Context, t *reorderbuffer.Txn) error {
	// Parallel's groups take no more transactions than its runs (Config.runTxns, tests only).
	if s.cfg.Mode == Parallel && s.group.open() && s.cfg.runTxns > 0 && len(s.group.members) >= s.cfg.runTxns {
		if err := s.commitGroup(ctx); err != nil {
			return err
		}
	}
	if !s.group.open() {
		if err := s.order.Wait(ctx, s.order.Last()); err != nil {
			return err
		}
	}
	return s.applyGrouped(ctx, t)
}

// endGroup commits the open run, if any; the leader's connection then applies one statement
// per change again.
func (s *session) endGroup(ctx context.Context) error {
	if !s.group.open() {
		return nil
	}
	err := s.commitGroup(ctx)
	s.leader.Coalesce(false)
	return err
}

// Runs (Parallel). The whole committed transactions the stream delivers one after another (one
// PartCommit each, not streamed) form runs: a worker applies a run as Buffered applies a group
// (target.Conn.Coalesce: each table's net changes as set statements), in one target transaction
// that ends with the progress row of its last transaction, committed in its turn. A run is one job
// of the commit order and of the dependency tracker: its changes wait, as a transaction's would,
// for the earlier runs in flight that touched the same rows, so runs that touch different rows are
// applied at once, and a run that depends on the one before waits for its commit while the leader
// fills the next. A run takes transactions up to the limits of a group (groupMaxTxns,
// groupMaxChanges, groupMaxAge), and ends when the stream has nothing more to read and nothing
// earlier it would wait for is in flight (runStartable), or when it hands out anything else (a part
// of a streamed or large transaction, an abort, an idle advance, a transaction to apply alone): the
// run's commit then comes before it in commit order. Handing a run over costs the leader nothing
// per transaction; its worker sends the run's changes, reduced to set statements, with its commit
// (or, sooner, while it waits for its turn to commit), as Buffered sends a group's.

// Chained runs (Parallel). When each run waits, before it applies anything, for the commit of the
// run just before it (rows every transaction updates, as in pgbench), the workers apply the runs
// one after another and handing them over (queueing each change, waking the worker, which parses it
// again) is all that parallel apply adds. The leader therefore watches the runs it seals: a run is
// chained when the run before it in commit order was one too, still in flight, and the run's first
// transaction with changes already queued a wait for it (what the dependency tracker said as the
// leader queued the changes: a wait is queued only for a run not yet committed). A run that meets a
// hot row only here and there is not: its worker goes through what comes before the wait while the
// run before it commits. Nor is a run that waits because it became serial (a change without a
// usable key, TRUNCATE, triggers) before any such wait: its changes go one statement each, work on
// the target that gains from the leader reading on meanwhile. After chainRuns chained runs in a row
// the leader applies whole transactions itself, as Eager does (groupable): as Buffered groups,
// set-based, on its own connection, each group in one target transaction with the progress row of
// its last, after every earlier transaction committed and before anything later is handed out, so
// in source order whatever the commit order. Streamed transactions still go to workers meanwhile,
// and a transaction that cannot join a run does not join a group either. After chainProbe groups it
// hands runs to the workers again, a probe: the first one follows a group, which it cannot wait
// for, and shows nothing; the next one says whether the runs are still chained. A probe's runs take
// at most chainProbeTxns transactions each, so that a probe costs the leader, which waits for their
// commits before it takes over again, two small commits rather than two full runs. A run found
// chained by its first transaction takes no more either: the chainRuns chained runs that hand the
// runs to the leader are small too. A probe that finds the runs still chained doubles the number of
// groups before the next one, up to chainProbeMax: runs chained for long cost fewer and fewer
// probes. A run that is not chained hands the following ones (of full size) to workers until
// chainRuns chained runs come in a row again, and the next time the leader takes over it probes
// after chainProbe groups again.
const (
	chainRuns      = 3
	chainProbe     = 16
	chainProbeMax  = 256
	chainProbeTxns = 32
)

// chain is what the leader learned of its recent runs (see Chained runs).
type chain struct {
	streak  int    // chained runs in a row
	lead    bool   // whole transactions go into groups on the leader
	groups  int    // groups the leader committed since it took over, or since the last probe
	every   int    // groups between probes now (0: chainProbe)
	lastRun uint64 // the sequence number of the last run opened
}

// interval returns the number of groups the leader commits before its next probe.
func (c *chain) interval() int {
	if c.every == 0 {
		return chainProbe
	}
	return c.every
}

// leads says whether the leader applies whole transactions itself now.
func (c *chain) leads() bool { return c.lead && c.groups < c.interval() }

// probing says whether the runs handed to the workers now are a probe.
func (c *chain) probing() bool { return c.lead && c.groups >= c.interval() }

// opened notes a run that took sequence number seq.
func (c *chain) opened(j *job, seq uint64) {
	j.afterRun = c.lastRun != 0 && c.lastRun == seq-1
	j.probe = c.probing()
	c.lastRun = seq
}

// sealed learns from a run about to be sealed. It reports whether the leader, which applied
// whole transactions itself, hands them to the workers again (the run was not chained).
func (c *chain) sealed(j *job) (handback bool) {
	if !j.afterRun { // it could wait for no run: it shows nothing
		return false
	}
	if !j.chained() {
		handback = c.lead
		c.streak, c.lead, c.every = 0, false, 0
		return handback
	}
	c.streak++
	if c.streak < chainRuns {
		return false
	}
	if j.probe { // still chained: the next probe comes later
		c.every = min(2*c.interval(), chainProbeMax)
	}
	c.lead, c.groups = true, 0
	return false
}

// chained says whether the run j, sealed now, is chained (see chain): its first transaction
// with changes waited for the run before it.
func (j *job) chained() bool { return j.afterRun && j.chainAt > 0 && j.chainAt == j.firstAt }

// groupCommitted notes a group the leader committed.
func (c *chain) groupCommitted() { c.groups++ }

// runnable says whether t joins the open run (or opens one).
func (s *session) runnable(t *reorderbuffer.Txn) bool {
	return s.cfg.Mode == Parallel && !t.NonTransactional && t.Part == reorderbuffer.PartCommit && !t.Streamed &&
		s.jobs[t.Xid] == nil && !s.a.serial[t.Xid] && !(s.det != nil && s.leader.Origin() != "" && lastUpdateWins(&s.cfg.Conflicts))
}

// addToRun queues t in the open run, after sealing it if it is full, or in a new one.
func (s *session) addToRun(ctx context.Context, t *reorderbuffer.Txn) error {
	now := s.cfg.now()
	if j := s.run; j != nil && (s.runFull() || now.Sub(j.opened) >= groupMaxAge) {
		if err := s.sealRun(); err != nil {
			return err
		}
		if s.groupable(t) { // the runs are chained: the leader takes over
			return s.runGrouped(ctx, t)
		}
	}
	if s.run == nil {
		w, err := s.takeWorker(ctx)
		if err != nil {
			return err
		}
		if w == nil { // every worker holds a streamed transaction still open: the leader applies t
			return s.part(ctx, t)
		}
		j := &job{xid: t.Xid, isRun: true, opened: now, stepwise: s.stepwise(t.Xid)}
		j.Seq.Store(s.order.Assign())
		s.chain.opened(j, j.Seq.Load())
		j.q = schedule.NewQueue(s.store, s.budget, s.share, &s.stats.queueSpilled)
		w.cur.Store(j)
		w.jobs <- j
		s.run = j
	}
	j := s.run
	j.mu.Lock()
	j.members = append(j.members, groupMember{txn: t, ref: txnRef{Xid: t.Xid, CommitLSN: t.CommitLSN, EndLSN: t.EndLSN}})
	i := len(j.members) - 1
	j.mu.Unlock()
	if err := j.q.Append(schedule.TxnRecord(uint32(i))); err != nil {
		return err
	}
	j.unwoken++
	if s.alreadyApplied(t) { // committed before the restart: an empty member
		return nil
	}
	changed := false
	err := s.eachRecord(t, func(c decoding.Change, rels []*target.Relation) error {
		if err := s.depend(ctx, j, c.Msg, rels); err != nil {
			return err
		}
		rec, err := encodeChange(c, rels)
		if err != nil {
			return err
		}
		changed = true
		j.changes++
		j.unwoken++
		return j.q.Append(rec)
	})
	if changed {
		j.mu.Lock()
		j.members[i].changed = true
		j.mu.Unlock()
	}
	if j.unwoken >= runWake {
		j.unwoken = 0
		j.q.Wake()
	}
	return err
}

// runWake is how many records the leader appends to a run's queue before it wakes the run's
// worker, at the end of a transaction; the run's commit wakes it too. The worker absorbs a run's
// changes into set statements (target.Conn.Coalesce) and sends them at the commit, or when it
// waits: woken for every record, it would take a goroutine wake-up per change, on the cores
// the leader and the servers need, for no earlier statement.
const runWake = 64

// runStartable says whether the open run, sealed now, could commit at once: every transaction
// before it committed (relaxed: every one it waits for), or it is full. The stream running dry
// seals a run only then. While an earlier run it would wait for is still in flight, the open
// one keeps taking the transactions that arrive instead: sealed, it would only wait, and
// a backlog the source delivers in bursts would otherwise be cut into many small runs, each a
// commit of its own, where Buffered's groups grow during each commit's round trip. The earlier
// commit wakes the leader (session.committed), which then seals the run once nothing more
// is ready; every earlier transaction has all its records queued, so none of them waits for
// the leader.
func (s *session) runStartable() bool {
	j := s.run
	if j == nil || s.runFull() {
		return true
	}
	done := s.order.Committed()
	if !s.cfg.relaxed() {
		return done >= j.Seq.Load()-1
	}
	// Relaxed: it commits as soon as what it waits for did.
	if j.waitFor > done {
		return false
	}
	for dep := range j.after {
		if dep > done && !s.order.Finished(dep) {
			return false
		}
	}
	return true
}

// runFull says whether the open run took as many transactions or changes as a run may.
func (s *session) runFull() bool {
	maxTxns := groupMaxTxns
	if s.cfg.runTxns > 0 {
		maxTxns = s.cfg.runTxns
	}
	j := s.run
	if j.probe || j.chained() { // small while it only tells whether the runs are chained
		maxTxns = min(maxTxns, chainProbeTxns)
	}
	return len(j.members) >= maxTxns || j.changes >= groupMaxChanges
}

// sealRun queues the commit of the open run, if any.
func (s *session) sealRun() error {
	j := s.run
	if j == nil {
		return nil
	}
	s.run = nil
	if s.chain.sealed(j) {
		s.stats.handbacks.Add(1)
	}
	j.mu.Lock()
	last := j.members[len(j.members)-1]
	j.mu.Unlock()
	j.ref, j.commit = last.ref, last.txn
	return j.q.Push([]byte{schedule.RecCommit})
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
func (s *session) part(ctx context.Context, t *reorderbuffer.Txn) error {
	if s.alreadyApplied(t) {
		return s.skipApplied(ctx, t)
	}
	j := s.jobs[t.Xid]
	if j == nil {
		var err error
		if j, err = s.newJob(ctx, t); err != nil {
			return err
		}
		s.jobs[t.Xid] = j
		s.log.Debug("transaction", "xid", t.Xid, "streamed", t.Streamed, "direct", j.direct, "spooled", j.spooled, "seq", j.Seq.Load())
	}
	var err error
	if j.direct {
		err = s.applyDirect(ctx, j, t)
	} else {
		err = s.enqueue(ctx, j, t)
	}
	if err != nil {
		return err
	}
	if t.Part == reorderbuffer.PartCommit {
		return s.commitJob(ctx, j, t)
	}
	return nil
}

// newJob decides who applies a transaction whose first part arrived.
func (s *session) newJob(ctx context.Context, t *reorderbuffer.Txn) (*job, error) {
	j := &job{xid: t.Xid, streamed: t.Streamed, stepwise: s.stepwise(t.Xid)}
	if t.Part == reorderbuffer.PartCommit {
		j.known = sourceCommit(t)
	}
	if !t.Streamed {
		// Committed on the source already: it is next in commit order.
		j.Seq.Store(s.order.Assign())
		if s.cfg.Mode != Parallel || s.a.serial[t.Xid] {
			j.direct = true
			return j, nil
		}
		w, err := s.takeWorker(ctx)
		if err != nil {
			return nil, err
		}
		if w == nil {
			j.direct = true
			return j, nil
		}
		j.q = schedule.NewQueue(s.store, s.budget, s.share, &s.stats.queueSpilled)
		w.cur.Store(j)
		w.jobs <- j
		return j, nil
	}
	j.q = schedule.NewQueue(s.store, s.budget, s.share, &s.stats.queueSpilled)
	j.seen = map[uint32]bool{}
	if s.a.serial[t.Xid] {
		j.spooled = true
		return j, nil
	}
	select {
	case w := <-s.free:
		w.cur.Store(j)
		w.jobs <- j
	default:
		j.spooled = true
		s.stats.spooled.Add(1)
	}
	return j, nil
}

// takeWorker returns a free worker for a committed transaction (Parallel), waiting for one if a
// busy worker holds a committed transaction (it frees up without the leader); nil when every
// busy worker holds a streamed transaction still open, which only the leader can move on: the
// leader then applies the transaction itself.
func (s *session) takeWorker(ctx context.Context) (*worker, error) {
	select {
	case w := <-s.free:
		return w, nil
	default:
	}
	finishing := false
	for _, w := range s.workers {
		if j := w.cur.Load(); j != nil && j.Seq.Load() != 0 {
			finishing = true
		}
	}
	if !finishing {
		return nil, nil
	}
	select {
	case w := <-s.free:
		return w, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// applyDirect applies a part of a non-streamed transaction on the leader's connection, after
// every earlier transaction committed. A change the target refuses is remembered and reported
// at the commit, when the commit LSN is known.
func (s *session) applyDirect(ctx context.Context, j *job, t *reorderbuffer.Txn) error {
	if j.failed != nil {
		return nil
	}
	if err := s.order.Wait(ctx, j.Seq.Load()-1); err != nil {
		return err
	}
	s.leaderJob.Store(j)
	tg := s.leader
	var failed error // a change the target refused: no further change of t is applied
	err := s.eachChange(t, func(m decoding.Message, rels []*target.Relation) error {
		if !j.begun {
			tg.Stepwise(j.stepwise)
			tg.Begin(j.xid, j.known)
			j.begun = true
		}
		failed = tg.Change(ctx, m, rels)
		return failed
	})
	if failed != nil {
		return s.directFailed(ctx, j, failed)
	}
	return err
}

// directFailed handles an error of a direct job: a refused change is kept for the commit, any
// other error ends the session.
func (s *session) directFailed(ctx context.Context, j *job, err error) error {
	var ce *target.ChangeError
	if !errors.As(err, &ce) {
		return s.conflict(j, err)
	}
	j.failed = err
	j.begun = false
	return s.leader.Rollback(ctx)
}

// conflict turns an error that concurrency may have caused (a deadlock detected by the target, a
// serialization failure, a lock timeout) into a restart that applies the transactions involved
// alone: j and the streamed ones other connections hold open. Other errors pass.
func (s *session) conflict(j *job, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "40P01", "40001", "55P03":
	default:
		return err
	}
	xids := j.xids()
	for _, w := range s.workers {
		if o := w.cur.Load(); o != nil && o != j {
			xids = append(xids, o.xids()...)
		}
	}
	return &restartError{xids: xids, reason: err}
}

// enqueue copies a part's changes into the job's queue: they are valid only until the next
// Next. A streamed transaction's changes get a savepoint before each subtransaction's first
// change, and a wait for the transactions that committed before them.
func (s *session) enqueue(ctx context.Context, j *job, t *reorderbuffer.Txn) error {
	return s.eachRecord(t, func(c decoding.Change, rels []*target.Relation) error {
		m := c.Msg
		if !j.streamed {
			if err := s.depend(ctx, j, m, rels); err != nil {
				return err
			}
		} else {
			if sub := changeXid(m); sub != 0 && sub != t.Xid && !j.seen[sub] {
				j.seen[sub] = true
				j.subs = append(j.subs, sub)
				if err := j.q.Push(schedule.SavepointRecord(sub)); err != nil {
					return err
				}
			}
			// The change came after every transaction committed so far: it may read their rows.
			if last := s.order.Last(); last > j.waitFor && last > s.order.Committed() {
				j.waitFor = last
				if err := j.q.Push(schedule.WaitRecord(last)); err != nil {
					return err
				}
			}
		}
		rec, err := encodeChange(c, rels)
		if err != nil {
			return err
		}
		return j.q.Push(rec)
	})
}

// depend queues, before a change of a committed transaction a worker applies (Parallel), a
// wait for the earlier transactions in flight it depends on. A run notes the first of its
// members that waits for the run before it (see chain).
func (s *session) depend(ctx context.Context, j *job, m decoding.Message, rels []*target.Relation) error {
	if j.isRun && j.firstAt == 0 {
		j.firstAt = len(j.members)
	}
	err := s.dependOn(ctx, j, m, rels)
	if j.isRun && j.chainAt == 0 && j.afterRun {
		if prev := j.Seq.Load() - 1; j.Serial {
			j.chainAt = -1 // it waits to be applied alone: not counted (see chain)
		} else if j.waitFor >= prev || j.after[prev] {
			j.chainAt = len(j.members)
		}
	}
	return err
}

// keyFormsOf returns how the target table m compares the values of each source column, for the
// tracker: whether equal values may be sent differently (numeric 1.0 and 1.00). Kept per table;
// nil for none.
func (s *session) keyFormsOf(m *target.Table) []schedule.KeyForm {
	if m == nil {
		return nil
	}
	if f, ok := s.keyForms[m]; ok {
		return f
	}
	if s.keyForms == nil || len(s.keyForms) >= maxKeyForms {
		s.keyForms = map[*target.Table][]schedule.KeyForm{} // tables of older schemas go with the rest
	}
	var forms []schedule.KeyForm
	for i := 0; ; i++ {
		oid, nondet, ok := m.Equality(i)
		if !ok {
			break
		}
		forms = append(forms, schedule.KeyFormOf(oid, nondet))
	}
	s.keyForms[m] = forms
	return forms
}

// maxKeyForms bounds the tables keyFormsOf keeps.
const maxKeyForms = 4096

// dependOn is depend's wait.
func (s *session) dependOn(ctx context.Context, j *job, m decoding.Message, rels []*target.Relation) error {
	// Triggers (foreign keys included) that fire on the target make the order of otherwise
	// independent transactions visible: such tables are applied serially. A table the target
	// cannot take fails when applied, alone.
	rm, err := s.leader.Mapping(ctx, rels[0], target.OpNone)
	var ce *target.ChangeError
	if err != nil && !errors.As(err, &ce) {
		return err
	}
	var key []int // a FULL table's target key, which identifies its rows as well as a replica identity key
	if err == nil {
		if key, err = s.leader.FullKey(ctx, rm); err != nil {
			return err
		}
	}
	d, serial := s.deps.ChangeDeps(&j.Job, rels[0].Rel, key, s.keyFormsOf(rm), m, rm == nil || rm.Triggers)
	if serial {
		s.stats.serialTxns.Add(1)
	}
	if !s.cfg.relaxed() {
		// Commits in source order: waiting for the prefix up to the last dependency covers them all.
		if wait := d.Max(); wait > j.waitFor && wait > s.order.Committed() {
			j.waitFor = wait
			return j.q.Push(schedule.WaitRecord(wait))
		}
		return nil
	}
	// Relaxed: a dependency may commit before transactions it does not depend on; each one is
	// waited for on its own.
	if d.Prefix > j.waitFor && d.Prefix > s.order.Committed() {
		j.waitFor = d.Prefix
		if err := j.q.Push(schedule.WaitRecord(d.Prefix)); err != nil {
			return err
		}
	}
	for _, dep := range d.Seqs[:d.N] {
		if dep <= j.waitFor || j.after[dep] || s.order.Finished(dep) {
			continue
		}
		if j.after == nil {
			j.after = map[uint64]bool{}
		}
		j.after[dep] = true
		if err := j.q.Push(schedule.AfterRecord(dep)); err != nil {
			return err
		}
	}
	return nil
}

// changeXid returns the xid a change carries (the writing subtransaction's, in a stream).
func changeXid(m decoding.Message) uint32 {
	switch m := m.(type) {
	case *decoding.Insert:
		return m.Xid
	case *decoding.Update:
		return m.Xid
	case *decoding.Delete:
		return m.Xid
	case *decoding.Truncate:
		return m.Xid
	}
	return 0
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
func (s *session) decodeChange(p *decoding.Parser, rec []byte, rels []*target.Relation) (decoding.Message, []*target.Relation, error) {
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
		rels = append(rels, s.reg.Get(binary.BigEndian.Uint32(rec[4*i:])))
	}
	m, err := p.Parse(rec[4*n:], inStream)
	return m, rels, err
}

// subAbort undoes a subtransaction of a streamed job.
func (s *session) subAbort(t *reorderbuffer.Txn) error {
	j := s.jobs[t.Xid]
	if j == nil || j.direct {
		return nil
	}
	for i, sub := range j.subs {
		if sub == t.SubXid {
			j.subs = j.subs[:i] // the savepoints taken after it go too
			return j.q.Push(schedule.RollbackRecord(sub))
		}
	}
	return nil
}

// abort undoes a job that will not commit.
func (s *session) abort(ctx context.Context, t *reorderbuffer.Txn) error {
	j := s.jobs[t.Xid]
	if j == nil {
		return nil
	}
	delete(s.jobs, t.Xid)
	delete(s.a.serial, t.Xid)
	delete(s.a.stepwise, t.Xid)
	if s.deps != nil {
		s.deps.Release(&j.Job)
	}
	switch {
	case j.direct:
		defer s.leaderJob.Store(nil)
		if j.begun {
			if err := s.leader.Rollback(ctx); err != nil {
				return err
			}
		}
		// Its sequence number is the last one handed out: nothing to commit under it.
		seq := j.Seq.Load()
		if err := s.order.Wait(ctx, seq-1); err != nil {
			return err
		}
		s.order.Finish(seq)
		return nil
	case j.spooled:
		return j.q.Close()
	default:
		return j.q.Push([]byte{schedule.RecAbort})
	}
}

// commitJob handles the commit of a job: the leader commits a direct job at once, applies a
// spooled one now, and queues the commit of a worker's.
func (s *session) commitJob(ctx context.Context, j *job, t *reorderbuffer.Txn) error {
	delete(s.jobs, j.xid)
	delete(s.a.serial, j.xid)
	delete(s.a.stepwise, j.xid)
	j.ref = txnRef{Xid: t.Xid, Streamed: t.Streamed, CommitLSN: t.CommitLSN, EndLSN: t.EndLSN}
	j.commit = t
	if j.Seq.Load() == 0 {
		j.Seq.Store(s.order.Assign())
	}
	switch {
	case j.direct:
		defer s.leaderJob.Store(nil)
		if j.failed != nil {
			return s.txnError(j.ref, j.failed)
		}
		if err := s.order.Wait(ctx, j.Seq.Load()-1); err != nil {
			return err
		}
		if err := s.commitOn(ctx, s.leader, j, j.begun, nil); err != nil {
			var ce *target.ChangeError
			if errors.As(err, &ce) { // applied alone, after every earlier transaction
				return s.txnError(j.ref, err)
			}
			return s.conflict(j, err)
		}
		return s.ackCommitted(ctx)
	case j.spooled:
		j.known = sourceCommit(t) // applied from here on, on this goroutine
		if err := j.q.Push([]byte{schedule.RecCommit}); err != nil {
			return err
		}
		if err := s.order.Wait(ctx, j.Seq.Load()-1); err != nil {
			return err
		}
		s.leaderJob.Store(j)
		defer s.leaderJob.Store(nil)
		if err := s.runJob(ctx, s.leader, j, nil); err != nil {
			var ce *target.ChangeError
			if errors.As(err, &ce) { // applied alone, after every earlier transaction
				return s.txnError(j.ref, err)
			}
			return err
		}
		return s.ackCommitted(ctx)
	default:
		if j.streamed && s.deps != nil {
			s.deps.After(j.Seq.Load()) // its keys are not tracked
		}
		return j.q.Push([]byte{schedule.RecCommit})
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
