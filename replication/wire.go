package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// wire reads the backend messages of a connection in the CopyBoth mode of START_REPLICATION
// straight from its socket, instead of through pgconn.ReceiveMessage, which watches the
// caller's context for every message (a context.AfterFunc each) and reads through an 8 KiB
// buffer. The wire reads whatever the socket holds, up to its buffer's size, in one call, and
// hands out the messages in place: the only copy of a message's bytes after the kernel's is the
// one the reorder buffer keeps.
//
// Reads wait until the socket's read deadline, which the stream sets once per status interval
// (setDeadline does nothing when it is unchanged). A cancelled context or Close interrupts a
// waiting read (Stream.wake, sock.wake), from the goroutine that cancels: no goroutine waits for
// it.
//
// The wire owns the socket: newWire hijacks it from pgconn (pgconn.PgConn.Hijack), after which
// pgconn neither reads, writes nor closes it, and on Linux takes a plain TCP or Unix socket out of
// Go's network poller (rawSock), so that the walsender's messages wake a thread only while the
// stream waits for them, and reads a stream that arrives a message at a time at most once per
// tricklePace (200 µs), so that a read takes several. The stream's status updates are written with send, and close ends the
// session (Terminate) and closes the socket.
type wire struct {
	sock     sock
	buf      []byte // buf[r:w] was read and not yet handed out
	r, w     int
	deadline time.Time // the read deadline set on the socket; zero when it must be set again
	err      error     // the error of the read that broke the connection (not a deadline)
}

const (
	// wireBufSize is the read buffer's size: larger than a Unix socket's default receive buffer
	// (208 KiB on Linux), so that one read takes all a busy walsender sent meanwhile.
	wireBufSize = 256 << 10
	// wireMaxLen bounds a message's length: the walsender's largest (an XLogData carrying one
	// pgoutput message of at most 1 GB, PostgreSQL's MaxAllocSize, and its headers).
	wireMaxLen = 1<<30 + 1<<16
)

// newWire takes the connection conn, which has just answered START_REPLICATION with
// CopyBothResponse, from pgconn: conn is closed for pgconn's purposes from then on (the stream
// hands it to notice handlers only), and the wire closes the socket. Messages pgconn read ahead
// of that answer are still in its frontend's buffer: they are received from there first (the last
// one may need more bytes from the socket, which ctx bounds) and become the wire's first
// messages. When newWire fails, the socket is closed.
func newWire(ctx context.Context, conn *pgconn.PgConn) (_ *wire, err error) {
	hc, err := conn.Hijack()
	if err != nil {
		return nil, fmt.Errorf("replication: taking the connection from pgconn: %w", err)
	}
	nc := hc.Conn
	w := &wire{buf: make([]byte, wireBufSize)}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	fe := hc.Frontend
	if fe.ReadBufferLen() == 0 {
		w.sock = newSock(nc)
		return w, nil
	}
	stop := context.AfterFunc(ctx, func() { nc.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	var pending []byte
	for fe.ReadBufferLen() > 0 {
		msg, err := fe.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("replication: receive: %w", err)
		}
		if pending, err = msg.Encode(pending); err != nil {
			return nil, &ProtocolError{Msg: fmt.Sprintf("re-encoding %T", msg), Err: err}
		}
	}
	if !stop() {
		return nil, ctx.Err() // it ended as the last message came: the deadline moved
	}
	if err := nc.SetReadDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("replication: receive: %w", err)
	}
	if len(pending) > len(w.buf) {
		w.buf = pending
	} else {
		copy(w.buf, pending)
	}
	w.w = len(pending)
	w.sock = newSock(nc)
	return w, nil
}

// send writes one message (whole, encoded) to the server. A failed write breaks the connection:
// whether the server got part of the message is unknown.
func (w *wire) send(msg []byte) error {
	if w.err != nil {
		return w.err
	}
	if err := w.sock.write(msg); err != nil {
		w.err = err
		return err
	}
	return nil
}

// terminate is the Terminate message, which ends the session politely.
var terminate = []byte{'X', 0, 0, 0, 4}

// close ends the session: a Terminate when the connection is healthy (written before ctx's
// deadline, if it has one), then the socket closed.
func (w *wire) close(ctx context.Context) error {
	if w.err == nil {
		if d, ok := ctx.Deadline(); ok {
			w.sock.setWriteDeadline(d)
		}
		w.sock.write(terminate) // the server may be gone already: nothing to do about it
	}
	w.err = net.ErrClosed
	return w.sock.close()
}

// aLongTimeAgo is a read deadline that has passed: setting it interrupts a waiting read.
var aLongTimeAgo = time.Unix(1, 0)

// setDeadline sets the socket's read deadline to t, unless it is set there already.
func (w *wire) setDeadline(t time.Time) {
	if w.deadline.Equal(t) && !t.IsZero() {
		return
	}
	if err := w.sock.setReadDeadline(t); err != nil {
		w.deadline = time.Time{}
		return // the next read fails the same way
	}
	w.deadline = t
}

// broken reports whether a read failed other than by its deadline: the connection is lost.
func (w *wire) broken() bool { return w.err != nil }

// frame returns the next message if the buffer holds all of it: its type and its body, which
// stays valid until the next fill. ok is false when more bytes must be read first.
func (w *wire) frame() (typ byte, body []byte, ok bool, err error) {
	n := w.w - w.r
	if n < 5 {
		return 0, nil, false, nil
	}
	h := w.buf[w.r:]
	size := int64(binary.BigEndian.Uint32(h[1:5])) // includes the length itself
	if size < 4 || size > wireMaxLen {
		return 0, nil, false, &ProtocolError{Msg: fmt.Sprintf("message %q of length %d", h[0], size)}
	}
	end := 1 + int(size)
	if n < end {
		return 0, nil, false, nil
	}
	w.r += end
	return h[0], h[5:end:end], true, nil
}

// ready reports whether frame would return a message without a read.
func (w *wire) ready() bool {
	n := w.w - w.r
	if n < 5 {
		return false
	}
	size := int64(binary.BigEndian.Uint32(w.buf[w.r+1:]))
	return size < 4 || size > wireMaxLen || n >= 1+int(size) // a bad length: frame reports it
}

// fill reads from the socket once, waiting until its deadline for something to arrive. It makes
// room first: what is left of a partial message moves to the front, and the buffer grows when
// that message does not fit (and shrinks back once a large message is handed out).
func (w *wire) fill() error {
	if w.err != nil {
		return w.err
	}
	if w.r == w.w {
		w.r, w.w = 0, 0
		if len(w.buf) > wireBufSize {
			w.buf = make([]byte, wireBufSize)
		}
	}
	need := 5
	if w.w-w.r >= 5 {
		need = 1 + int(binary.BigEndian.Uint32(w.buf[w.r+1:]))
	}
	if need > len(w.buf)-w.r {
		if need > len(w.buf) {
			nb := make([]byte, max(need, wireBufSize))
			w.w = copy(nb, w.buf[w.r:w.w])
			w.buf = nb
		} else {
			w.w = copy(w.buf, w.buf[w.r:w.w])
		}
		w.r = 0
	} else if w.r > 0 && len(w.buf)-w.w < len(w.buf)/4 {
		w.w = copy(w.buf, w.buf[w.r:w.w]) // little room left: reads would get a little each
		w.r = 0
	}
	n, err := w.sock.read(w.buf[w.w:])
	w.w += n
	if n > 0 {
		return nil // an error comes again with the next read
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return err
	case errors.Is(err, io.EOF):
		err = io.ErrUnexpectedEOF // the walsender never closes the connection without a message
	}
	w.err = err
	return err
}

// isTimeout reports whether a read ended at its deadline (the connection is fine).
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// noticeHandlers are a connection's configured OnNotice and OnPgError (pgconn.Config), which
// pgconn calls for what it receives; the stream calls them for what the wire receives.
type noticeHandlers struct {
	onNotice  pgconn.NoticeHandler
	onPgError pgconn.PgErrorHandler
}
