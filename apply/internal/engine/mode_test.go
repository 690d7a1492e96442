package engine

import (
	"testing"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TestModes checks where Eager and Parallel send what the stream hands out, without a server:
// Eager groups a whole committed transaction on the leader while nothing else is in flight and
// gives workers nothing committed; Parallel puts whole transactions in runs, groups them on the
// leader only while its runs are chained, and keeps a transaction to apply alone off both.
func TestModes(t *testing.T) {
	whole := &reorderbuffer.Txn{Xid: 10, Part: reorderbuffer.PartCommit}
	streamed := &reorderbuffer.Txn{Xid: 11, Part: reorderbuffer.PartCommit, Streamed: true}
	part := &reorderbuffer.Txn{Xid: 12, Part: reorderbuffer.PartChanges}
	message := &reorderbuffer.Txn{Part: reorderbuffer.PartCommit, NonTransactional: true}
	newEngine := func(mode Mode) *Engine {
		return New(Config{Mode: mode}, Session{Serial: map[uint32]bool{}, Stepwise: map[uint32]bool{}})
	}

	e := newEngine(Eager)
	e.jobs = map[uint32]*job{}
	for _, tc := range []struct {
		name string
		t    *reorderbuffer.Txn
		want bool
	}{{"whole", whole, true}, {"streamed", streamed, false}, {"part", part, false}, {"message", message, false}} {
		if got := e.mode.groupable(tc.t); got != tc.want {
			t.Errorf("eager: groupable(%s) = %v, want %v", tc.name, got, tc.want)
		}
		if e.mode.runnable(tc.t) || e.mode.onWorker(tc.t) {
			t.Errorf("eager: %s goes to a worker", tc.name)
		}
	}
	e.jobs[99] = &job{}
	if e.mode.groupable(whole) {
		t.Error("eager: a whole transaction is grouped while another is in flight")
	}
	e.jobs = map[uint32]*job{}
	e.serial[whole.Xid] = true
	if e.mode.groupable(whole) {
		t.Error("eager: a transaction to apply alone is grouped")
	}

	p := newEngine(Parallel)
	p.jobs = map[uint32]*job{}
	if !p.mode.runnable(whole) || p.mode.runnable(streamed) || p.mode.runnable(part) || p.mode.runnable(message) {
		t.Error("parallel: runs take whole committed transactions only")
	}
	if p.mode.groupable(whole) {
		t.Error("parallel: the leader groups while its runs are not chained")
	}
	for seq := uint64(1); !p.chain.Leads(); seq++ { // chained runs in a row: the leader takes over
		r := &job{}
		p.chain.Opened(&r.pr, seq)
		r.pr.Txns, r.pr.FirstAt, r.pr.ChainAt = 1, 1, 1
		p.chain.Sealed(&r.pr)
		if seq > 10 {
			t.Fatal("parallel: the leader never takes over chained runs")
		}
	}
	if !p.mode.groupable(whole) {
		t.Error("parallel: the leader does not group while the runs are chained")
	}
	p.cfg.WorkersOnly = true
	if p.mode.groupable(whole) {
		t.Error("parallel: the leader groups with WorkersOnly")
	}
	p.cfg.WorkersOnly = false
	p.alone = true
	if p.mode.runnable(whole) || p.mode.groupable(whole) {
		t.Error("parallel: a transaction applied alone joins a run or a group")
	}
	p.alone = false
	p.serial[whole.Xid] = true
	if p.mode.runnable(whole) || p.mode.onWorker(whole) {
		t.Error("parallel: a transaction to apply alone goes to a worker")
	}
}
