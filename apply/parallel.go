package apply

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
