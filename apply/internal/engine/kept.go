package engine

import (
	"context"
	"fmt"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Parts read in place. A part (or a run's transaction) whose bytes in the reorder buffer's
// memory fit the job queue's share (schedule.Queue.Hold) is not copied into the queue: the
// leader keeps it (reorderbuffer.Txn.Keep), reads it once to resolve its relations and queue the
// waits its changes need (a streamed transaction's part only as far as each change's relation,
// reorderbuffer.Txn.Heads: the worker's is then the one parse), and queues one schedule.RecPart
// naming it; the worker reads its changes
// where the buffer holds them and lets it go (Txn.Release), and the buffer frees it at its next
// call. A part read back from a spill log is kept too, its log read in place by the worker, while
// the job keeps fewer than maxSpilledKept of them (each holds a file and a read buffer). Any other
// part is copied record by record (encodeChange): the queue spills what does not fit, and the
// memory bound holds either way, the kept bytes counting in the reorder buffer's share of the one
// limit.

// keptPart is a part a worker reads where the reorder buffer holds it, with the relations the
// leader resolved for its changes, in order.
type keptPart struct {
	txn   *reorderbuffer.Txn
	bytes int64 // held in the job's queue (Queue.Hold)
	rels  []relRun
	inl   [2]relRun // rels' first backing array: most parts change few relations in turn
	done  bool      // under the job's mu: let go of
	// spilled: read back from a spill log (reorderbuffer.Txn.Spilled), counted in the job's
	// spilledKept.
	spilled bool
	// member is the run's transaction the part is (its index in job.members), -1 for a part of
	// a job of one transaction: a run's kept transaction needs no schedule.RecTxn of its own.
	member int32

	pos  int    // the worker's: the run of rels to take from next
	used uint32 // the worker's: how many of that run's relations it took
}

// relRun is n consecutive relations of the part's changes that the leader resolved to rel (the
// relations of a Truncate count one each). The worker takes them in the same order: the part's
// changes come out of the buffer in the same order for both, though the descriptions they
// resolve against are read again (and are other pointers).
type relRun struct {
	rel *target.Relation
	n   uint32
}

// keep keeps t for j's worker, if what the buffer holds of it in memory fits j's queue and, read
// back from a spill log, j holds fewer than maxSpilledKept such parts: nil otherwise (t is then
// copied into the queue). The leader reads a kept part with a parser of its own: the buffer's is
// lent to the transaction it hands out next.
func (e *Engine) keep(j *job, t *reorderbuffer.Txn) *keptPart {
	n, spilled := t.MemoryBytes(), t.Spilled()
	if n == 0 && !spilled {
		return nil
	}
	if spilled {
		j.mu.Lock()
		ok := j.spilledKept < maxSpilledKept
		if ok {
			j.spilledKept++
		}
		j.mu.Unlock()
		if !ok {
			return nil
		}
	}
	held := j.q.Hold(n)
	if !held || !t.Keep() {
		if held {
			j.q.Unhold(n)
		}
		if spilled {
			j.mu.Lock()
			j.spilledKept--
			j.mu.Unlock()
		}
		return nil
	}
	t.UseParser(&e.keptParser)
	kp := &keptPart{txn: t, bytes: n, member: -1, spilled: spilled}
	kp.rels = kp.inl[:0]
	return kp
}

// maxSpilledKept is how many parts read back from a spill log a job keeps at once: each holds a
// file and a read buffer (256 KiB) outside the memory limit until its worker has read it.
const maxSpilledKept = 2

// note records the relations the leader resolved for the next change of kp.
func (kp *keptPart) note(rels []*target.Relation) {
	for _, r := range rels {
		if k := len(kp.rels) - 1; k >= 0 && kp.rels[k].rel == r {
			kp.rels[k].n++
			continue
		}
		kp.rels = append(kp.rels, relRun{r, 1})
	}
}

// resolve returns the relations change c of kp names, as the leader resolved them (see
// Engine.relations), in buf: nil for a message that changes nothing on the target. A change
// that does not match what the leader resolved is an error, never a change skipped or applied to
// another table.
func (kp *keptPart) resolve(c decoding.Change, buf []*target.Relation) ([]*target.Relation, error) {
	buf = buf[:0]
	switch m := c.Msg.(type) {
	case *decoding.Insert, *decoding.Update, *decoding.Delete:
		return kp.take(buf, m.(decoding.RowChange).RelationOID())
	case *decoding.Truncate:
		for _, id := range m.RelationIDs {
			var err error
			if buf, err = kp.take(buf, id); err != nil {
				return nil, err
			}
		}
		return buf, nil
	}
	return nil, nil
}

// take appends the next relation the leader resolved, which must be relation id.
func (kp *keptPart) take(buf []*target.Relation, id uint32) ([]*target.Relation, error) {
	if kp.pos >= len(kp.rels) {
		return nil, fmt.Errorf("apply: transaction %d: a change of relation %d past those the leader resolved", kp.txn.Xid, id)
	}
	r := kp.rels[kp.pos]
	if r.rel.Rel.RelationID != id {
		return nil, fmt.Errorf("apply: transaction %d: a change of relation %d where the leader resolved relation %d",
			kp.txn.Xid, id, r.rel.Rel.RelationID)
	}
	if kp.used++; kp.used == r.n {
		kp.pos, kp.used = kp.pos+1, 0
	}
	return append(buf, r.rel), nil
}

// addPart queues kp for j's worker, after the waits its changes queued.
func (e *Engine) addPart(j *job, kp *keptPart) error {
	e.stats.KeptParts.Add(1)
	j.mu.Lock()
	j.parts = append(j.parts, kp)
	i := len(j.parts) - 1
	j.mu.Unlock()
	return j.q.Append(schedule.PartRecord(uint32(i)))
}

// part returns j's i-th kept part.
func (j *job) part(i uint32) (*keptPart, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if int(i) >= len(j.parts) {
		return nil, false
	}
	return j.parts[i], true
}

// letGo lets go of kp: the reorder buffer frees it, j's queue no longer counts it.
func (j *job) letGo(kp *keptPart) {
	j.mu.Lock()
	done := kp.done
	kp.done = true
	if !done && kp.spilled {
		j.spilledKept--
	}
	j.mu.Unlock()
	if !done {
		kp.txn.Release()
		j.q.Unhold(kp.bytes)
	}
}

// letGoParts lets go of every part of j still kept: those its worker skipped (after a change the
// target refused, at an abort) or never reached (the session ended). Called once no goroutine
// reads them.
func (j *job) letGoParts() {
	j.mu.Lock()
	parts := j.parts
	j.mu.Unlock()
	for _, kp := range parts {
		j.letGo(kp)
	}
}

// applyPart applies the changes of j's i-th kept part on r's connection, and lets it go.
func (r *jobRun) applyPart(ctx context.Context, i uint32) error {
	kp, ok := r.j.part(i)
	if !ok {
		return schedule.Fatal(fmt.Errorf("apply: job of transaction %d: no part %d", r.j.xid, i))
	}
	defer r.j.letGo(kp)
	if kp.member >= 0 {
		if err := r.Txn(ctx, uint32(kp.member)); err != nil {
			return err
		}
	}
	kp.pos, kp.used = 0, 0
	kp.txn.UseParser(&r.p)
	for c, err := range kp.txn.Changes() {
		if err != nil {
			return schedule.Fatal(err)
		}
		rels, err := kp.resolve(c, r.rels)
		if err != nil {
			return schedule.Fatal(err)
		}
		if rels == nil {
			continue
		}
		r.rels = rels
		if err := r.change(ctx, c.Msg, rels); err != nil {
			return err
		}
	}
	return nil
}
