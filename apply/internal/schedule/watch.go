package schedule

// Rank is j's place in the commit order: its sequence number, or, while its commit has not
// arrived, after every transaction whose commit has.
func (j *Job) Rank() uint64 {
	if s := j.Seq.Load(); s != 0 {
		return s
	}
	return ^uint64(0)
}

// Holder is a target connection of the Applier that holds a transaction, as the lock watch sees
// it: the rank of the transaction (Job.Rank), whether a worker's connection holds it (the
// leader's cannot be rolled back to be applied alone), and whether the worker is waiting
// (for records, for an earlier commit, or for its turn) while holding its locks.
type Holder struct {
	Rank    uint64
	Worker  bool
	Waiting bool
}

// LockWatch finds lock waits the target cannot see as deadlocks: a connection waiting for a lock
// that another of the Applier's connections holds for a transaction that commits later, while
// that one waits for its turn (which never comes before the waiter's commit). A wait seen on
// two observations in a row is one: the holder's transaction must be rolled back and applied
// alone. The zero value is ready for use; not safe for concurrent use.
type LockWatch struct {
	suspects map[[2]uint32]bool
}

// Observe takes one look: holders by backend pid, and for each waiting pid the pids blocking it
// (pg_blocking_pids). It returns the first waiter and blocker whose wait was also seen at the
// previous look, and whether there is one.
func (w *LockWatch) Observe(holders map[uint32]Holder, waits map[uint32][]uint32) (waiter, blocker uint32, found bool) {
	now := map[[2]uint32]bool{}
	for p, blockers := range waits {
		wt, ok := holders[p]
		if !ok {
			continue
		}
		for _, q := range blockers {
			b, ok := holders[q]
			if !ok || !b.Worker || !b.Waiting || wt.Rank >= b.Rank {
				continue
			}
			pair := [2]uint32{p, q}
			now[pair] = true
			if w.suspects[pair] && !found {
				waiter, blocker, found = p, q, true
			}
		}
	}
	w.suspects = now
	return waiter, blocker, found
}

// Reset forgets the waits seen: fewer than two of the Applier's connections hold transactions.
func (w *LockWatch) Reset() { clear(w.suspects) }
