package schedule

import "testing"

func TestRank(t *testing.T) {
	var j Job
	if j.Rank() != ^uint64(0) {
		t.Fatalf("a job without its commit ranks %d, want after every other", j.Rank())
	}
	j.Seq.Store(7)
	if j.Rank() != 7 {
		t.Fatalf("Rank = %d, want 7", j.Rank())
	}
}

// TestLockWatch: a wait is a deadlock only when the blocker is a waiting worker whose
// transaction commits after the waiter's, seen on two looks in a row.
func TestLockWatch(t *testing.T) {
	const leader, w1, w2 = 100, 101, 102
	holders := map[uint32]Holder{
		leader: {Rank: 1},
		w1:     {Rank: 2, Worker: true, Waiting: true},
		w2:     {Rank: ^uint64(0), Worker: true, Waiting: true}, // streamed, commit not arrived
	}
	type look struct {
		waits        map[uint32][]uint32
		want         bool
		waiter, blkr uint32
	}
	cases := []struct {
		name  string
		looks []look
	}{
		{"seen twice", []look{
			{waits: map[uint32][]uint32{leader: {w2}}},
			{waits: map[uint32][]uint32{leader: {w2}}, want: true, waiter: leader, blkr: w2},
		}},
		{"seen once, then gone", []look{
			{waits: map[uint32][]uint32{leader: {w2}}},
			{waits: map[uint32][]uint32{}},
			{waits: map[uint32][]uint32{leader: {w2}}},
		}},
		{"blocker commits first", []look{
			{waits: map[uint32][]uint32{w2: {w1}}},
			{waits: map[uint32][]uint32{w2: {w1}}},
		}},
		{"blocked by the leader", []look{
			{waits: map[uint32][]uint32{w1: {leader}}},
			{waits: map[uint32][]uint32{w1: {leader}}},
		}},
		{"blocked by someone else", []look{
			{waits: map[uint32][]uint32{leader: {999}}},
			{waits: map[uint32][]uint32{leader: {999}}},
		}},
		{"a waiter not ours", []look{
			{waits: map[uint32][]uint32{999: {w2}}},
			{waits: map[uint32][]uint32{999: {w2}}},
		}},
		{"worker to later worker", []look{
			{waits: map[uint32][]uint32{w1: {999, w2}}},
			{waits: map[uint32][]uint32{w1: {w2}}, want: true, waiter: w1, blkr: w2},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var w LockWatch
			for i, l := range c.looks {
				p, q, found := w.Observe(holders, l.waits)
				if found != l.want || found && (p != l.waiter || q != l.blkr) {
					t.Fatalf("look %d: %d waits for %d, found %v; want %v (%d, %d)", i, p, q, found, l.want, l.waiter, l.blkr)
				}
			}
		})
	}
	// A blocker that is applying, not waiting, will commit: not a deadlock.
	busy := map[uint32]Holder{leader: {Rank: 1}, w2: {Rank: 5, Worker: true}}
	var w LockWatch
	for range 3 {
		if _, _, found := w.Observe(busy, map[uint32][]uint32{leader: {w2}}); found {
			t.Fatal("a wait on an applying worker taken for a deadlock")
		}
	}
	// Reset forgets.
	w = LockWatch{}
	w.Observe(holders, map[uint32][]uint32{leader: {w2}})
	w.Reset()
	if _, _, found := w.Observe(holders, map[uint32][]uint32{leader: {w2}}); found {
		t.Fatal("a wait seen before Reset counted")
	}
}
