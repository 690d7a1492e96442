package reorderbuffer

import "github.com/pgreorder/pgreorder/decoding"

// progress tracks what the consumer has acknowledged and computes the position that is safe to
// confirm to the server. It knows nothing of transaction contents: it sees end LSNs, positions
// received, and the PREPARE positions that pin the confirmed position.
//
// Invariants (checked by check):
//   - pending[head:] holds, in commit order, one entry per transaction that was queued or handed
//     out and is not part of the acknowledged prefix; pending[head] is not acknowledged.
//   - unacked counts the entries of pending[head:] not acknowledged.
//   - acked is the end LSN of the last transaction of the acknowledged prefix (initially the
//     resume position) and never decreases.
//   - pins maps the xid of every prepared transaction that is held, or committed and not yet
//     acknowledged, to its PREPARE position and the number of holders.
//   - reported, the last position flush returned, never decreases and never exceeds received.
type progress struct {
	pending []ackEntry
	head    int
	base    uint64 // sequence number of pending[head]
	unacked int

	acked     decoding.LSN
	received  decoding.LSN // highest position known to be received in full
	keepalive decoding.LSN
	noIdle    bool // the keepalive position is confirmed only through Advance entries
	reported  decoding.LSN
	pins      map[uint32]*pin
}

type ackEntry struct {
	end   decoding.LSN
	acked bool
}

type pin struct {
	at   decoding.LSN // the PREPARE position: the server sends the transaction again only from before it
	refs int
}

func newProgress(resume decoding.LSN, noIdle bool) progress {
	return progress{acked: resume, noIdle: noIdle}
}

// enqueue registers a transaction that will be handed out, in commit order, and returns its
// sequence number for ack.
func (p *progress) enqueue(end decoding.LSN) uint64 {
	seq := p.base + uint64(len(p.pending)-p.head)
	p.pending = append(p.pending, ackEntry{end: end})
	p.unacked++
	p.receive(end)
	return seq
}

// ack marks the transaction with sequence number seq acknowledged. It reports false when it
// already was (or seq is unknown).
func (p *progress) ack(seq uint64) bool {
	if seq < p.base {
		return false
	}
	i := p.head + int(seq-p.base)
	if i >= len(p.pending) || p.pending[i].acked {
		return false
	}
	p.pending[i].acked = true
	p.unacked--
	for p.head < len(p.pending) && p.pending[p.head].acked {
		p.acked = max(p.acked, p.pending[p.head].end)
		p.head++
		p.base++
	}
	if p.head == len(p.pending) {
		p.pending, p.head = p.pending[:0], 0
		if cap(p.pending) > 1024 {
			p.pending = nil // let a burst's backing array go
		}
	} else if p.head > 64 && p.head > len(p.pending)/2 {
		n := copy(p.pending, p.pending[p.head:])
		p.pending, p.head = p.pending[:n], 0
	}
	return true
}

// receive records that everything up to lsn was received.
func (p *progress) receive(lsn decoding.LSN) { p.received = max(p.received, lsn) }

// pin adds a holder of the pin of prepared transaction xid at its PREPARE position.
func (p *progress) pin(xid uint32, at decoding.LSN) {
	if p.pins == nil {
		p.pins = make(map[uint32]*pin)
	}
	if pn := p.pins[xid]; pn != nil {
		pn.refs++
		pn.at = min(pn.at, at)
		return
	}
	p.pins[xid] = &pin{at: at, refs: 1}
}

// unpin removes a holder of xid's pin.
func (p *progress) unpin(xid uint32) {
	if pn := p.pins[xid]; pn != nil {
		if pn.refs--; pn.refs <= 0 {
			delete(p.pins, xid)
		}
	}
}

// flush returns the position that is safe to confirm: the acknowledged prefix or, when nothing
// is pending and no plain transaction is half received (receiving), the last keepalive
// position; never past a pinned PREPARE, never past what was received, never less than before.
func (p *progress) flush(receiving bool) decoding.LSN {
	pos := p.acked
	if p.unacked == 0 && !receiving && !p.noIdle {
		pos = max(pos, p.keepalive)
	}
	for _, pn := range p.pins {
		pos = min(pos, pn.at)
	}
	pos = min(pos, p.received)
	pos = max(pos, p.reported)
	p.reported = pos
	return pos
}

// idleAdvance returns the keepalive position when an Advance to it may be queued: nothing is
// pending, no plain transaction is half received (receiving), and it is past the acknowledged
// prefix.
func (p *progress) idleAdvance(receiving bool) (decoding.LSN, bool) {
	if p.unacked != 0 || receiving || p.keepalive <= p.acked {
		return 0, false
	}
	return p.keepalive, true
}

// oldestUnacked returns the end LSN of the oldest transaction not acknowledged, or 0.
func (p *progress) oldestUnacked() decoding.LSN {
	if p.head < len(p.pending) {
		return p.pending[p.head].end
	}
	return 0
}

// lastEnqueued returns the end LSN of the last transaction enqueued and not yet part of the
// acknowledged prefix, or the acknowledged prefix.
func (p *progress) lastEnqueued() decoding.LSN {
	if n := len(p.pending); n > p.head {
		return p.pending[n-1].end
	}
	return p.acked
}

// check verifies the invariants.
func (p *progress) check() error {
	n := 0
	for i := p.head; i < len(p.pending); i++ {
		if !p.pending[i].acked {
			n++
		}
	}
	switch {
	case n != p.unacked:
		return errorf("progress: %d unacknowledged entries, counted %d", n, p.unacked)
	case p.head < len(p.pending) && p.pending[p.head].acked:
		return errorf("progress: the first pending entry is acknowledged")
	case p.reported > p.received:
		return errorf("progress: reported %s beyond received %s", p.reported, p.received)
	}
	for xid, pn := range p.pins {
		if pn.refs <= 0 {
			return errorf("progress: pin of %d has %d holders", xid, pn.refs)
		}
	}
	return nil
}
