package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Progress is the stream's positions at one moment: where it started, what it received, flushed
// and acknowledged. (A Position, in package changefeed, is the one place a consumer resumes after.)
type Progress struct {
	// Start is the slot's confirmed position when the current connection started streaming: the
	// server sends every transaction that commits after it.
	Start decoding.LSN
	// Received is the highest WAL position seen in XLogData and keepalive messages, over all
	// connections.
	Received decoding.LSN
	// Flushed is the highest flush position sent to the server: the server will never send again a
	// transaction committed at or before it.
	Flushed decoding.LSN
	// Acked is the acknowledged prefix: the EndLSN of the last transaction that was acknowledged
	// together with every transaction handed out before it (Config.Buffer.SkipThrough while there
	// is none). It is the position to persist and to pass as Config.Buffer.SkipThrough when starting
	// again, provided everything acknowledged is durable on the consumer's side. The highest
	// acknowledged EndLSN is not, when acknowledgements come out of order.
	Acked decoding.LSN
}

// Stream is a logical replication stream feeding a reorder buffer, reconnecting when the
// connection is lost.
//
// Next, SendStatus and Close are called by the consumer, one at a time. Ack, Position, Stats,
// Activity, Reconnects and Negotiated may be called from any goroutine at any time, also while
// Next runs or while the consumer reads a transaction's changes. Close may also be called from
// another goroutine while Next waits: Next then returns ErrClosed.
//
// One mutex guards the stream's state and the reorder buffer, which is used only under it; it is
// never held while waiting for the network. The transaction the consumer reads is no part of the
// buffer (reorderbuffer.Txn owns what reading it needs), so the consumer reads it without the
// lock while acknowledgements, status updates and Stats go on.
type Stream struct {
	cfg   Config
	base  *pgconn.Config
	log   *slog.Logger
	neg   Negotiated
	every time.Duration

	life     context.Context // cancelled by Close: ends Next's waits and the keepalive goroutine
	kill     context.CancelFunc
	tickDone chan struct{}

	// mu is the stream's one lock: it guards connBusy and the fields after the connection's (the
	// buffer, the positions). The connection is used by one goroutine at a time, the one that set
	// connBusy (Next for its whole call, the keepalive goroutine or SendStatus for a status
	// update, Close): the fields from conn to recvUntil are that goroutine's, read and written
	// without mu (sys is written under mu too, for System). Others wait on connFree.
	mu       sync.Mutex
	connFree sync.Cond
	connBusy bool

	conn      *pgconn.PgConn // taken by wire, handed to notice handlers only; nil while disconnected
	wire      *wire          // owns conn's socket: reads, status updates, close; nil while disconnected
	notice    noticeHandlers // conn's configured handlers of server notices and errors
	temporary bool           // the slot is temporary: it died with the connection
	sys       System         // IDENTIFY_SYSTEM of the current (or last) connection
	slotPos   decoding.LSN   // the slot's confirmed position when the connection started
	last      time.Time      // when the last status update was sent
	err       error          // sticky: a fatal error ends the stream
	cause     error          // why the connection was lost, while reconnecting
	attempt   int            // failed reconnection attempts in a row
	slotSince time.Time      // since when reconnections met the slot in use (ErrSlotActive); zero otherwise
	askedAt   time.Time      // when a status update last asked the server for its position (AdvanceSoon)
	awaiting  bool           // an answer to it is awaited
	answered  bool           // a keepalive came after it: the idle advance may be handed out now

	advanceSoon atomic.Bool // AdvanceSoon was called: ask the server for its position when idle

	// wakeMu guards wakeSock, the socket of the current connection (nil while disconnected):
	// wake, called by whoever cancels a context Next waits with, or closes the stream,
	// interrupts a waiting read through it.
	wakeMu   sync.Mutex
	wakeSock sock
	// wakeDone is the Done channel of the context whose end calls wake (a context.AfterFunc,
	// which wakeStop removes): Next registers its context once and keeps the registration for
	// the calls that follow with the same one. The connection's goroutine's, like conn.
	wakeDone <-chan struct{}
	wakeStop func() bool

	// Guarded by mu.
	buf        *reorderbuffer.Buffer
	pos        Progress
	reconnects int
	act        activity // for Activity (metrics.go)
	closing    bool
	closed     bool
}

func newStream(c *Conn, sess *session, w *wire, buf *reorderbuffer.Buffer) *Stream {
	s := &Stream{
		cfg:       c.cfg,
		base:      c.base,
		log:       c.log,
		neg:       c.neg,
		every:     c.every,
		tickDone:  make(chan struct{}),
		conn:      sess.conn,
		wire:      w,
		wakeSock:  w.sock,
		notice:    sess.notice,
		temporary: sess.slot.Temporary,
		sys:       sess.sys.export(),
		slotPos:   sess.slot.ConfirmedFlush,
		last:      time.Now(),
		buf:       buf,
		act:       newActivity(time.Now()),
	}
	s.pos = Progress{Start: s.slotPos, Flushed: s.slotPos, Acked: buf.AckedThrough()}
	s.connFree.L = &s.mu
	s.life, s.kill = context.WithCancel(context.Background())
	context.AfterFunc(s.life, s.wake)
	go s.keepalive()
	return s
}

// wake interrupts a read waiting on the current connection, which returns as at its deadline.
// The reader then finds out why (a context ended, the stream closed) or, if nothing did, sets
// its deadline again.
func (s *Stream) wake() {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if s.wakeSock != nil {
		s.wakeSock.wake()
	}
}

// setWire makes w (nil: none) the connection's reader, for wake too.
func (s *Stream) setWire(w *wire) {
	s.wire = w
	s.wakeMu.Lock()
	s.wakeSock = nil
	if w != nil {
		s.wakeSock = w.sock
	}
	s.wakeMu.Unlock()
}

// connected reports whether the stream has a connection that no read found broken.
func (s *Stream) connected() bool {
	return s.conn != nil && !s.wire.broken()
}

// Negotiated returns what was negotiated with the server.
func (s *Stream) Negotiated() Negotiated { return s.neg }

// System returns what IDENTIFY_SYSTEM said when the current connection (or the last one) was
// made. A reconnection never changes ID: one that reaches another system fails with
// ErrSystemChanged.
func (s *Stream) System() System {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sys
}

// Progress returns the stream's current positions.
func (s *Stream) Progress() Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pos
}

// Stats returns the reorder buffer's statistics, current also while the consumer reads a
// transaction.
func (s *Stream) Stats() reorderbuffer.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Stats()
}

// takeConn waits until no other goroutine uses the connection, and takes it (see Stream.mu).
func (s *Stream) takeConn() {
	s.mu.Lock()
	for s.connBusy {
		s.connFree.Wait()
	}
	s.connBusy = true
	s.mu.Unlock()
}

// giveConn lets the connection go, for the next goroutine waiting in takeConn.
func (s *Stream) giveConn() {
	s.mu.Lock()
	s.connBusy = false
	s.connFree.Broadcast()
	s.mu.Unlock()
}

// Reconnects returns how many times the stream connected again after losing its connection.
func (s *Stream) Reconnects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reconnects
}

// Next returns the next committed transaction, in commit order, blocking until one is complete.
// While it waits it receives and buffers messages, answers keepalives that ask for a reply, and
// sends a standby status update at least every StatusInterval.
//
// When the connection is lost (network error, walsender terminated, server restarted or shut
// down, slot busy when connecting again), Next reconnects according to Config.Reconnect: it
// connects with the same configuration (calling BeforeConnect again), checks the slot, and
// streams from the slot's confirmed position again; the buffer keeps every complete
// transaction and drops those the server sends again, so the transactions Next returns continue
// without duplicates or gaps. Errors that reconnecting cannot cure (see Retryable), and every
// error when reconnection is disabled, are sticky: the stream can only be closed.
//
// The returned transaction and its Changes are valid until the next call to Next or Close. A
// cancelled ctx stops Next with ctx's error and leaves the stream usable. After Close, Next
// returns ErrClosed.
func (s *Stream) Next(ctx context.Context) (*reorderbuffer.Txn, error) {
	return s.next(ctx, time.Time{})
}

// NextBefore is Next that waits for a transaction to complete until the time until at most:
// past it, it returns context.DeadlineExceeded, as Next does with a context whose deadline
// passed, without the timer and the wake-up such a context costs on every call. A zero until
// waits as Next does.
func (s *Stream) NextBefore(ctx context.Context, until time.Time) (*reorderbuffer.Txn, error) {
	return s.next(ctx, until)
}

// next is Next, waiting until until when it is not zero.
func (s *Stream) next(ctx context.Context, until time.Time) (*reorderbuffer.Txn, error) {
	s.takeConn()
	defer s.giveConn()
	if s.life.Err() != nil {
		return nil, ErrClosed
	}
	if s.err != nil {
		return nil, s.err
	}
	if done := ctx.Done(); done != nil && done != s.wakeDone {
		// One registration for this call and the next ones with the same context, not one per
		// message or per call: ctx's end interrupts the read waiting then (and the read after
		// it, if it came between two reads). Should it end between two calls, the next read's
		// deadline has passed: it is set again (see isTimeout below).
		if s.wakeStop != nil {
			s.wakeStop()
		}
		s.wakeDone, s.wakeStop = done, context.AfterFunc(ctx, s.wake)
	}
	for {
		s.mu.Lock()
		t, ok := s.buf.Next()
		if ok {
			s.act.handOut(t, s.buf.Pending())
		}
		s.mu.Unlock()
		if ok {
			return t, nil
		}
		if s.conn == nil {
			if err := s.reconnectBefore(ctx, until); err != nil {
				return nil, err
			}
			continue
		}
		if s.cfg.Buffer.HandOutAdvances {
			if s.answered {
				s.answered = false
				if s.queueAdvance() {
					s.advanceSoon.Store(false)
					continue
				}
			}
			if s.awaiting && time.Since(s.askedAt) >= s.every {
				s.awaiting = false // no answer: ask again
			}
			if !s.awaiting && s.advanceSoon.Load() && time.Since(s.askedAt) >= askEvery {
				// The server's answer to a status update asking for one is a keepalive with its
				// position: the advance is handed out when it comes, if the position moved.
				if err := s.sendStatus(true); err != nil {
					if err := s.lost(err); err != nil {
						return nil, err
					}
					continue
				}
				s.askedAt, s.awaiting = time.Now(), true
			}
		}
		if time.Since(s.last) >= s.every {
			if s.cfg.Buffer.HandOutAdvances && s.queueAdvance() {
				continue // handed out first: the status update follows its acknowledgement
			}
			if err := s.sendStatus(false); err != nil {
				if err := s.lost(err); err != nil {
					return nil, err
				}
				continue
			}
		}
		var err error
		if !s.wire.ready() {
			// Wait for the next message until the next status update is due (or until). The
			// deadline is set before ctx is looked at: a ctx that ends after the look moves it
			// (wake).
			deadline := s.last.Add(s.every)
			if !s.awaiting && s.advanceSoon.Load() && s.askedAt.Add(askEvery).Before(deadline) {
				deadline = s.askedAt.Add(askEvery) // to ask again
			}
			if !until.IsZero() {
				if !time.Now().Before(until) {
					return nil, context.DeadlineExceeded
				}
				if until.Before(deadline) {
					deadline = until
				}
			}
			s.wire.setDeadline(deadline)
			switch {
			case s.life.Err() != nil:
				return nil, ErrClosed
			case ctx.Err() != nil:
				return nil, ctx.Err()
			}
			err = s.wire.fill()
		}
		if err != nil {
			switch {
			case s.life.Err() != nil:
				return nil, ErrClosed
			case ctx.Err() != nil:
				if s.wire.broken() { // the connection broke while ctx ended
					if err := s.lost(fmt.Errorf("replication: connection lost: %w", err)); err != nil {
						return nil, err
					}
				}
				return nil, ctx.Err()
			case isTimeout(err):
				// Time for a status update, or a wake for a context that no longer matters
				// (an earlier call's): the deadline is set again either way.
				s.wire.deadline = time.Time{}
				continue
			}
			err = fmt.Errorf("replication: receive: %w", err)
		} else {
			err = s.handleBuffered()
		}
		if err != nil {
			if err := s.lost(err); err != nil {
				return nil, err
			}
		}
	}
}

// reconnectBefore is reconnect, given up at until when it is not zero.
func (s *Stream) reconnectBefore(ctx context.Context, until time.Time) error {
	if until.IsZero() {
		return s.reconnect(ctx)
	}
	rctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	return s.reconnect(rctx)
}

// readyWait is how long Ready reads messages that are already on their way.
const readyWait = time.Millisecond

// Ready reports whether Next would return a transaction at once: one is complete in the buffer,
// or completes from messages that already arrived (Ready reads them, for at most a millisecond,
// and never waits for the server). A consumer that can group transactions (commit several in one
// unit of work) asks it before it commits: true means another transaction is there to add, false
// that the stream is idle or the next transaction still on its way. It returns false after
// Close, and on an error, which Next then reports (a lost connection is left for Next to
// reconnect). Ready is called by the consumer, like Next, never while Next runs.
func (s *Stream) Ready() bool {
	s.takeConn()
	defer s.giveConn()
	if s.life.Err() != nil || s.err != nil {
		return false
	}
	until := time.Now().Add(readyWait)
	for {
		s.mu.Lock()
		n := s.buf.Pending()
		s.mu.Unlock()
		if n > 0 {
			return true
		}
		if s.conn == nil {
			return false
		}
		var err error
		if !s.wire.ready() {
			if !time.Now().Before(until) {
				return false
			}
			s.wire.setDeadline(until) // Close moves it (wake)
			if s.life.Err() != nil {
				return false
			}
			err = s.wire.fill()
		}
		if err != nil {
			if s.life.Err() != nil || isTimeout(err) {
				s.wire.deadline = time.Time{} // Next sets its own
				return false
			}
			err = fmt.Errorf("replication: receive: %w", err)
		} else {
			err = s.handleBuffered()
		}
		if err != nil {
			s.lost(err) // Next reconnects, or returns the sticky error
			return false
		}
	}
}

// AdvanceSoon asks for an idle advance (Config.Buffer.HandOutAdvances) as soon as the server can
// say where it is, rather than at the next status interval: while Next has nothing to hand out,
// it asks the server for its position (a status update that requests a reply, at most every
// 100ms) and hands the advance out when an answer shows the position moved past what was
// acknowledged with nothing pending; the request is then done. A consumer that waits to have
// caught up with a position (package apply's UntilCaughtUp) calls it while it is idle. It may be
// called from any goroutine.
func (s *Stream) AdvanceSoon() { s.advanceSoon.Store(true) }

// askEvery is how often Next asks the server for its position while AdvanceSoon waits for it.
const askEvery = 100 * time.Millisecond

// queueAdvance queues an idle advance in the buffer (Config.Buffer.HandOutAdvances), once per
// status interval: when it is time for a status update and nothing is pending, the position the
// server reached is handed out for the consumer to persist and acknowledge, and the update after
// it confirms it.
func (s *Stream) queueAdvance() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.QueueAdvance()
}

// lost handles an error of the connection: a retryable one drops the connection (Next
// reconnects), any other becomes the stream's sticky error, which lost returns.
func (s *Stream) lost(err error) error {
	switch {
	case s.cfg.Reconnect.Disabled:
	case s.temporary && Retryable(err):
		err = fmt.Errorf("replication: the connection to the temporary slot %q was lost, and the slot with it: %w", s.cfg.Slot, err)
	case Retryable(err):
		s.log.Warn("replication connection lost", "error", err, "received", s.Progress().Received)
		s.drop(err)
		return nil
	}
	s.err = err
	return err
}

// drop closes the broken connection and prepares the buffer for the next session.
func (s *Stream) drop(cause error) {
	if s.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	s.wire.close(ctx)
	cancel()
	s.setWire(nil)
	s.conn = nil
	s.awaiting, s.answered = false, false
	s.cause = cause
	s.mu.Lock()
	s.act.disconnected()
	err := s.buf.Restart()
	s.mu.Unlock()
	if err != nil {
		s.err = err
	}
}

// reconnect connects again, with backoff, until it succeeds, ctx ends, the stream is closed, or
// an error cannot be cured by retrying.
func (s *Stream) reconnect(ctx context.Context) error {
	if s.err != nil {
		return s.err
	}
	p := s.cfg.Reconnect
	for {
		s.attempt++
		if p.MaxAttempts > 0 && s.attempt > p.MaxAttempts {
			s.err = fmt.Errorf("replication: giving up after %d reconnection attempts: %w", p.MaxAttempts, s.cause)
			return s.err
		}
		d := p.backoff().Delay(s.attempt)
		s.log.Info("reconnecting", "slot", s.cfg.Slot, "attempt", s.attempt, "delay", d, "cause", s.cause)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			s.attempt--
			return ctx.Err()
		case <-s.life.Done():
			t.Stop()
			return ErrClosed
		}
		rctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(s.life, cancel)
		err := s.resume(rctx)
		stop()
		cancel()
		switch {
		case err == nil:
			s.attempt, s.cause, s.slotSince = 0, nil, time.Time{}
			return nil
		case s.life.Err() != nil:
			return ErrClosed
		case ctx.Err() != nil:
			return ctx.Err()
		case !Retryable(err):
			s.err = err
			return err
		}
		if errors.Is(err, ErrSlotActive) {
			if s.slotSince.IsZero() {
				s.slotSince = time.Now()
			}
			if _, gave := slotWaitOver(err, s.slotSince, 0, p.slotWait()); gave != nil {
				s.err = gave
				return gave
			}
			logSlotActive(s.log, err, s.attempt, 0, p.slotWait())
		} else {
			s.slotSince = time.Time{}
		}
		s.cause = err
	}
}

// resume opens a new session on the slot and starts streaming from its confirmed position.
func (s *Stream) resume(ctx context.Context) (err error) {
	sess, err := openSession(ctx, &s.cfg, s.base, s.log, sessionLogs{})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			sess.close(ctx)
		}
	}()
	if sess.slot == nil {
		if sess.sys.systemID == s.sys.ID && sess.sys.timeline > s.sys.Timeline {
			return slotLostToFailover(&s.cfg, sess.sys.dbName, s.sys.Timeline, sess.sys.timeline)
		}
		return slotNotFound(&s.cfg, sess.sys)
	}
	if sess.sys.systemID != s.sys.ID {
		return &CheckError{Setting: "system", Err: ErrSystemChanged,
			Problem: fmt.Sprintf("the server is database system %s, the stream started on system %s: a slot of the same name on "+
				"another server does not continue this stream", sess.sys.systemID, s.sys.ID),
			Fix: "point the connection back at the server the stream started on, or start again with a position of the new server"}
	}
	was := s.sys.Timeline
	if sess.sys.timeline != was && s.cfg.Failover {
		failoverWarnings(ctx, sess.conn, &s.cfg, sess.slot, s.log) // SQL: before the connection streams
	}
	if err := startReplication(ctx, sess.conn, s.cfg.Slot, s.neg.PluginArgs); err != nil {
		return err
	}
	w, err := newWire(ctx, sess.conn)
	if err != nil {
		return err
	}
	s.conn, s.slotPos, s.last, s.notice = sess.conn, sess.slot.ConfirmedFlush, time.Now(), sess.notice
	s.setWire(w)
	s.mu.Lock()
	s.sys = sess.sys.export()
	s.reconnects++
	s.pos.Start = s.slotPos
	n, pos := s.reconnects, s.pos
	s.mu.Unlock()
	s.log.Info("reconnected", "slot", s.cfg.Slot, "reconnects", n, "start", pos.Start, "received", pos.Received,
		"flushed", pos.Flushed, "acked", pos.Acked)
	if sess.sys.timeline != was {
		s.log.Info("the server is on another timeline: the stream continues on a promoted standby", "slot", s.cfg.Slot,
			"system_id", sess.sys.systemID, "timeline", sess.sys.timeline, "was", was, "slot_synced", sess.slot.Synced)
	}
	return nil
}

// Replication envelope messages (CopyData payloads).
const (
	msgXLogData      = 'w' // server: dataStart, walEnd, sendTime (int64 each), then one pgoutput message
	msgKeepalive     = 'k' // server: walEnd, sendTime (int64), replyRequested (byte)
	msgStandbyStatus = 'r' // client: write, flush, apply, sendTime (int64 each), replyRequested (byte)
)

// handleBuffered handles the messages the wire holds in full, XLogData under one lock of mu for
// a run of them, anything else on its own, until a transaction is complete: the rest waits in
// the wire for the next call, as it would in the socket.
func (s *Stream) handleBuffered() error {
	locked := false
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	for {
		typ, body, ok, err := s.wire.frame()
		if err != nil || !ok {
			return err
		}
		if typ == 'd' && len(body) >= 25 && body[0] == msgXLogData {
			start := decoding.LSN(binary.BigEndian.Uint64(body[1:]))
			end := decoding.LSN(binary.BigEndian.Uint64(body[9:]))
			if !locked {
				s.mu.Lock()
				locked = true
			}
			s.pos.Received = max(s.pos.Received, start, end)
			s.act.data()
			// The payload is in the wire's buffer until its next fill; the buffer copies what
			// it keeps.
			if err := s.buf.Add(start, body[25:]); err != nil {
				return err
			}
			if s.buf.Pending() > 0 {
				return nil
			}
			continue
		}
		if locked {
			s.mu.Unlock()
			locked = false
		}
		if err := s.handle(typ, body); err != nil {
			return err
		}
		s.mu.Lock()
		n := s.buf.Pending()
		s.mu.Unlock()
		if n > 0 {
			return nil
		}
	}
}

// handle processes one backend message other than XLogData: its type and body.
func (s *Stream) handle(typ byte, d []byte) error {
	switch typ {
	case 'd': // CopyData
		if len(d) == 0 {
			return &ProtocolError{Msg: "empty CopyData"}
		}
		switch d[0] {
		case msgXLogData:
			return &ProtocolError{Msg: fmt.Sprintf("XLogData of %d bytes", len(d))}
		case msgKeepalive:
			if len(d) < 18 {
				return &ProtocolError{Msg: fmt.Sprintf("keepalive of %d bytes", len(d))}
			}
			end := decoding.LSN(binary.BigEndian.Uint64(d[1:]))
			s.mu.Lock()
			s.pos.Received = max(s.pos.Received, end)
			s.buf.Keepalive(end)
			s.act.keepalive(d[17] != 0, s.buf.Pending())
			s.mu.Unlock()
			if s.awaiting {
				s.awaiting, s.answered = false, true
			}
			if d[17] != 0 {
				return s.reply(end)
			}
		default:
			// 's' (primary status update, PostgreSQL 19) answers a request we never send; anything
			// else is from a future protocol and carries nothing we need.
			s.log.Debug("ignoring replication message", "type", string(d[0]))
		}
		return nil
	case 'c':
		return fmt.Errorf("%w (CopyDone)", ErrServerEndedStream)
	case 'C':
		// A walsender that stops because the server shuts down ends the copy this way.
		var m pgproto3.CommandComplete
		if err := m.Decode(d); err != nil {
			return &ProtocolError{Msg: "CommandComplete", Err: err}
		}
		return fmt.Errorf("%w (CommandComplete %q)", ErrServerEndedStream, m.CommandTag)
	case 'E':
		var m pgproto3.ErrorResponse
		if err := m.Decode(d); err != nil {
			return &ProtocolError{Msg: "ErrorResponse", Err: err}
		}
		pgErr := pgconn.ErrorResponseToPgError(&m)
		if s.notice.onPgError != nil {
			s.notice.onPgError(s.conn, pgErr) // the stream ends either way
		}
		return fmt.Errorf("replication: %w", pgErr)
	case 'N':
		var m pgproto3.NoticeResponse
		if err := m.Decode(d); err != nil {
			return &ProtocolError{Msg: "NoticeResponse", Err: err}
		}
		if s.notice.onNotice != nil {
			s.notice.onNotice(s.conn, (*pgconn.Notice)(pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(&m))))
		}
		return nil
	case 'S':
		return nil // ParameterStatus: nothing the stream uses changes while streaming
	default:
		return &ProtocolError{Msg: fmt.Sprintf("unexpected message type %q while streaming", typ)}
	}
}

// Ack records that the consumer has durably handled t (every transaction Next returns, including
// non-transactional messages, must be acknowledged once, in any order, from any goroutine). The
// flush position sent to the server advances to the acknowledged prefix: the highest EndLSN whose
// transaction and all earlier ones are acknowledged. It is sent with the next status update (at
// most StatusInterval later, or by SendStatus). A nil t or one another stream handed out is an
// error (reorderbuffer.ErrForeignTxn) and changes nothing. With Config.Buffer.Incremental, Next
// hands out parts of transactions: acknowledge the parts that commit (reorderbuffer.PartKind).
// With Config.Buffer.HandOutAdvances, Next also hands out reorderbuffer.Advance entries:
// acknowledge each once its EndLSN is persisted.
func (s *Stream) Ack(t *reorderbuffer.Txn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.buf.Ack(t); err != nil {
		return err
	}
	s.act.ack(t, s.buf.Pending())
	s.pos.Acked = s.buf.AckedThrough()
	return nil
}

// SendStatus sends a standby status update now (write = received, flush = the acknowledged
// position), and asks the server for a reply if requestReply is set. It waits for a running Next
// to return. While the stream is reconnecting it returns ErrNotConnected.
func (s *Stream) SendStatus(ctx context.Context, requestReply bool) error {
	s.takeConn()
	defer s.giveConn()
	switch {
	case s.life.Err() != nil:
		return ErrClosed
	case s.err != nil:
		return s.err
	case s.conn == nil:
		return ErrNotConnected
	}
	if err := s.sendStatus(requestReply); err != nil {
		return s.lost(err)
	}
	return nil
}

// keepalive sends status updates while the consumer is not inside Next (busy with a long
// transaction), so that the server's wal_sender_timeout does not end the connection. It only ever
// reports what the buffer says is safe: acknowledged transactions.
func (s *Stream) keepalive() {
	defer close(s.tickDone)
	t := time.NewTimer(s.every)
	defer t.Stop()
	for {
		select {
		case <-s.life.Done():
			return
		case <-t.C:
		}
		s.takeConn() // waits while Next runs: Next sends its own updates
		wait := s.every
		if s.life.Err() == nil && s.err == nil && s.connected() {
			if since := time.Since(s.last); since < s.every {
				wait = s.every - since
			} else if err := s.sendStatus(false); err != nil {
				// Next finds the broken connection on its next receive and reconnects.
				s.log.Debug("status update failed", "error", err)
			}
		}
		s.giveConn()
		t.Reset(wait)
	}
}

// flushPosition is the position safe to confirm: the buffer's (the acknowledged prefix, held back
// by prepared transactions not yet acknowledged), never beyond what was received (a resume
// position the server never sent is not a position to confirm), never below the slot's confirmed
// position, and never below what was sent before. Called with mu held, by the connection's user
// (slotPos).
func (s *Stream) flushPosition() decoding.LSN {
	return flushPosition(s.buf.FlushPosition(), s.pos.Received, s.slotPos, s.pos.Flushed)
}

func flushPosition(buffer, received, slot, sent decoding.LSN) decoding.LSN {
	return max(min(buffer, received), slot, sent)
}

// sendStatus writes an 'r' message with the write and flush positions. Called by the
// connection's user (takeConn).
func (s *Stream) sendStatus(requestReply bool) error {
	return s.status(requestReply, 0)
}

// reply answers a keepalive that asks for a reply, whose walEnd is end.
//
// When the flush position is behind end, the answer carries no flush position (InvalidXLogRecPtr,
// which the server never takes as a confirmation). A walsender that stops because the server
// shuts down waits until the flush position (or, if the client reports none, the write position)
// reaches what it sent, asking for a reply after each one: a consumer holding back its flush
// position for transactions it has not acknowledged, or for a prepared transaction, would keep
// it, and the shutdown, waiting until wal_sender_timeout (for ever if that is 0), answering in a
// tight loop. With no flush position, the walsender sees the write position, which is what was
// received, and ends the stream at once. Flush positions go with the regular status updates.
func (s *Stream) reply(end decoding.LSN) error {
	return s.status(false, end)
}

// status writes an 'r' message. The write position is what was received (or the flush position,
// if that is higher: the slot's position before anything arrived); never more, as a walsender
// that shuts down waits for it to reach what it sent. If replyTo is set and the flush position is
// behind it, the flush and apply positions are sent as invalid (see reply).
func (s *Stream) status(requestReply bool, replyTo decoding.LSN) error {
	s.mu.Lock()
	flush := s.flushPosition()
	write := max(s.pos.Received, flush)
	s.mu.Unlock()
	report := flush
	if replyTo != 0 && flush < replyTo {
		report = 0
	}
	var msg [34]byte
	msg[0] = msgStandbyStatus
	binary.BigEndian.PutUint64(msg[1:], uint64(write))
	binary.BigEndian.PutUint64(msg[9:], uint64(report))
	binary.BigEndian.PutUint64(msg[17:], uint64(report)) // apply: handled by the consumer = flushed
	binary.BigEndian.PutUint64(msg[25:], uint64(pgTime(time.Now())))
	if requestReply {
		msg[33] = 1
	}
	buf, err := (&pgproto3.CopyData{Data: msg[:]}).Encode(nil)
	if err != nil {
		return err
	}
	if err := s.wire.send(buf); err != nil {
		return fmt.Errorf("replication: send status: %w", err)
	}
	s.log.Debug("status", "write", write, "flush", report, "reply", requestReply)
	if report == 0 {
		return nil // not a full status update: the next one is still due
	}
	s.last = time.Now()
	s.mu.Lock()
	s.pos.Flushed = flush
	s.mu.Unlock()
	return nil
}

// pgTime is microseconds since 2000-01-01 UTC.
func pgTime(t time.Time) int64 {
	return t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
}

// Close stops a waiting Next, sends a final status update with the acknowledged position (when
// the connection is healthy), closes the connection and the buffer (removing its spill files),
// and stops the keepalive goroutine. ctx bounds the polite part; the connection is closed
// regardless. Safe to call twice.
func (s *Stream) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.mu.Unlock()
	s.kill()
	s.takeConn()
	if s.wakeStop != nil {
		s.wakeStop()
		s.wakeDone, s.wakeStop = nil, nil
	}
	var errs []error
	if s.conn != nil {
		if s.err == nil && s.connected() {
			if err := s.sendStatus(false); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.wire.close(ctx); err != nil {
			errs = append(errs, err)
		}
		s.setWire(nil)
		s.conn = nil
	}
	s.mu.Lock()
	s.closed = true
	if err := s.buf.Close(); err != nil {
		errs = append(errs, err)
	}
	pos := s.pos
	s.mu.Unlock()
	s.giveConn()
	<-s.tickDone
	s.log.Info("closed", "flushed", pos.Flushed, "acked", pos.Acked, "received", pos.Received)
	return errors.Join(errs...)
}
