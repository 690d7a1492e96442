package replication

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TestActivityCaughtUp walks the caught-up state through the events that change it.
func TestActivityCaughtUp(t *testing.T) {
	a := newActivity(time.Now())
	check := func(step string, want bool) {
		t.Helper()
		if a.caughtUp != want {
			t.Fatalf("%s: caught up = %v, want %v", step, a.caughtUp, want)
		}
	}
	check("start", false)
	a.keepalive(true, 0)
	check("a keepalive asking for a reply says nothing", false)
	a.keepalive(false, 2)
	check("keepalive with two transactions queued", false)
	t1 := &reorderbuffer.Txn{EndLSN: 10, CommitTime: time.Unix(100, 0)}
	t2 := &reorderbuffer.Txn{EndLSN: 20, CommitTime: time.Unix(200, 0)}
	a.handOut(t1, 1)
	a.handOut(t2, 0)
	check("handed out, not acknowledged", false)
	if a.lastCommit != t2.CommitTime {
		t.Fatalf("last commit time %v, want %v", a.lastCommit, t2.CommitTime)
	}
	a.ack(t2, 0)
	check("one of two acknowledged", false)
	a.ack(t1, 0)
	check("everything acknowledged after the server's keepalive", true)
	if !a.caughtUp || a.handedOut != 2 || a.ackedTotal != 2 || len(a.handed) != 0 {
		t.Fatalf("after acks: %+v", a)
	}
	before := a.behindSince
	a.keepalive(true, 0)
	check("a ping keeps it", true)
	a.data()
	check("data from the server", false)
	if !a.behindSince.After(before) {
		t.Fatal("behindSince did not move when the stream fell behind")
	}
	since := a.behindSince
	a.keepalive(false, 0)
	check("keepalive, nothing pending", true)
	a.disconnected()
	check("connection lost", false)
	if a.behindSince.Before(since) {
		t.Fatal("behindSince went back")
	}
	// Parts that do not commit are handed out but not acknowledged, and carry no commit time.
	a.keepalive(false, 0)
	part := &reorderbuffer.Txn{Part: reorderbuffer.PartChanges}
	a.handOut(part, 0)
	check("a part without commit does not wait for an acknowledgement", true)
	if a.handedOut != 2 || a.lastCommit != t2.CommitTime {
		t.Fatalf("a part changed the counts: %+v", a)
	}
}

// TestActivityAcks acknowledges many transactions in a random order and checks the oldest
// unacknowledged entry and the counts against a simple model.
func TestActivityAcks(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	s := &Stream{act: newActivity(time.Now())}
	a := &s.act
	var txns []*reorderbuffer.Txn
	acked := map[*reorderbuffer.Txn]bool{}
	handedAt := map[*reorderbuffer.Txn]time.Time{}
	next := 0
	for round := range 3000 {
		switch {
		case rng.IntN(3) == 0 || next == len(txns):
			x := &reorderbuffer.Txn{EndLSN: decoding.LSN(len(txns) + 1)}
			txns = append(txns, x)
			a.handOut(x, 0)
			handedAt[x] = a.started.Add(a.handed[len(a.handed)-1].at)
		default:
			// acknowledge a random unacknowledged one, mostly near the oldest; sometimes again
			i := next + rng.IntN(min(len(txns)-next, 1+rng.IntN(200)))
			x := txns[i]
			a.ack(x, 0)
			acked[x] = true
			for next < len(txns) && acked[txns[next]] {
				next++
			}
		}
		got := s.Activity()
		unacked := len(txns) - len(acked)
		if got.Unacked != unacked || got.HandedOut != int64(len(txns)) || got.Acked != int64(len(acked)) {
			t.Fatalf("round %d: %+v; want %d unacked of %d, %d acked", round, got, unacked, len(txns), len(acked))
		}
		var want time.Time
		if next < len(txns) {
			want = handedAt[txns[next]]
		}
		if !got.OldestUnackedAt.Equal(want) {
			t.Fatalf("round %d: oldest unacked at %v, want %v (transaction %d)", round, got.OldestUnackedAt, want, next)
		}
		if len(a.handed)-a.head != len(txns)-next {
			t.Fatalf("round %d: %d entries kept, want %d", round, len(a.handed)-a.head, len(txns)-next)
		}
	}
	for _, x := range txns {
		a.ack(x, 0)
	}
	if got := s.Activity(); got.Unacked != 0 || !got.OldestUnackedAt.IsZero() || len(a.handed) != 0 {
		t.Fatalf("after every ack: %+v, %d entries", got, len(a.handed))
	}
}
