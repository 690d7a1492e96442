package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// runBuffered applies whole transactions, one at a time, on the leader's connection.
func (e *Engine) runBuffered(ctx context.Context) error {
	e.order = schedule.NewOrder()
	defer e.abandonGroup()
	for {
		if err := e.ackCommitted(ctx); err != nil {
			return err
		}
		if done, err := e.caughtUp(ctx); done || err != nil {
			return cmp.Or(err, ErrCaughtUp)
		}
		if e.switchDue() {
			return ErrSwitchMode
		}
		e.askPosition()
		t, err := e.next(ctx)
		if err != nil {
			if errors.Is(err, errIdle) && e.group.Open() { // nothing more to read: commit
				err = e.commitGroup(ctx)
			} else {
				err = e.wakeUp(ctx, err)
			}
			if err != nil {
				return err
			}
			continue
		}
		// A transaction committed ahead of the prefix before a restart is not the one SkipLSN
		// names: it goes into the group, empty (applyGrouped).
		if !e.alreadyApplied(t) {
			if skipped, err := e.maybeSkip(ctx, t); skipped || err != nil {
				if err != nil {
					return err
				}
				continue
			}
		}
		if t.NonTransactional {
			if err := e.stream.Ack(t); err != nil {
				return err
			}
			continue
		}
		if t.Part == reorderbuffer.Advance {
			if err := e.commitGroup(ctx); err != nil {
				return err
			}
			if err := e.advanced(ctx, t); err != nil {
				return err
			}
			continue
		}
		if err := e.applyGrouped(ctx, t); err != nil {
			return err
		}
	}
}

// switchDue reports whether a durable progress row reached Config.SwitchAt.
func (e *Engine) switchDue() bool {
	if e.cfg.SwitchAt == 0 {
		return false
	}
	e.acks.mu.Lock()
	defer e.acks.mu.Unlock()
	return e.acks.Persisted >= e.cfg.SwitchAt
}

// advanced records an idle advance (reorderbuffer.Advance) like a transaction with nothing to
// apply: it is acknowledged once a flushing transaction wrote the progress row at its position
// (see flushNow), so that the slot never confirms a position the progress row does not hold.
// The stream hands one out only when every transaction before it was acknowledged (none is
// being received either), so every earlier commit is done and the wait returns at once.
func (e *Engine) advanced(ctx context.Context, t *reorderbuffer.Txn) error {
	seq := e.order.Assign()
	if err := e.order.Wait(ctx, seq-1); err != nil {
		return err
	}
	e.order.Finish(seq)
	e.committed(commitOf(seq, t, nil, 0, 0), false)
	return nil
}

// eachChange calls f with each of t's changes that changes the target, and the relations it
// names, in order; it stops at the first error, t's or f's. The message is valid only during f.
func (e *Engine) eachChange(t *reorderbuffer.Txn, f func(m decoding.Message, rels []*target.Relation) error) error {
	return e.eachRecord(t, false, func(h reorderbuffer.Head, rels []*target.Relation) error { return f(h.Msg, rels) })
}

// eachRecord is eachChange with the whole message (its Raw record too), valid until f returns.
// With heads, an Insert, Update or Delete is read only as far as its relation
// (reorderbuffer.Txn.Heads), and comes with no Msg: for a caller that hands the record on.
func (e *Engine) eachRecord(t *reorderbuffer.Txn, heads bool, f func(h reorderbuffer.Head, rels []*target.Relation) error) error {
	step := func(h reorderbuffer.Head) error {
		rels, err := e.relations(t.Xid, h)
		if err != nil || rels == nil {
			return err
		}
		return f(h, rels)
	}
	if heads {
		for h, err := range t.Heads() {
			if err == nil {
				err = step(h)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	for c, err := range t.Changes() {
		if err == nil {
			err = step(headOf(c))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// headOf is c as reorderbuffer.Txn.Heads describes a message, its Msg parsed.
func headOf(c decoding.Change) reorderbuffer.Head {
	h := reorderbuffer.Head{Change: c, Type: c.Msg.Type()}
	if r, ok := c.Msg.(decoding.RowChange); ok {
		h.RelationID = r.RelationOID()
	}
	return h
}

// relations resolves the relations a message of transaction xid names, as described at its
// position: nil for a message that changes nothing on the target (Relation, Type, logical
// messages).
func (e *Engine) relations(xid uint32, h reorderbuffer.Head) ([]*target.Relation, error) {
	switch h.Type {
	case decoding.MsgInsert, decoding.MsgUpdate, decoding.MsgDelete:
		if h.Relation == nil {
			return nil, fmt.Errorf("apply: transaction %d changes relation %d, which the stream never described", xid, h.RelationID)
		}
		e.relBuf[0] = e.reg.Intern(h.Relation, h.Schema)
		e.host.NoteRelation(e.relBuf[0])
		return e.relBuf[:], nil
	case decoding.MsgTruncate:
		m := h.Msg.(*decoding.Truncate)
		rels := make([]*target.Relation, len(m.RelationIDs))
		for i, id := range m.RelationIDs {
			r, ok := h.Schema.Relation(id)
			if !ok {
				return nil, fmt.Errorf("apply: transaction %d truncates relation %d, which the stream never described", xid, id)
			}
			rels[i] = e.reg.Intern(r, h.Schema)
			e.host.NoteRelation(rels[i])
		}
		return rels, nil
	}
	return nil, nil
}

// stepwise reports whether x is applied one statement at a time (Config.Stepwise, or Session.Stepwise).
func (e *Engine) stepwise(x uint32) bool { return e.cfg.Stepwise || e.stepwiseXids[x] }

// caughtUp says whether the session may end for Config.UntilCaughtUp: a durable progress row is
// at or past the position to catch up to, every commit was acknowledged, and a status update
// told the source so. A session that starts caught up (its progress row past what the slot
// confirmed) has acknowledged nothing, and its stream reports that flush position only once it
// has heard from the server: caughtUp then asks the server for its position, in a status update,
// and next waits no longer than idleProbe until the update that reports it is sent.
func (e *Engine) caughtUp(ctx context.Context) (bool, error) {
	until := decoding.LSN(e.until.Load())
	if !e.cfg.UntilCaughtUp || until == 0 {
		return false, nil
	}
	a := &e.acks
	a.mu.Lock()
	persisted := a.Persisted
	done := a.Pending() == 0 && persisted >= until
	a.mu.Unlock()
	if !done {
		return false, nil
	}
	if e.stream.Progress().Flushed < until {
		e.confirming = true
		return false, e.stream.SendStatus(ctx, true)
	}
	e.confirming = false
	if e.reached.Load() == 0 {
		e.reached.Store(uint64(until))
		e.log.Info("caught up", "lsn", until, "applied_lsn", persisted)
	}
	return true, nil
}

// askPosition, for Config.UntilCaughtUp, asks the stream to hand out the source's position as an
// idle advance as soon as the source says it, when nothing is left to acknowledge: WAL the source
// wrote past the last transaction (a checkpoint is enough) is then caught up to within a round
// trip, not at the next status interval.
func (e *Engine) askPosition() {
	if !e.cfg.UntilCaughtUp || e.until.Load() == 0 || e.reached.Load() != 0 {
		return
	}
	a := &e.acks
	a.mu.Lock()
	idle := a.Pending() == 0
	a.mu.Unlock()
	if idle {
		e.stream.AdvanceSoon()
	}
}

// alreadyApplied says whether t is a transaction committed on the target ahead of the prefix
// before the session started (relaxed commit order): it must not be applied again.
func (e *Engine) alreadyApplied(t *reorderbuffer.Txn) bool {
	return e.applied.Len() > 0 && !t.NonTransactional && (t.Part == reorderbuffer.Whole || t.Part == reorderbuffer.PartCommit) &&
		e.applied.Contains(t.EndLSN)
}

// skipApplied handles the commit of a transaction alreadyApplied (Eager and Parallel): what was
// applied of it in this session is undone, and it is recorded as committed, with nothing to
// commit, acknowledged once a progress row passes it.
func (e *Engine) skipApplied(ctx context.Context, t *reorderbuffer.Txn) error {
	if e.jobs[t.Xid] != nil {
		if err := e.abort(ctx, t); err != nil {
			return err
		}
	}
	e.log.Debug("transaction committed before the restart: not applied again", "xid", t.Xid, "end_lsn", t.EndLSN)
	seq := e.order.Assign()
	e.order.Finish(seq)
	e.txns.Add(1)
	e.stats.EmptyTxns.Add(1)
	e.committed(commitOf(seq, t, nil, 0, 0), false)
	return nil
}

// maybeSkip handles the first transaction of a session with a skip pending: it skips t when its
// commit LSN is Config.SkipLSN (every earlier transaction committed: the group is committed
// first), and refuses any other. It says whether t was skipped.
func (e *Engine) maybeSkip(ctx context.Context, t *reorderbuffer.Txn) (bool, error) {
	lsn := e.cfg.SkipLSN
	if !e.skip || t.NonTransactional {
		return false, nil
	}
	if t.Part == reorderbuffer.Advance {
		// Handed out only when no transaction is in flight: none commits at lsn.
		if t.EndLSN > lsn {
			return false, e.host.SkipRefused(t)
		}
		return false, nil
	}
	e.skip = false
	if t.CommitLSN != lsn {
		return false, e.host.SkipRefused(t)
	}
	if err := e.commitGroup(ctx); err != nil {
		return false, err
	}
	// What is skipped, for the log: the relations and the changes by kind.
	var ins, upd, del, trunc int
	var rels []string
	for c, err := range t.Changes() {
		if err != nil {
			return false, err
		}
		switch c.Msg.(type) {
		case *decoding.Insert:
			ins++
		case *decoding.Update:
			upd++
		case *decoding.Delete:
			del++
		case *decoding.Truncate:
			trunc++
		}
		rs, err := e.relations(t.Xid, headOf(c))
		if err != nil {
			return false, err
		}
		for _, r := range rs {
			if n := r.Rel.Namespace + "." + r.Rel.Name; !slices.Contains(rels, n) {
				rels = append(rels, n)
			}
		}
	}
	before := e.order.Committed()
	args := append(e.key.Args(t.EndLSN), lsn.AppendText(nil), strconv.AppendUint(nil, uint64(t.Xid), 10))
	if err := e.leader.FlushWAL(ctx, e.cfg.SkipSQL, args); err != nil {
		return false, fmt.Errorf("apply: recording the skip of transaction %d in the progress row: %w", t.Xid, err)
	}
	e.log.Warn("skipped a source transaction, as SkipLSN asked: its changes are not on the target", "xid", t.Xid,
		"commit_lsn", t.CommitLSN, "end_lsn", t.EndLSN, "relations", rels, "inserts", ins, "updates", upd, "deletes", del,
		"truncates", trunc)
	seq := e.order.Assign()
	e.order.Finish(seq)
	e.stats.Skipped.Add(1)
	e.tstats.Applied(t.EndLSN)
	e.committed(commitOf(seq, t, nil, t.EndLSN, before), true)
	return true, e.host.Hook(ctx, "after-commit", refOf(t))
}
