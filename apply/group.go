package apply

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Grouping (Buffered). One target transaction per source transaction costs a round trip to the
// target each: with a backlog of small transactions the applier waits on the network most of the
// time. So transactions that the stream has already delivered are applied together, in one
// target transaction that ends with the last one's progress row: up to groupMaxTxns of them
// and groupMaxChanges changes, for at most groupMaxAge, and never past a moment when the stream
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
const (
	groupMaxTxns    = 1024
	groupMaxChanges = 16384
	groupMaxAge     = 50 * time.Millisecond
)

// group is the open target transaction of Buffered and the source transactions applied in it.
type group struct {
	members []groupMember
	started bool      // a target transaction is open on the leader's connection
	opened  time.Time // when the first member was added
	changes int       // changes applied in the group
}

type groupMember struct {
	txn     *reorderbuffer.Txn
	ref     txnRef
	changed bool // it had changes to apply
}

func (g *group) open() bool { return len(g.members) > 0 }

// full says whether the group must commit before it takes another transaction, at time now.
func (g *group) full(now time.Time) bool {
	return len(g.members) >= groupMaxTxns || g.changes >= groupMaxChanges || now.Sub(g.opened) >= groupMaxAge
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
	g.members, g.started, g.changes = g.members[:0], false, 0
}

// applyGrouped applies t in the open group, or in a new one. A transaction marked to be applied
// alone (a retry after a failure in a group) commits the group first and is applied by itself.
func (s *session) applyGrouped(ctx context.Context, t *reorderbuffer.Txn) error {
	g := &s.group
	// A group commits with the commit time of its last transaction, which becomes the commit
	// timestamp of all its rows (with an origin): under last_update_wins a row must carry its
	// own transaction's time, or two sides replicating to each other can decide differently.
	alone := s.a.serial[t.Xid] || (s.det != nil && s.leader.Origin() != "" && lastUpdateWins(&s.cfg.Conflicts))
	if g.open() && (alone || g.full(s.cfg.now())) {
		if err := s.commitGroup(ctx); err != nil {
			return err
		}
	}
	if !g.open() {
		g.opened = s.cfg.now()
	}
	ref := txnRef{Xid: t.Xid, Streamed: t.Streamed, CommitLSN: t.CommitLSN, EndLSN: t.EndLSN}
	g.members = append(g.members, groupMember{txn: t, ref: ref})
	member := &g.members[len(g.members)-1]
	if s.alreadyApplied(t) { // committed ahead of the prefix before a restart: nothing to apply
		return nil
	}
	tg := s.leader
	// A group's changes are applied set-based (see target.Conn.Coalesce); a transaction applied
	// alone is not, so that it goes as it would without grouping.
	tg.Coalesce(!alone)
	tg.Stepwise(s.stepwise(t.Xid))
	// Conflicts name their own source transaction; the group commits with the last one's
	// commit time as its origin timestamp.
	tg.Source(t.Xid, sourceCommit(t))
	err := s.eachChange(t, func(m decoding.Message, rels []*target.Relation) error {
		if !g.started {
			tg.Begin(t.Xid, sourceCommit(t))
			g.started = true
		}
		g.changes++
		member.changed = true
		if err := tg.Change(ctx, m, rels); err != nil {
			return s.groupError(ref, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if alone {
		return s.commitGroup(ctx)
	}
	return nil
}

// commitGroup commits the open group with the progress row of its last transaction, and records
// its transactions as committed, in order. The commit is that of every transaction of the group:
// the hooks are called for each.
func (s *session) commitGroup(ctx context.Context) error {
	g := &s.group
	if !g.open() {
		return nil
	}
	last := g.members[len(g.members)-1].ref
	durable := s.cfg.SynchronousCommit
	var progress decoding.LSN // the progress row written, if any
	before := s.order.Committed()
	if g.started {
		for _, m := range g.members {
			if err := s.cfg.hook(ctx, "before-commit", m.ref); err != nil {
				return err
			}
		}
		durable = s.syncCommit()
		if !durable {
			for _, m := range g.members {
				if err := s.cfg.hook(ctx, "async-commit", m.ref); err != nil {
					return err
				}
			}
		}
		if err := s.leader.Commit(ctx, s.key, last.EndLSN, durable); err != nil {
			return s.groupError(last, err)
		}
		progress = last.EndLSN
	}
	for _, m := range g.members {
		seq := s.order.Assign()
		s.order.Finish(seq)
		s.stats.txns.Add(1)
		if !m.changed { // acknowledged without a target transaction of its own
			s.stats.emptyTxns.Add(1)
		}
		s.committed(commitRef{seq: seq, txn: m.txn, progress: progress, before: before}, durable)
	}
	if s.deps != nil { // Parallel, while its runs are chained
		if g.started {
			s.stats.runsOnLeader.Add(1)
		}
		s.chain.groupCommitted()
	}
	var err error
	for _, m := range g.members {
		if err = s.cfg.hook(ctx, "after-commit", m.ref); err != nil {
			break
		}
	}
	g.reset()
	return err
}

// abandonGroup forgets the open group when the session ends without committing it: its target
// transaction is rolled back with the connection, and its rows are not counted.
func (s *session) abandonGroup() {
	if s.group.started {
		s.leader.DropRows()
		s.group.reset()
	}
}

// groupError turns a failure to apply x, or to commit a group that ends with x, into the error
// the session ends with: a statement's failure names x when x is the group's only transaction
// with changes, and otherwise restarts the session with the group's transactions applied one at
// a time.
func (s *session) groupError(x txnRef, err error) error {
	g := &s.group
	var ce *target.ChangeError
	if !errors.As(err, &ce) || len(g.members) == 1 {
		return s.txnError(x, err)
	}
	return &restartError{xids: g.xids(), reason: fmt.Errorf("a statement failed in a group of %d transactions: %w", len(g.members), err)}
}
