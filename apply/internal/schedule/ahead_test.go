package schedule

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

// TestOrderAhead: numbers that finish ahead of the prefix are remembered, the prefix passes them
// once the numbers before them finish, WaitFor returns for one number on its own and Wait for the
// prefix, in random finishing orders (the seed is logged).
func TestOrderAhead(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 200 {
		o := NewOrder()
		n := 1 + rng.IntN(30)
		for range n {
			o.Assign()
		}
		perm := rng.Perm(n)
		finished := make([]bool, n+1)
		for _, p := range perm {
			seq := uint64(p + 1)
			if o.Finished(seq) {
				t.Fatalf("%d finished before Finish", seq)
			}
			o.Finish(seq)
			finished[seq] = true
			want := uint64(0)
			for want+1 <= uint64(n) && finished[want+1] {
				want++
			}
			if got := o.Committed(); got != want {
				t.Fatalf("finishing %v: after %d, Committed = %d, want %d", perm, seq, got, want)
			}
			for s := uint64(1); s <= uint64(n); s++ {
				if o.Finished(s) != finished[s] {
					t.Fatalf("Finished(%d) = %v, want %v", s, o.Finished(s), finished[s])
				}
			}
			if err := o.WaitFor(ctx, seq); err != nil {
				t.Fatal(err)
			}
			if err := o.Wait(ctx, want); err != nil {
				t.Fatal(err)
			}
		}
		o.Finish(1) // again: nothing changes
		if o.Committed() != uint64(n) {
			t.Fatalf("Committed = %d, want %d", o.Committed(), n)
		}
	}
}

// TestOrderWaitForWakes: WaitFor waits for its number only, Wait for the prefix.
func TestOrderWaitForWakes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := NewOrder()
	for range 3 {
		o.Assign()
	}
	one, prefix := make(chan error, 1), make(chan error, 1)
	go func() { one <- o.WaitFor(ctx, 3) }()
	go func() { prefix <- o.Wait(ctx, 3) }()
	o.Finish(3)
	if err := <-one; err != nil {
		t.Fatal(err)
	}
	select {
	case <-prefix:
		t.Fatal("Wait(3) returned with 1 and 2 not finished")
	default:
	}
	o.Finish(2)
	o.Finish(1)
	if err := <-prefix; err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithCancel(ctx)
	stop()
	o.Assign()
	if err := o.WaitFor(short, 4); err == nil {
		t.Fatal("WaitFor returned nil for a number not finished, its context done")
	}
}

// TestAhead: spans are kept until a prefix passes them; Contains matches every end LSN inside a
// span and none outside.
func TestAhead(t *testing.T) {
	var a Ahead
	if a.Contains(10) || a.Len() != 0 {
		t.Fatal("the zero Ahead holds something")
	}
	a.Add(Span{First: 10, Last: 10})
	a.Add(Span{First: 20, Last: 40})
	a.Add(Span{First: 50, Last: 50})
	for end, want := range map[decoding.LSN]bool{9: false, 10: true, 11: false, 19: false, 20: true, 33: true, 40: true, 41: false, 50: true, 51: false} {
		if a.Contains(end) != want {
			t.Errorf("Contains(%d) = %v, want %v", end, !want, want)
		}
	}
	var b Ahead
	if err := b.AddFlat(a.Flat()); err != nil || len(b.Spans()) != 3 || b.Spans()[1] != (Span{First: 20, Last: 40}) {
		t.Fatalf("AddFlat(Flat()) = %v, %v", b.Spans(), err)
	}
	if err := b.AddFlat([]decoding.LSN{1}); err == nil {
		t.Fatal("AddFlat took an odd number of positions")
	}
	a.Prune(39) // the prefix is inside no span in practice; a span it does not pass stays whole
	if a.Len() != 2 || a.Contains(10) || !a.Contains(20) {
		t.Fatalf("after Prune(39): %v", a.Spans())
	}
	a.Prune(40)
	if got := a.Spans(); len(got) != 1 || got[0] != (Span{First: 50, Last: 50}) {
		t.Fatalf("after Prune(40): %v", got)
	}
	a.Prune(1000)
	if a.Len() != 0 {
		t.Fatalf("after Prune(1000): %v", a.Spans())
	}
}

// TestTrackerDeps: ChangeDeps names each transaction a change depends on, so that with relaxed
// commit order it waits for each of them, not for the prefix up to the last.
func TestTrackerDeps(t *testing.T) {
	tr := NewTracker()
	ins := func(id string) decoding.Message {
		return &decoding.Insert{RelationID: relKeyed.RelationID, New: tup(id, "v")}
	}
	j1, j2, j3, j4, j5, j6 := jobSeq(1), jobSeq(2), jobSeq(3), jobSeq(4), jobSeq(5), jobSeq(6)
	check := func(j *Job, m decoding.Message, rel *decoding.Relation, prefix uint64, seqs ...uint64) {
		t.Helper()
		d, _ := tr.ChangeDeps(j, rel, nil, nil, m, false)
		got := d.Seqs[:d.N]
		if d.Prefix != prefix || len(got) != len(seqs) {
			t.Fatalf("job %d: deps %+v, want prefix %d and %v", j.Seq.Load(), d, prefix, seqs)
		}
		for i := range got {
			if got[i] != seqs[i] {
				t.Fatalf("job %d: deps %v, want %v", j.Seq.Load(), got, seqs)
			}
		}
	}
	check(j1, ins("1"), relKeyed, 0)
	check(j2, ins("2"), relKeyed, 0)
	check(j3, ins("3"), relKeyed, 0) // independent of 1 and 2
	// A key change from 1's row to 2's: it depends on both, each on its own.
	check(j4, &decoding.Update{RelationID: relKeyed.RelationID, OldKind: 'K', Old: tup("1", "NULL"), New: tup("2", "x")}, relKeyed, 0, 1, 2)
	// A change without a usable key: serial, it waits for the whole prefix before it.
	check(j5, &decoding.Delete{RelationID: relFull.RelationID, OldKind: 'O', Old: tup("1", "a")}, relFull, 4)
	// After a serial transaction, everything waits for it (it committed after all before it).
	check(j6, ins("3"), relKeyed, 0, 5, 3)
}
