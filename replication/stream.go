package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// LSN is a WAL position; it prints as PostgreSQL does (%X/%X).
type LSN = decoding.LSN

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("replication: stream closed")

// ErrServerEndedStream is returned by Next when the server ends the copy stream (CopyDone), as it
// does when it shuts down smartly.
var ErrServerEndedStream = errors.New("replication: server ended the replication stream")

// ErrSlotActive is wrapped by the error Start returns when another connection streams from the
// slot. After a consumer dies, its walsender may hold the slot for a moment: retry after a delay.
var ErrSlotActive = errors.New("replication: slot is in use by another connection")

// ProtocolError reports a replication envelope message that could not be understood.
type ProtocolError struct {
	Msg string
}

func (e *ProtocolError) Error() string { return "replication: protocol error: " + e.Msg }

// Position is a snapshot of the stream's positions.
type Position struct {
	// Start is the position START_REPLICATION was sent with (0/0 = the slot's confirmed_flush_lsn).
	Start LSN
	// Received is the highest WAL position seen in XLogData and keepalive messages.
	Received LSN
	// Flushed is the highest flush position sent to the server: the server will never send again a
	// transaction committed at or before it.
	Flushed LSN
	// Acked is the acknowledged prefix: the EndLSN of the last transaction that was acknowledged
	// together with every transaction handed out before it (the resume position when none was).
	// Pass it as Config.Buffer.SkipThrough when starting again if it is also durable on the
	// consumer's side.
	Acked LSN
}

// Stream is one logical replication connection feeding a reorder buffer. It is not safe for
// concurrent use: call Next, Ack, Stats, Position and Close from one goroutine (or serialize them).
type Stream struct {
	conn   *pgconn.PgConn
	buf    *reorderbuffer.Buffer
	log    *slog.Logger
	neg    Negotiated
	every  time.Duration
	pos    Position
	last   time.Time // when the last status update was sent
	closed bool

	// The receive context, with the deadline of the next status update, made once per
	// deadline rather than once per message (a timer each: a quarter of the receive loop's CPU).
	recv       context.Context
	recvCancel context.CancelFunc
	recvFrom   context.Context // the caller's ctx it derives from
	recvUntil  time.Time
	err        error // sticky: the connection is unusable after it
}

// Start connects, creates the slot if asked, and starts streaming from the slot. The connection is
// closed again if anything fails.
func Start(ctx context.Context, cfg Config) (_ *Stream, err error) {
	pcfg, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	if pcfg.RuntimeParams == nil {
		pcfg.RuntimeParams = map[string]string{}
	}
	if pcfg.RuntimeParams["replication"] == "" {
		pcfg.RuntimeParams["replication"] = "database"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("replication: connect: %w", err)
	}
	defer func() {
		if err != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			conn.Close(closeCtx)
			cancel()
		}
	}()
	major, err := parseMajor(conn.ParameterStatus("server_version"))
	if err != nil {
		return nil, err
	}
	neg, err := cfg.Negotiate(major)
	if err != nil {
		return nil, err
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("replication: IDENTIFY_SYSTEM: %w", err)
	}
	if sys.DBName == "" {
		return nil, fmt.Errorf("replication: %w: the connection is not bound to a database (replication=database)", ErrInvalidConfig)
	}
	log.Info("connected", "server_major", major, "system_id", sys.SystemID, "timeline", sys.Timeline,
		"xlogpos", sys.XLogPos, "database", sys.DBName)

	if cfg.CreateSlot {
		if err := createSlot(ctx, conn, major, cfg); err != nil {
			return nil, err
		}
	}

	bcfg := cfg.Buffer
	bcfg.Decoding = neg.decodingOptions()
	buf, err := reorderbuffer.New(bcfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			buf.Close()
		}
	}()
	start := cfg.Buffer.SkipThrough
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, pglogrepl.LSN(start), pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: neg.PluginArgs,
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use
			return nil, fmt.Errorf("replication: START_REPLICATION: %w: %w", ErrSlotActive, err)
		}
		return nil, fmt.Errorf("replication: START_REPLICATION: %w", err)
	}
	log.Info("streaming", "slot", cfg.Slot, "start", start, "proto_version", neg.ProtoVersion,
		"streaming", neg.Streaming, "options", strings.Join(neg.PluginArgs, ", "))
	every := cfg.StatusInterval
	if every <= 0 {
		every = DefaultStatusInterval
	}
	return &Stream{
		conn:  conn,
		buf:   buf,
		log:   log,
		neg:   neg,
		every: every,
		pos:   Position{Start: start, Flushed: start, Acked: start},
		last:  time.Now(),
	}, nil
}

// createSlot creates the slot unless it already exists.
func createSlot(ctx context.Context, conn *pgconn.PgConn, major int, cfg Config) error {
	var b strings.Builder
	b.WriteString("CREATE_REPLICATION_SLOT " + cfg.Slot)
	if cfg.TemporarySlot {
		b.WriteString(" TEMPORARY")
	}
	b.WriteString(" LOGICAL pgoutput")
	switch {
	case major >= 15:
		b.WriteString(" (SNAPSHOT 'nothing'")
		if cfg.TwoPhase {
			b.WriteString(", TWO_PHASE true")
		}
		b.WriteString(")")
	case cfg.TwoPhase:
		return &OptionError{Option: "two_phase", Value: "true", ServerMajor: major, Err: ErrUnsupported}
	default:
		b.WriteString(" NOEXPORT_SNAPSHOT")
	}
	_, err := conn.Exec(ctx, b.String()).ReadAll()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" && !cfg.TemporarySlot { // duplicate_object
		return nil
	}
	if err != nil {
		return fmt.Errorf("replication: CREATE_REPLICATION_SLOT: %w", err)
	}
	return nil
}

// Negotiated returns what was negotiated with the server.
func (s *Stream) Negotiated() Negotiated { return s.neg }

// Position returns the stream's current positions.
func (s *Stream) Position() Position { return s.pos }

// Stats returns the reorder buffer's statistics.
func (s *Stream) Stats() reorderbuffer.Stats { return s.buf.Stats() }

// Next returns the next committed transaction, in commit order, blocking until one is complete.
// While it waits it receives and buffers messages, answers keepalives that ask for a reply at once,
// and sends a standby status update at least every StatusInterval. The returned transaction and its
// Changes are valid until the next call to Next or Close. Errors are sticky: after one the stream
// can only be closed (and started again; see the package documentation). A cancelled ctx stops
// Next with ctx's error and leaves the stream usable.
func (s *Stream) Next(ctx context.Context) (*reorderbuffer.Txn, error) {
	if s.closed {
		return nil, ErrClosed
	}
	if s.err != nil {
		return nil, s.err
	}
	for {
		if t, ok := s.buf.Next(); ok {
			return t, nil
		}
		if time.Since(s.last) >= s.every {
			if err := s.sendStatus(false); err != nil {
				return nil, s.fail(err)
			}
		}
		msg, err := s.conn.ReceiveMessage(s.receiveContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				if s.conn.IsClosed() {
					return nil, s.fail(ctx.Err())
				}
				return nil, ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue // time for a status update
			}
			return nil, s.fail(fmt.Errorf("replication: receive: %w", err))
		}
		if err := s.handle(msg); err != nil {
			return nil, s.fail(err)
		}
	}
}

// receiveContext returns ctx with the deadline of the next status update.
func (s *Stream) receiveContext(ctx context.Context) context.Context {
	until := s.last.Add(s.every)
	if s.recv == nil || s.recvFrom != ctx || !s.recvUntil.Equal(until) || s.recv.Err() != nil {
		s.stopReceiveContext()
		s.recv, s.recvCancel = context.WithDeadline(ctx, until)
		s.recvFrom, s.recvUntil = ctx, until
	}
	return s.recv
}

func (s *Stream) stopReceiveContext() {
	if s.recvCancel != nil {
		s.recvCancel()
	}
	s.recv, s.recvCancel, s.recvFrom = nil, nil, nil
}

func (s *Stream) fail(err error) error {
	s.err = err
	return err
}

// handle processes one backend message.
func (s *Stream) handle(msg pgproto3.BackendMessage) error {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return &ProtocolError{Msg: "empty CopyData"}
		}
		switch msg.Data[0] {
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return &ProtocolError{Msg: err.Error()}
			}
			s.received(LSN(xld.WALStart))
			s.received(LSN(xld.ServerWALEnd))
			// xld.WALData aliases pgconn's read buffer; the buffer copies what it keeps.
			if err := s.buf.Add(LSN(xld.WALStart), xld.WALData); err != nil {
				return err
			}
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return &ProtocolError{Msg: err.Error()}
			}
			s.received(LSN(ka.ServerWALEnd))
			s.buf.Keepalive(LSN(ka.ServerWALEnd))
			if ka.ReplyRequested {
				return s.sendStatus(false)
			}
		default:
			// 's' (primary status update, PostgreSQL 19) answers a request we never send; anything
			// else is from a future protocol and carries nothing we need.
			s.log.Debug("ignoring replication message", "type", string(msg.Data[0]))
		}
		return nil
	case *pgproto3.CopyDone:
		return ErrServerEndedStream
	case *pgproto3.ErrorResponse:
		return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		return nil
	default:
		return &ProtocolError{Msg: fmt.Sprintf("unexpected %T", msg)}
	}
}

func (s *Stream) received(lsn LSN) {
	if lsn > s.pos.Received {
		s.pos.Received = lsn
	}
}

// Ack records that the consumer has durably handled t (every transaction Next returns, including
// non-transactional messages, must be acknowledged once, in any order). The flush position sent to
// the server advances to the highest EndLSN whose transaction and all earlier ones are acknowledged;
// it is sent with the next status update (at most StatusInterval later, or by SendStatus).
func (s *Stream) Ack(t *reorderbuffer.Txn) error {
	if err := s.buf.Ack(t); err != nil {
		return err
	}
	s.pos.Acked = s.buf.AckedThrough()
	return nil
}

// SendStatus sends a standby status update now (write = received, flush = the acknowledged
// position), and asks the server for a reply if requestReply is set.
func (s *Stream) SendStatus(ctx context.Context, requestReply bool) error {
	if s.closed {
		return ErrClosed
	}
	if s.err != nil {
		return s.err
	}
	if err := s.sendStatus(requestReply); err != nil {
		return s.fail(err)
	}
	return nil
}

// flushPosition is the position safe to confirm: the buffer's, never below what was already sent
// (a confirmed position never moves back) nor below the resume position.
func (s *Stream) flushPosition() LSN {
	f := s.buf.FlushPosition()
	if f < s.pos.Flushed {
		f = s.pos.Flushed
	}
	return f
}

// sendStatus writes an 'r' message. It does not use pglogrepl.SendStandbyStatusUpdate, which
// replaces a zero flush position with the write position: that would confirm transactions the
// consumer never handled.
func (s *Stream) sendStatus(requestReply bool) error {
	flush := s.flushPosition()
	write := s.pos.Received
	if write < flush {
		write = flush
	}
	var msg [34]byte
	msg[0] = pglogrepl.StandbyStatusUpdateByteID
	binary.BigEndian.PutUint64(msg[1:], uint64(write))
	binary.BigEndian.PutUint64(msg[9:], uint64(flush))
	binary.BigEndian.PutUint64(msg[17:], uint64(flush)) // apply: handled by the consumer = flushed
	binary.BigEndian.PutUint64(msg[25:], uint64(pgTime(time.Now())))
	if requestReply {
		msg[33] = 1
	}
	buf, err := (&pgproto3.CopyData{Data: msg[:]}).Encode(nil)
	if err != nil {
		return err
	}
	if err := s.conn.Frontend().SendUnbufferedEncodedCopyData(buf); err != nil {
		return fmt.Errorf("replication: send status: %w", err)
	}
	s.last = time.Now()
	s.log.Debug("status", "write", write, "flush", flush, "reply", requestReply)
	s.pos.Flushed = flush
	return nil
}

// pgTime is microseconds since 2000-01-01 UTC.
func pgTime(t time.Time) int64 {
	return t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
}

// Close sends a final status update with the acknowledged position (when the connection is still
// healthy), closes the connection and the buffer (removing its spill files). ctx bounds the polite
// part; the connection is closed regardless. Safe to call twice.
func (s *Stream) Close(ctx context.Context) error {
	if s.closed {
		return nil
	}
	s.closed = true
	s.stopReceiveContext()
	var errs []error
	if s.err == nil && !s.conn.IsClosed() {
		if err := s.sendStatus(false); err != nil {
			errs = append(errs, err)
		} else {
			s.log.Info("closed", "flush", s.pos.Flushed, "acked", s.pos.Acked, "received", s.pos.Received)
		}
	}
	if err := s.conn.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, err)
	}
	if err := s.buf.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
