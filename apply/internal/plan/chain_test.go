package plan

import "testing"

// probesAfter returns how many probes the leader makes in its first groups groups while its
// runs stay chained.
func probesAfter(groups int) int {
	n, every := 0, ChainProbe
	for groups >= every {
		groups -= every
		n++
		every = min(2*every, ChainProbeMax)
	}
	return n
}

// TestChainProbes drives the leader's view of its runs (Chain) as the leader would with runs
// that are always chained: after ChainRuns runs the leader takes over, and the number of groups
// between probes doubles with each probe up to ChainProbeMax; a probe's runs are small. A run
// that is not chained hands the runs back to the workers, and the next probes start again after
// ChainProbe groups. A run found chained by its first transaction is small too.
func TestChainProbes(t *testing.T) {
	var c Chain
	var seq uint64
	var runs, groups []int // at each run handed out: the groups committed since the one before
	since, handbacks := 0, 0
	step := func(chained bool) {
		if c.Leads() {
			seq += 8 // a group's transactions take sequence numbers too
			c.GroupCommitted()
			since++
			return
		}
		seq++
		r := &Run{FirstAt: 1}
		c.Opened(r, seq)
		if r.AfterRun && chained {
			r.ChainAt = 1
		}
		if r.Probe {
			r.Txns = ChainProbeTxns
			if !r.Full(0) {
				t.Fatalf("a probe's run of %d transactions is not full", ChainProbeTxns)
			}
			r.Txns = 0
		}
		if c.Sealed(r) {
			handbacks++
		}
		runs = append(runs, len(runs))
		groups = append(groups, since)
		since = 0
	}
	for range 2000 {
		step(true)
	}
	// The first ChainRuns+1 runs (the first follows nothing), then probes of two runs: the
	// groups before each probe's first run.
	var gaps []int
	for i := ChainRuns + 1; i < len(groups); i += 2 {
		gaps = append(gaps, groups[i])
		if i+1 < len(groups) && groups[i+1] != 0 {
			t.Fatalf("run %d: %d groups between a probe's two runs", i+1, groups[i+1])
		}
	}
	want := ChainProbe
	for i, g := range gaps {
		if g != want {
			t.Fatalf("probe %d after %d groups, want %d (gaps %v)", i+1, g, want, gaps)
		}
		want = min(2*want, ChainProbeMax)
	}
	if len(runs) > ChainRuns+1+2*probesAfter(2000)+2 {
		t.Fatalf("%d runs on the workers in 2000 steps (gaps %v)", len(runs), gaps)
	}
	// A probe that finds the runs independent: the workers take the runs until ChainRuns
	// chained ones in a row, and the next probe comes after ChainProbe groups.
	for c.Leads() {
		step(true)
	}
	step(false) // the probe's first run shows nothing
	step(false)
	if c.lead || c.streak != 0 {
		t.Fatalf("after an independent probe: lead %v, streak %d", c.lead, c.streak)
	}
	if handbacks != 1 {
		t.Fatalf("%d hand-backs reported, want 1: the independent probe's", handbacks)
	}
	for !c.Leads() {
		step(true)
	}
	since = 0
	for c.Leads() {
		step(true)
	}
	step(true) // the probe's first run
	if g := groups[len(groups)-1]; g != ChainProbe {
		t.Fatalf("after an independent probe, the next probe after %d groups, want %d", g, ChainProbe)
	}
	// A run whose first transaction waited for the run before it is small; one that does not is
	// not, even if a later transaction of it waits.
	for _, tc := range []struct {
		afterRun         bool
		firstAt, chainAt int
		small            bool
	}{{true, 1, 1, true}, {true, 2, 2, true}, {true, 1, 2, false}, {true, 1, 0, false}, {true, 1, -1, false}, {false, 1, 1, false}} {
		r := &Run{AfterRun: tc.afterRun, FirstAt: tc.firstAt, ChainAt: tc.chainAt, Txns: ChainProbeTxns}
		if full := r.Full(0); full != tc.small {
			t.Errorf("run %+v of %d transactions: full %v, want %v", tc, ChainProbeTxns, full, tc.small)
		}
	}
}
