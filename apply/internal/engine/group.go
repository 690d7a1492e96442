package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgreorder/pgreorder/apply/internal/plan"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Grouping (Buffered). One target transaction per source transaction costs a round trip to the
// target each: with a backlog of small transactions the applier waits on the network most of the
// time. So transactions that the stream has already delivered are applied together, in one
// target transaction that ends with the last one's progress row: up to plan.GroupMaxTxns of them
// and plan.GroupMaxChanges changes, for at most plan.GroupMaxAge, and never past a moment when the stream
// has nothing more to read (idleProbe). Groups therefore size themselves: while the Applier is
// behind, the stream always has the next transaction ready and groups grow to the limits (and the
// set statements of a group, see target.Conn.Coalesce, cover more rows per statement); once it has
// caught up, the stream runs dry after each transaction and a lone transaction commits within
// idleProbe of its arrival. The target sees them become visible at once, in the source's commit order; the
// progress row always names the last transaction of a committed group, so a crash or a failure
// resumes after a whole group, and nothing is applied twice.
//
// A statement that fails inside a group of several transactions cannot say which one it belongs
// to with certainty once earlier statements were sent in the same batch: the group is rolled
// back and the session restarts with its transactions marked to be applied one at a time, so
// that the error names its own transaction, as it does without grouping.
// group is the open target transaction of Buffered and the source transactions applied in it.
type group struct {
	plan.Group // counts its transactions and changes, and its age
	members    []groupMember
	started    bool // a target transaction is open on the leader's connection
}

type groupMember struct {
	txn     *reorderbuffer.Txn
	ref     Ref
	changed bool // it had changes to apply
}

func (g *group) xids() []uint32 {
	xs := make([]uint32, len(g.members))
	for i, m := range g.members {
		xs[i] = m.ref.Xid
	}
	return xs
}

func (g *group) reset() {
	clear(g.members)
	g.members, g.started = g.members[:0], false
	g.Group.Reset()
}

// applyGrouped applies t in the open group, or in a new one. A transaction marked to be applied
// alone (a retry after a failure in a group) commits the group first and is applied by itself.
func (e *Engine) applyGrouped(ctx context.Context, t *reorderbuffer.Txn) error {
	g := &e.group
	// A group commits with the commit time of its last transaction, which becomes the commit
	// timestamp of all its rows (with an origin): under last_update_wins a row must carry its
	// own transaction's time, or two sides replicating to each other can decide differently.
	alone := e.serial[t.Xid] || e.alone
	now := e.cfg.Now()
	if g.Open() && (alone || g.Full(now)) {
		if err := e.commitGroup(ctx); err != nil {
			return err
		}
	}
	g.Add(now)
	ref := Ref{Xid: t.Xid, Streamed: t.Streamed, CommitLSN: t.CommitLSN, EndLSN: t.EndLSN}
	g.members = append(g.members, groupMember{txn: t, ref: ref})
	member := &g.members[len(g.members)-1]
	if e.alreadyApplied(t) { // committed ahead of the prefix before a restart: nothing to apply
		return nil
	}
	tg := e.leader
	// A group's changes are applied set-based (see target.Conn.Coalesce); a transaction applied
	// alone is not, so that it goes as it would without grouping.
	tg.Coalesce(!alone)
	tg.Stepwise(e.stepwise(t.Xid))
	// Conflicts name their own source transaction; the group commits with the last one's
	// commit time as its origin timestamp.
	tg.Source(t.Xid, SourceCommit(t))
	err := e.eachChange(t, func(m decoding.Message, rels []*target.Relation) error {
		if !g.started {
			tg.Begin(t.Xid, SourceCommit(t))
			g.started = true
		}
		g.Changes++
		member.changed = true
		if err := tg.Change(ctx, m, rels); err != nil {
			return e.groupError(ref, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if alone {
		return e.commitGroup(ctx)
	}
	return nil
}

// commitGroup commits the open group with the progress row of its last transaction, and records
// its transactions as committed, in order. The commit is that of every transaction of the group:
// the hooks are called for each.
func (e *Engine) commitGroup(ctx context.Context) error {
	g := &e.group
	if !g.Open() {
		return nil
	}
	last := g.members[len(g.members)-1].ref
	durable := e.cfg.SynchronousCommit
	var progress decoding.LSN // the progress row written, if any
	before := e.order.Committed()
	if g.started {
		for _, m := range g.members {
			if err := e.host.Hook(ctx, "before-commit", m.ref); err != nil {
				return err
			}
		}
		durable = e.syncCommit()
		if !durable {
			for _, m := range g.members {
				if err := e.host.Hook(ctx, "async-commit", m.ref); err != nil {
					return err
				}
			}
		}
		if err := e.leader.Commit(ctx, e.key, last.EndLSN, durable); err != nil {
			return e.groupError(last, err)
		}
		progress = last.EndLSN
	}
	for _, m := range g.members {
		seq := e.order.Assign()
		e.order.Finish(seq)
		e.txns.Add(1)
		if !m.changed { // acknowledged without a target transaction of its own
			e.stats.EmptyTxns.Add(1)
		}
		e.committed(commitOf(seq, m.txn, nil, progress, before), durable)
	}
	if e.deps != nil { // Parallel, while its runs are chained
		if g.started {
			e.stats.RunsOnLeader.Add(1)
		}
		e.chain.GroupCommitted()
	}
	var err error
	for _, m := range g.members {
		if err = e.host.Hook(ctx, "after-commit", m.ref); err != nil {
			break
		}
	}
	g.reset()
	return err
}

// abandonGroup forgets the open group when the session ends without committing it: its target
// transaction is rolled back with the connection, and its rows are not counted.
func (e *Engine) abandonGroup() {
	if e.group.started {
		e.leader.DropRows()
		e.group.reset()
	}
}

// groupError turns a failure to apply x, or to commit a group that ends with x, into the error
// the session ends with: a statement's failure names x when x is the group's only transaction
// with changes, and otherwise restarts the session with the group's transactions applied one at
// a time.
func (e *Engine) groupError(x Ref, err error) error {
	g := &e.group
	var ce *target.ChangeError
	if !errors.As(err, &ce) || len(g.members) == 1 {
		return e.host.TxnError(x, err)
	}
	return e.host.Restart(g.xids(), fmt.Errorf("a statement failed in a group of %d transactions: %w", len(g.members), err))
}
