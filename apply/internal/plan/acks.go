package plan

import (
	"slices"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

// AsyncGroup is how many commits in a row may skip waiting for the target's WAL flush: the
// next one is synchronous, and makes them all durable.
const AsyncGroup = 64

// Commit is a commit made on the target (or a transaction with nothing to commit, or an idle
// advance), waiting for its acknowledgement to the source. Value is the caller's.
type Commit[T any] struct {
	Seq      uint64       // its place in the source's commit order
	End      decoding.LSN // the source transaction's end LSN
	Progress decoding.LSN // the progress row its target transaction wrote; 0 for none
	// Before is the committed prefix (a sequence number) when its commit was sent: a durable
	// commit makes those durable too, every earlier commit record being earlier in the WAL.
	Before  uint64
	Durable bool // its own commit is durable
	Value   T
}

// Acks holds the commits not yet acknowledged, in commit order (by sequence number: with
// relaxed commit order they are made out of it). A commit is acknowledged once it is in the
// committed prefix, its commit is durable, and a durable progress row is at or past its end.
type Acks[T any] struct {
	list []Commit[T]
	// Flushed: every commit up to this sequence number is durable.
	Flushed uint64
	// Persisted: a durable progress row is at or past this position.
	Persisted decoding.LSN
	// Quiet: the stream had nothing to read for a while and has handed out nothing since but
	// idle advances; every commit is then synchronous.
	Quiet bool

	unsynced      int       // commits since the last synchronous one
	firstUnsynced time.Time // when the first of them committed
}

// Pending returns the number of commits not yet acknowledged.
func (a *Acks[T]) Pending() int { return len(a.list) }

// Persist records a durable progress row at pos.
func (a *Acks[T]) Persist(pos decoding.LSN) { a.Persisted = max(a.Persisted, pos) }

// Ready says whether c may be acknowledged with the committed prefix at prefix.
func (a *Acks[T]) Ready(c Commit[T], prefix uint64) bool {
	return c.Seq <= prefix && (c.Durable || c.Seq <= a.Flushed) && c.End <= a.Persisted
}

// HeadReady says whether the first commit waiting may be acknowledged.
func (a *Acks[T]) HeadReady(prefix uint64) bool { return len(a.list) > 0 && a.Ready(a.list[0], prefix) }

// Unflushed says whether the first commit waiting is in the committed prefix: a flush of the
// target's WAL (and of the progress row) is what it waits for.
func (a *Acks[T]) Unflushed(prefix uint64) bool { return len(a.list) > 0 && a.list[0].Seq <= prefix }

// Committed records a commit; durable says that it, and so every commit before it was sent,
// is durable on the target.
func (a *Acks[T]) Committed(c Commit[T], durable bool) {
	if durable {
		c.Durable = true
		a.Flushed = max(a.Flushed, c.Before)
		a.Persisted = max(a.Persisted, c.Progress)
	}
	i := len(a.list)
	for i > 0 && a.list[i-1].Seq > c.Seq {
		i--
	}
	a.list = slices.Insert(a.list, i, c)
}

// Take removes and returns the commits that may be acknowledged now, in order: the longest
// ready run at the head.
func (a *Acks[T]) Take(prefix uint64) []Commit[T] {
	n := 0
	for n < len(a.list) && a.Ready(a.list[n], prefix) {
		n++
	}
	if n == 0 {
		return nil
	}
	ready := a.list[:n:n]
	a.list = a.list[n:]
	if len(a.list) == 0 {
		a.list = nil
	}
	return ready
}

// Position returns the end of the last commit of the committed prefix (done) recorded here,
// or the durable progress row if it is further: where a flush puts the progress row.
func (a *Acks[T]) Position(done uint64) decoding.LSN {
	pos := a.Persisted
	for _, c := range a.list {
		if c.Seq > done {
			break
		}
		pos = max(pos, c.End)
	}
	return pos
}

// MarkFlushed records that every commit up to seq is durable, and a progress row at pos.
func (a *Acks[T]) MarkFlushed(seq uint64, pos decoding.LSN) {
	a.Flushed = max(a.Flushed, seq)
	a.Persisted = max(a.Persisted, pos)
	a.unsynced = 0
}

// SyncCommit says whether the commit about to be sent at now must wait for the target's WAL
// flush: always while Quiet, else one in AsyncGroup, or the first one delay after an unflushed
// one.
func (a *Acks[T]) SyncCommit(now time.Time, delay time.Duration) bool {
	if a.Quiet || a.unsynced+1 >= AsyncGroup || (a.unsynced > 0 && now.Sub(a.firstUnsynced) >= delay) {
		a.unsynced = 0
		return true
	}
	if a.unsynced == 0 {
		a.firstUnsynced = now
	}
	a.unsynced++
	return false
}
