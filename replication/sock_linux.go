package replication

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// rawSock reads a plain TCP or Unix socket through a descriptor of its own, outside Go's network
// poller. A descriptor in the poller stays in its epoll set for good: whenever the process waits
// for anything else (the target's round trips, a worker), the thread parked in epoll_wait is
// woken by every message the walsender sends, which flushes after each one, finds no goroutine
// waiting for the socket, and parks again; the walsender pays for each of those wake-ups too.
// rawSock's socket wakes a thread only while a read waits for it (ppoll, in the read), as
// PostgreSQL's own apply worker does. Reads try the socket first and wait only when it is empty;
// wake writes to an eventfd the wait watches too.
type rawSock struct {
	fd, efd int       // the socket (non-blocking) and the eventfd that wakes a waiting read
	network string    // "tcp" or "unix", for errors
	rdl     time.Time // read deadline (the reader's)
	wdl     time.Time // write deadline (the writer's)

	mu     sync.Mutex // guards closed and efd, for wake from other goroutines
	closed bool

	trickle bool      // the last read found a little without waiting: the next one lets more come
	fast    bool      // a paced read found trickleBelow bytes or more: no pacing until a read waits
	last    time.Time // when the last read that set trickle returned
}

// A stream that arrives faster than it is read, a message at a time (the walsender flushes after
// each one), would be read a message at a time: a system call per message, and on TCP a window
// update the walsender's side handles too. While reads find bytes without waiting but fewer than
// trickleBelow, rawSock reads at most once per tricklePace, so that each read takes what arrived
// meanwhile; a read that had to wait, or found trickleBelow bytes or more, ends the pacing. A
// message of such a stream is thus read at most tricklePace later than it could be; a stream that
// is not arriving (the read waits), or that the consumer reads more slowly than tricklePace, is
// read as before. A stream that fills trickleBelow within a pause (about 20 MB/s and more: a
// large transaction's rows) is not paced again until a read waits: its reads are large enough, and a
// pause would let its many small messages fill the socket's buffer (a Unix socket counts each
// write's overhead) and stop the walsender. A catch-up of pgbench's simple-update (about 8 MB/s
// of pgoutput on two cores) made 7,362 reads instead of 60,565.
const (
	tricklePace  = 200 * time.Microsecond
	trickleBelow = 8 << 10
)

// newSock returns c as a sock: a rawSock for a TCP or Unix connection (c is closed then: the
// rawSock holds the socket through its own descriptor), else c itself (TLS, a custom dialer's
// connection, or when the descriptor cannot be taken).
func newSock(c net.Conn) sock {
	var network string
	switch c.(type) {
	case *net.TCPConn:
		network = "tcp"
	case *net.UnixConn:
		network = "unix"
	default:
		return netSock{c}
	}
	sc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return netSock{c}
	}
	fd := -1
	var derr error
	if err := sc.Control(func(f uintptr) {
		var r uintptr
		var e syscall.Errno
		r, _, e = syscall.Syscall(syscall.SYS_FCNTL, f, syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			derr = e
			return
		}
		fd = int(r)
	}); err != nil || derr != nil {
		return netSock{c}
	}
	efd, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		syscall.Close(fd)
		return netSock{c}
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		syscall.Close(int(efd))
		return netSock{c}
	}
	c.Close() // Go's descriptor leaves the poller; the socket stays open through fd
	return &rawSock{fd: fd, efd: int(efd), network: network}
}

func (s *rawSock) setReadDeadline(t time.Time) error  { s.rdl = t; return nil }
func (s *rawSock) setWriteDeadline(t time.Time) error { s.wdl = t; return nil }

func (s *rawSock) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		one := [8]byte{1}
		syscall.Write(s.efd, one[:]) // a full counter (EAGAIN) wakes as well
	}
}

func (s *rawSock) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: s.network, Err: os.NewSyscallError(op, err)}
}

func (s *rawSock) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	// paced: this read follows a little read by tricklePace at most (a slower consumer waits
	// anyway), so that what it finds tells the stream's rate.
	paced := false
	if s.trickle {
		s.trickle = false
		since := time.Since(s.last)
		paced = since < 2*tricklePace
		woken, err := s.pause(tricklePace - since)
		if err != nil {
			return 0, err
		}
		if woken {
			return 0, s.woken()
		}
	}
	waited := false
	for {
		n, err := syscall.Read(s.fd, p)
		switch {
		case err == nil && n > 0:
			if paced && n >= trickleBelow {
				s.fast = true
			}
			s.trickle = !waited && !s.fast && n < trickleBelow
			if s.trickle {
				s.last = time.Now()
			}
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err == syscall.EINTR:
			continue
		case err != syscall.EAGAIN:
			return 0, s.opError("read", err)
		}
		waited, s.fast = true, false
		woken, err := s.wait(pollIn, s.rdl)
		if err != nil {
			return 0, err
		}
		if woken {
			return 0, s.woken()
		}
	}
}

// woken clears the wake-up's counter and returns what a woken read returns.
func (s *rawSock) woken() error {
	var b [8]byte
	syscall.Read(s.efd, b[:])
	return os.ErrDeadlineExceeded
}

func (s *rawSock) write(p []byte) error {
	for len(p) > 0 {
		n, err := syscall.Write(s.fd, p)
		if n > 0 {
			p = p[n:]
		}
		switch {
		case err == nil && n == 0: // a stream socket does not do this: an error, not a spin
			return &net.OpError{Op: "write", Net: s.network, Err: io.ErrShortWrite}
		case err == nil || err == syscall.EINTR:
			continue
		case err != syscall.EAGAIN:
			return s.opError("write", err)
		}
		if _, err := s.wait(pollOut, s.wdl); err != nil {
			return err
		}
	}
	return nil
}

// ppoll's events.
const (
	pollIn  = 0x1
	pollOut = 0x4
)

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

// wait waits until the socket is ready for events, until deadline (zero: no deadline), or, for
// a read (POLLIN), until wake: woken says so. Past the deadline it returns os.ErrDeadlineExceeded.
func (s *rawSock) wait(events int16, deadline time.Time) (woken bool, err error) {
	fds := [2]pollFd{{fd: int32(s.fd), events: events}, {fd: int32(s.efd), events: pollIn}}
	nfds := 1
	if events == pollIn {
		nfds = 2
	}
	for {
		var ts *syscall.Timespec
		if !deadline.IsZero() {
			d := time.Until(deadline)
			if d <= 0 {
				return false, os.ErrDeadlineExceeded
			}
			t := syscall.NsecToTimespec(int64(d))
			ts = &t
		}
		_, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(nfds),
			uintptr(unsafe.Pointer(ts)), 0, 0, 0)
		switch {
		case e == syscall.EINTR:
			continue
		case e != 0:
			return false, s.opError("ppoll", e)
		}
		if nfds == 2 && fds[1].revents != 0 {
			return true, nil
		}
		if fds[0].revents != 0 { // ready, or an error or hang-up the next read or write reports
			return false, nil
		}
		// Neither: the timeout passed (checked again above).
	}
}

// pause waits d (nothing if d is not positive), or less to the read deadline, or until wake:
// woken says so.
func (s *rawSock) pause(d time.Duration) (woken bool, err error) {
	end := time.Now().Add(d)
	if !s.rdl.IsZero() && s.rdl.Before(end) {
		end = s.rdl
	}
	fds := [1]pollFd{{fd: int32(s.efd), events: pollIn}}
	for {
		d := time.Until(end)
		if d <= 0 {
			return false, nil
		}
		t := syscall.NsecToTimespec(int64(d))
		_, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 1, uintptr(unsafe.Pointer(&t)), 0, 0, 0)
		switch {
		case e == syscall.EINTR:
			continue
		case e != 0:
			return false, s.opError("ppoll", e)
		case fds[0].revents != 0:
			return true, nil
		}
	}
}

func (s *rawSock) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return net.ErrClosed
	}
	s.closed = true
	syscall.Close(s.efd)
	if err := syscall.Close(s.fd); err != nil {
		return s.opError("close", err)
	}
	return nil
}
