package replication

import (
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Activity is what the stream records, with its clock, about the transactions it hands out and
// about the server's progress: what monitoring needs beyond Position and Stats (the reorder
// buffer has no clock). The metrics package turns it into lag and ages.
//
// The stream is caught up when all of these hold: the last message of the server was a
// keepalive that asked for no reply (a walsender sends one when it has sent everything it
// decoded and waits for more WAL; one that asks for a reply changes nothing here), no complete
// transaction waits in the buffer to be handed out, and every transaction Next handed out is
// acknowledged. Any message with WAL data, a transaction handed out, or a lost connection ends
// it. A transaction still being received is not committed yet and does not prevent it.
type Activity struct {
	// Started is when the stream started streaming.
	Started time.Time
	// CaughtUp tells whether the stream is caught up now (see above).
	CaughtUp bool
	// BehindSince is when the stream stopped being caught up (Started if it never was); zero while
	// it is caught up.
	BehindSince time.Time
	// LastCommitTime is the commit time, as the server reported it (server clock), of the last
	// transaction Next handed out with one; zero before the first. Parts of a transaction other
	// than its commit, and non-transactional messages, have no commit time.
	LastCommitTime time.Time
	// LastHandedOut is when Next handed out that transaction (local clock).
	LastHandedOut time.Time
	// OldestUnackedAt is when Next handed out the oldest transaction that is not acknowledged yet;
	// zero if there is none.
	OldestUnackedAt time.Time
	// Unacked is the number of transactions Next handed out that are not acknowledged yet
	// (acknowledgeable ones: whole transactions, commit parts, non-transactional messages).
	Unacked int
	// HandedOut and Acked count the acknowledgeable transactions Next handed out and those that
	// were acknowledged (each once), since the stream started.
	HandedOut, Acked int64
}

// Activity returns what the stream recorded about its transactions and the server's progress.
// Like Position and Stats, it may be called from any goroutine at any time.
func (s *Stream) Activity() Activity {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := &s.act
	out := Activity{
		Started:        a.started,
		CaughtUp:       a.caughtUp,
		LastCommitTime: a.lastCommit,
		LastHandedOut:  a.lastHandedOut,
		Unacked:        len(a.handed) - a.head - a.acked,
		HandedOut:      a.handedOut,
		Acked:          a.ackedTotal,
	}
	if !a.caughtUp {
		out.BehindSince = a.behindSince
	}
	if a.head < len(a.handed) {
		out.OldestUnackedAt = a.started.Add(a.handed[a.head].at)
	}
	return out
}

// activity is the state behind Activity, guarded by Stream.mu. The clock is read only when a
// transaction is handed out and when the caught-up state changes, never per message.
type activity struct {
	started       time.Time
	serverIdle    bool // the server's last message was a keepalive asking for no reply
	caughtUp      bool
	behindSince   time.Time
	lastCommit    time.Time
	lastHandedOut time.Time
	handedOut     int64
	ackedTotal    int64

	// handed holds, in the order Next handed them out, the acknowledgeable transactions from the
	// oldest one not acknowledged on; handed[head] is not acknowledged; acked counts the
	// acknowledged entries after it. Each entry costs 24 bytes until the transactions before it
	// are acknowledged too.
	handed []handout
	head   int
	acked  int
}

type handout struct {
	t     *reorderbuffer.Txn
	at    time.Duration // since started (monotonic)
	acked bool
}

func newActivity(now time.Time) activity {
	return activity{started: now, behindSince: now}
}

// update re-evaluates the caught-up state; pending is the number of complete transactions the
// buffer has not handed out.
func (a *activity) update(pending int) {
	c := a.serverIdle && pending == 0 && a.head == len(a.handed)
	if c == a.caughtUp {
		return
	}
	a.caughtUp = c
	if !c {
		a.behindSince = time.Now()
	}
}

// data records a message with WAL data from the server.
func (a *activity) data() {
	a.serverIdle = false
	if a.caughtUp {
		a.update(0)
	}
}

// keepalive records a keepalive; pending is as for update.
func (a *activity) keepalive(replyRequested bool, pending int) {
	if replyRequested {
		return
	}
	a.serverIdle = true
	a.update(pending)
}

// disconnected records that the connection was lost.
func (a *activity) disconnected() {
	a.serverIdle = false
	a.update(0)
}

// handOut records that Next handed out t.
func (a *activity) handOut(t *reorderbuffer.Txn, pending int) {
	acknowledgeable := t.Part == reorderbuffer.Whole || t.Part == reorderbuffer.PartCommit
	if acknowledgeable || !t.CommitTime.IsZero() {
		now := time.Now()
		if acknowledgeable {
			a.handed = append(a.handed, handout{t: t, at: now.Sub(a.started)})
			a.handedOut++
		}
		if !t.CommitTime.IsZero() {
			a.lastCommit, a.lastHandedOut = t.CommitTime, now
		}
	}
	a.update(pending)
}

// ack records that t, which the buffer accepted, is acknowledged; pending is as for update.
func (a *activity) ack(t *reorderbuffer.Txn, pending int) {
	for i := a.head; i < len(a.handed); i++ {
		h := &a.handed[i]
		if h.t != t {
			continue
		}
		if h.acked {
			return
		}
		h.acked = true
		a.acked++
		a.ackedTotal++
		break
	}
	for a.head < len(a.handed) && a.handed[a.head].acked {
		a.handed[a.head] = handout{}
		a.head++
		a.acked--
	}
	if a.head == len(a.handed) {
		a.handed, a.head = a.handed[:0], 0
		if cap(a.handed) > 1024 {
			a.handed = nil // let a burst's backing array go
		}
	} else if a.head > 64 && a.head > len(a.handed)/2 {
		n := copy(a.handed, a.handed[a.head:])
		clear(a.handed[n:])
		a.handed, a.head = a.handed[:n], 0
	}
	a.update(pending)
}
