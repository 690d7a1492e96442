package plan

import "time"

// The chains of runs (Parallel): after ChainRuns chained runs in a row the leader applies whole
// transactions itself, in groups; after ChainProbe groups it hands runs to the workers again as
// a probe, whose runs take at most ChainProbeTxns transactions; a probe that finds the runs
// still chained doubles the groups before the next one, up to ChainProbeMax.
const (
	ChainRuns      = 3
	ChainProbe     = 16
	ChainProbeMax  = 256
	ChainProbeTxns = 32
)

// Run is what the leader decides a run by: the consecutive whole committed transactions a
// worker applies in one target transaction.
type Run struct {
	Seq     uint64    // its place in the commit order
	Txns    int       // the transactions it took
	Changes int       // the changes queued
	Opened  time.Time // when it took its first transaction
	// AfterRun: the run before it in commit order was a run too. FirstAt is 1 + the index of its
	// first transaction with a change, ChainAt of the transaction that first queued a wait for
	// the run before it (0: none; -1: it became serial first).
	AfterRun bool
	FirstAt  int
	ChainAt  int
	Probe    bool // opened as a probe
}

// Chained says whether the run, sealed now, is chained: its first transaction with changes
// waited for the run before it.
func (r *Run) Chained() bool { return r.AfterRun && r.ChainAt > 0 && r.ChainAt == r.FirstAt }

// Full says whether the run took as many transactions or changes as a run may; maxTxns, if
// not 0, replaces GroupMaxTxns. A probe's run, and one found chained, take fewer.
func (r *Run) Full(maxTxns int) bool {
	if maxTxns == 0 {
		maxTxns = GroupMaxTxns
	}
	if r.Probe || r.Chained() {
		maxTxns = min(maxTxns, ChainProbeTxns)
	}
	return r.Txns >= maxTxns || r.Changes >= GroupMaxChanges
}

// Expired says whether the run is too old to take another transaction at now.
func (r *Run) Expired(now time.Time) bool { return now.Sub(r.Opened) >= GroupMaxAge }

// Change notes a change of the run's last transaction about to be queued.
func (r *Run) Change() {
	if r.FirstAt == 0 {
		r.FirstAt = r.Txns
	}
}

// Waited notes, after a change's dependencies were queued, whether the run is serial and
// whether it now waits for the run before it; the first such change decides ChainAt.
func (r *Run) Waited(serial, onPrev bool) {
	if r.ChainAt != 0 || !r.AfterRun {
		return
	}
	if serial {
		r.ChainAt = -1
	} else if onPrev {
		r.ChainAt = r.Txns
	}
}

// Chain is what the leader learned of its recent runs.
type Chain struct {
	streak  int    // chained runs in a row
	lead    bool   // whole transactions go into groups on the leader
	groups  int    // groups the leader committed since it took over, or since the last probe
	every   int    // groups between probes now (0: ChainProbe)
	lastRun uint64 // the sequence number of the last run opened
}

func (c *Chain) interval() int {
	if c.every == 0 {
		return ChainProbe
	}
	return c.every
}

// Leads says whether the leader applies whole transactions itself now.
func (c *Chain) Leads() bool { return c.lead && c.groups < c.interval() }

// Probing says whether the runs handed to the workers now are a probe.
func (c *Chain) Probing() bool { return c.lead && c.groups >= c.interval() }

// Opened notes a run that took sequence number seq.
func (c *Chain) Opened(r *Run, seq uint64) {
	r.Seq = seq
	r.AfterRun = c.lastRun != 0 && c.lastRun == seq-1
	r.Probe = c.Probing()
	c.lastRun = seq
}

// Sealed learns from a run about to be sealed. It reports whether the leader, which applied
// whole transactions itself, hands them to the workers again (the run was not chained).
func (c *Chain) Sealed(r *Run) (handback bool) {
	if !r.AfterRun { // it could wait for no run: it shows nothing
		return false
	}
	if !r.Chained() {
		handback = c.lead
		c.streak, c.lead, c.every = 0, false, 0
		return handback
	}
	c.streak++
	if c.streak < ChainRuns {
		return false
	}
	if r.Probe { // still chained: the next probe comes later
		c.every = min(2*c.interval(), ChainProbeMax)
	}
	c.lead, c.groups = true, 0
	return false
}

// GroupCommitted notes a group the leader committed.
func (c *Chain) GroupCommitted() { c.groups++ }

// Waits is what a job queued waits for: the commit prefix up to For, and with relaxed commit
// order each sequence number of After on its own.
type Waits struct {
	For   uint64
	After map[uint64]bool
}

// Prefix says whether a wait for the prefix up to seq is to be queued, with the prefix
// committed up to committed now, and notes it.
func (w *Waits) Prefix(seq, committed uint64) bool {
	if seq <= w.For || seq <= committed {
		return false
	}
	w.For = seq
	return true
}

// On says whether a wait for seq alone is to be queued (relaxed), finished saying whether seq
// committed already, and notes it.
func (w *Waits) On(seq uint64, finished bool) bool {
	if seq <= w.For || w.After[seq] || finished {
		return false
	}
	if w.After == nil {
		w.After = map[uint64]bool{}
	}
	w.After[seq] = true
	return true
}

// OnPrev says whether a wait for seq-1 was queued, by the prefix or on its own.
func (w *Waits) OnPrev(seq uint64) bool { return w.For >= seq-1 || w.After[seq-1] }

// Startable says whether a run with these waits, sealed now, could commit at once: full, or
// every transaction before it committed (source order: done is seq-1 or more), or, relaxed,
// every one it waits for. finished says whether a sequence number committed out of order.
func (w *Waits) Startable(seq uint64, full, relaxed bool, done uint64, finished func(uint64) bool) bool {
	if full {
		return true
	}
	if !relaxed {
		return done >= seq-1
	}
	if w.For > done {
		return false
	}
	for dep := range w.After {
		if dep > done && !finished(dep) {
			return false
		}
	}
	return true
}
