package engine

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/schedule"
)

// watchInterval is how often the watchdog looks for lock waits between the session's own
// connections.
const watchInterval = 200 * time.Millisecond

// watchdog breaks the waits the target's deadlock detector cannot see. Transactions commit in
// order, so a transaction that waits for a lock held by a later one, which itself waits (for its
// turn to commit, for an earlier commit, or for more changes from the leader) never gets it: the
// later one cannot commit first. The target sees one backend waiting for a lock and another idle
// in its transaction, not a cycle. Every watchInterval the watchdog asks the target which of the
// session's backends wait for locks and who holds them; a wait on a later transaction whose
// worker waits too, seen twice in a row, ends the session with Host.Restart naming the later
// transaction, which the next session applies alone, after the one it blocked. Waits on
// earlier transactions resolve by themselves; waits on backends of other sessions are left
// alone, as PostgreSQL's subscriber leaves them.
func (e *Engine) watchdog(ctx context.Context) error {
	if len(e.workers) == 0 {
		return nil
	}
	conn, err := e.host.Connect(ctx, "watchdog")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	var watch schedule.LockWatch
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		jobs := map[uint32]*job{}
		holders := map[uint32]schedule.Holder{}
		if j := e.leaderJob.Load(); j != nil {
			jobs[e.leader.PID()], holders[e.leader.PID()] = j, schedule.Holder{Rank: j.Rank()}
		}
		for _, w := range e.workers {
			if j := w.cur.Load(); j != nil {
				jobs[w.tg.PID()] = j
				holders[w.tg.PID()] = schedule.Holder{Rank: j.Rank(), Worker: true, Waiting: w.state.Load() == wsWaiting}
			}
		}
		if len(holders) < 2 {
			watch.Reset()
			continue
		}
		waits, err := conn.LockWaits(ctx, slices.Collect(maps.Keys(holders)))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("apply: watchdog: %w", err)
		}
		if p, q, found := watch.Observe(holders, waits); found {
			waiter, blocker := jobs[p], jobs[q]
			e.stats.Deadlocks.Add(1)
			e.log.Warn("lock wait on a later transaction: rolling it back to apply it alone",
				"waiting_xid", waiter.xid, "holding_xid", blocker.xid)
			return e.host.Restart(blocker.xids(),
				fmt.Errorf("transaction %d waited for a lock held by transaction %d, which commits after it", waiter.xid, blocker.xid))
		}
	}
}
