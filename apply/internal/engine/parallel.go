package engine

import (
	"context"
	"errors"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Parallel's side of the leader: the runs of whole committed transactions (and Eager's, which
// stay on the leader), the chains of runs that hand the runs back to the leader, and the waits
// the dependency tracker puts before a change a worker applies.

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
func (e *Engine) groupable(t *reorderbuffer.Txn) bool {
	return e.mode.groupable(t)
}

// runGrouped applies t in the open run, opening one, after every earlier transaction
// committed, if there is none.
func (e *Engine) runGrouped(ctx context.Context, t *reorderbuffer.Txn) error {
	// Parallel's groups take no more transactions than its runs (Config.RunTxns, tests only).
	if e.cfg.Mode == Parallel && e.group.Open() && e.cfg.RunTxns > 0 && len(e.group.members) >= e.cfg.RunTxns {
		if err := e.commitGroup(ctx); err != nil {
			return err
		}
	}
	if !e.group.Open() {
		if err := e.order.Wait(ctx, e.order.Last()); err != nil {
			return err
		}
	}
	return e.applyGrouped(ctx, t)
}

// endGroup commits the open run, if any; the leader's connection then applies one statement
// per change again.
func (e *Engine) endGroup(ctx context.Context) error {
	if !e.group.Open() {
		return nil
	}
	err := e.commitGroup(ctx)
	e.leader.Coalesce(false)
	return err
}

// Runs (Parallel). The whole committed transactions the stream delivers one after another (one
// PartCommit each, not streamed) form runs: a worker applies a run as Buffered applies a group
// (target.Conn.Coalesce: each table's net changes as set statements), in one target transaction
// that ends with the progress row of its last transaction, committed in its turn. A run is one job
// of the commit order and of the dependency tracker: its changes wait, as a transaction's would,
// for the earlier runs in flight that touched the same rows, so runs that touch different rows are
// applied at once, and a run that depends on the one before waits for its commit while the leader
// fills the next. A run takes transactions up to the limits of a group (plan.GroupMaxTxns,
// plan.GroupMaxChanges, plan.GroupMaxAge), and ends when the stream has nothing more to read and nothing
// earlier it would wait for is in flight (runStartable), or when it hands out anything else (a part
// of a streamed or large transaction, an abort, an idle advance, a transaction to apply alone): the
// run's commit then comes before it in commit order. Handing a run over costs the leader nothing
// per transaction; its worker sends the run's changes, reduced to set statements, with its commit
// (or, sooner, while it waits for its turn to commit), as Buffered sends a group's.

// Chained runs (Parallel). When each run waits, before it applies anything, for the commit of the
// run just before it (rows every transaction updates, as in pgbench), the workers apply the runs
// one after another and handing them over (queueing each transaction, waking the worker, which
// parses it again) is all that parallel apply adds. The leader therefore watches the runs it seals: a run is
// chained when the run before it in commit order was one too, still in flight, and the run's first
// transaction with changes already queued a wait for it (what the dependency tracker said as the
// leader queued the changes: a wait is queued only for a run not yet committed). A run that meets a
// hot row only here and there is not: its worker goes through what comes before the wait while the
// run before it commits. Nor is a run that waits because it became serial (a change without a
// usable key, TRUNCATE, triggers) before any such wait: its changes go one statement each, work on
// the target that gains from the leader reading on meanwhile. After plan.ChainRuns chained runs in a row
// the leader applies whole transactions itself, as Eager does (groupable): as Buffered groups,
// set-based, on its own connection, each group in one target transaction with the progress row of
// its last, after every earlier transaction committed and before anything later is handed out, so
// in source order whatever the commit order. Streamed transactions still go to workers meanwhile,
// and a transaction that cannot join a run does not join a group either. After plan.ChainProbe groups it
// hands runs to the workers again, a probe: the first one follows a group, which it cannot wait
// for, and shows nothing; the next one says whether the runs are still chained. A probe's runs take
// at most plan.ChainProbeTxns transactions each, so that a probe costs the leader, which waits for their
// commits before it takes over again, two small commits rather than two full runs. A run found
// chained by its first transaction takes no more either: the plan.ChainRuns chained runs that hand the
// runs to the leader are small too. A probe that finds the runs still chained doubles the number of
// groups before the next one, up to plan.ChainProbeMax: runs chained for long cost fewer and fewer
// probes. A run that is not chained hands the following ones (of full size) to workers until
// plan.ChainRuns chained runs come in a row again, and the next time the leader takes over it probes
// after plan.ChainProbe groups again.
// The decisions are plan.Chain's and plan.Run's, with their limits (plan.ChainRuns...).

// runnable says whether t joins the open run (or opens one).
func (e *Engine) runnable(t *reorderbuffer.Txn) bool {
	return e.mode.runnable(t)
}

// addToRun queues t in the open run, after sealing it if it is full, or in a new one.
func (e *Engine) addToRun(ctx context.Context, t *reorderbuffer.Txn) error {
	now := e.cfg.Now()
	if j := e.run; j != nil && (e.runFull() || j.pr.Expired(now)) {
		if err := e.sealRun(); err != nil {
			return err
		}
		if e.groupable(t) { // the runs are chained: the leader takes over
			return e.runGrouped(ctx, t)
		}
	}
	if e.run == nil {
		w, err := e.takeWorker(ctx)
		if err != nil {
			return err
		}
		if w == nil { // every worker holds a streamed transaction still open: the leader applies t
			return e.part(ctx, t)
		}
		j := &job{xid: t.Xid, isRun: true, stepwise: e.stepwise(t.Xid)}
		j.pr.Opened = now
		j.Seq.Store(e.order.Assign())
		e.chain.Opened(&j.pr, j.Seq.Load())
		j.q = schedule.NewQueue(e.store, e.budget, e.share, &e.stats.QueueSpilled)
		w.cur.Store(j)
		w.jobs <- j
		e.run = j
	}
	j := e.run
	j.mu.Lock()
	j.members = append(j.members, groupMember{txn: t, ref: Ref{Xid: t.Xid, CommitLSN: t.CommitLSN, EndLSN: t.EndLSN}})
	i := len(j.members) - 1
	j.mu.Unlock()
	j.pr.Txns++
	j.unwoken++
	if e.alreadyApplied(t) { // committed before the restart: an empty member
		return j.q.Append(schedule.TxnRecord(uint32(i)))
	}
	// A kept transaction's waits go before it, and its RecPart says which member it is; a copied
	// one's changes go after its RecTxn.
	kp := e.keep(j, t)
	if kp == nil {
		if err := j.q.Append(schedule.TxnRecord(uint32(i))); err != nil {
			return err
		}
	}
	changed := false
	err := e.eachRecord(t, false, func(h reorderbuffer.Head, rels []*target.Relation) error {
		if err := e.depend(ctx, j, h.Msg, rels); err != nil {
			return err
		}
		changed = true
		j.pr.Changes++
		j.unwoken++
		if kp != nil {
			kp.note(rels)
			return nil
		}
		rec, err := encodeChange(h.Change, rels)
		if err != nil {
			return err
		}
		return j.q.Append(rec)
	})
	switch {
	case kp == nil:
	case err != nil || !changed:
		j.letGo(kp)
		if err == nil {
			err = j.q.Append(schedule.TxnRecord(uint32(i)))
		}
	default:
		kp.member = int32(i)
		err = e.addPart(j, kp)
	}
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
// commit wakes the leader (Engine.committed), which then seals the run once nothing more
// is ready; every earlier transaction has all its records queued, so none of them waits for
// the leader.
func (e *Engine) runStartable() bool {
	j := e.run
	if j == nil || e.runFull() {
		return true
	}
	return j.waits.Startable(j.Seq.Load(), false, e.cfg.Relaxed, e.order.Committed(), e.order.Finished)
}

// runFull says whether the open run took as many transactions or changes as a run may.
func (e *Engine) runFull() bool {
	return e.run.pr.Full(e.cfg.RunTxns) // small while it only tells whether the runs are chained
}

// sealRun queues the commit of the open run, if any.
func (e *Engine) sealRun() error {
	j := e.run
	if j == nil {
		return nil
	}
	e.run = nil
	if e.chain.Sealed(&j.pr) {
		e.stats.Handbacks.Add(1)
	}
	j.mu.Lock()
	last := j.members[len(j.members)-1]
	j.mu.Unlock()
	j.ref, j.commit = last.ref, last.txn
	return j.q.Push([]byte{schedule.RecCommit})
}

// depend queues, before a change of a committed transaction a worker applies (Parallel), a
// wait for the earlier transactions in flight it depends on. A run notes the first of its
// members that waits for the run before it (see chain).
func (e *Engine) depend(ctx context.Context, j *job, m decoding.Message, rels []*target.Relation) error {
	if j.isRun {
		j.pr.Change()
	}
	err := e.dependOn(ctx, j, m, rels)
	if j.isRun { // one waiting to be applied alone is not counted as chained
		j.pr.Waited(j.Serial, j.waits.OnPrev(j.Seq.Load()))
	}
	return err
}

// keyFormsOf returns how the target table m compares the values of each source column, for the
// tracker: whether equal values may be sent differently (numeric 1.0 and 1.00). Kept per table;
// nil for none.
func (e *Engine) keyFormsOf(m *target.Table) []schedule.KeyForm {
	if m == nil {
		return nil
	}
	if f, ok := e.keyForms[m]; ok {
		return f
	}
	if e.keyForms == nil || len(e.keyForms) >= maxKeyForms {
		e.keyForms = map[*target.Table][]schedule.KeyForm{} // tables of older schemas go with the rest
	}
	var forms []schedule.KeyForm
	for i := 0; ; i++ {
		oid, nondet, ok := m.Equality(i)
		if !ok {
			break
		}
		forms = append(forms, schedule.KeyFormOf(oid, nondet))
	}
	e.keyForms[m] = forms
	return forms
}

// maxKeyForms bounds the tables keyFormsOf keeps.
const maxKeyForms = 4096

// dependOn is depend's wait.
func (e *Engine) dependOn(ctx context.Context, j *job, m decoding.Message, rels []*target.Relation) error {
	// Triggers (foreign keys included) that fire on the target make the order of otherwise
	// independent transactions visible: such tables are applied serially. A table the target
	// cannot take fails when applied, alone.
	rm, err := e.leader.Mapping(ctx, rels[0], target.OpNone)
	var ce *target.ChangeError
	if err != nil && !errors.As(err, &ce) {
		return err
	}
	var key []int // a FULL table's target key, which identifies its rows as well as a replica identity key
	if err == nil {
		if key, err = e.leader.FullKey(ctx, rm); err != nil {
			return err
		}
	}
	d, serial := e.deps.ChangeDeps(&j.Job, rels[0].Rel, key, e.keyFormsOf(rm), m, rm == nil || rm.Triggers)
	if serial {
		e.stats.SerialTxns.Add(1)
	}
	if !e.cfg.Relaxed {
		// Commits in source order: waiting for the prefix up to the last dependency covers them all.
		if wait := d.Max(); j.waits.Prefix(wait, e.order.Committed()) {
			return j.q.Push(schedule.WaitRecord(wait))
		}
		return nil
	}
	// Relaxed: a dependency may commit before transactions it does not depend on; each one is
	// waited for on its own.
	if j.waits.Prefix(d.Prefix, e.order.Committed()) {
		if err := j.q.Push(schedule.WaitRecord(d.Prefix)); err != nil {
			return err
		}
	}
	for _, dep := range d.Seqs[:d.N] {
		if !j.waits.On(dep, e.order.Finished(dep)) {
			continue
		}
		if err := j.q.Push(schedule.AfterRecord(dep)); err != nil {
			return err
		}
	}
	return nil
}

// mode is what tells Eager from Parallel on the leader: where a transaction that arrives
// goes. (Buffered has a loop of its own: runBuffered.)
type mode interface {
	// groupable says whether t joins the leader's open group (or opens one).
	groupable(t *reorderbuffer.Txn) bool
	// runnable says whether t joins the open run of a worker (or opens one).
	runnable(t *reorderbuffer.Txn) bool
	// onWorker says whether a whole committed transaction, neither grouped nor in a run, is
	// applied by a worker rather than on the leader's connection.
	onWorker(t *reorderbuffer.Txn) bool
}

// eager: whole transactions on the leader's connection (grouped while nothing else is in
// flight), streamed ones on workers.
type eager struct{ e *Engine }

func (m eager) groupable(t *reorderbuffer.Txn) bool {
	return !t.NonTransactional && t.Part == reorderbuffer.PartCommit && !t.Streamed && len(m.e.jobs) == 0 && !m.e.serial[t.Xid]
}

func (eager) runnable(*reorderbuffer.Txn) bool { return false }

func (eager) onWorker(*reorderbuffer.Txn) bool { return false }

// parallel: whole transactions in runs on workers, or grouped on the leader's connection while
// the runs are chained.
type parallel struct{ e *Engine }

func (m parallel) groupable(t *reorderbuffer.Txn) bool {
	e := m.e
	return !e.cfg.WorkersOnly && e.chain.Leads() && e.run == nil && len(e.jobs) == 0 && m.runnable(t)
}

func (m parallel) runnable(t *reorderbuffer.Txn) bool {
	e := m.e
	return !t.NonTransactional && t.Part == reorderbuffer.PartCommit && !t.Streamed && e.jobs[t.Xid] == nil && !e.serial[t.Xid] && !e.alone
}

func (m parallel) onWorker(t *reorderbuffer.Txn) bool { return !m.e.serial[t.Xid] }
