package replication

import (
	"net"
	"time"
)

// sock is the wire's socket: reads that wait until a deadline and can be woken from another
// goroutine, whole writes, and close. netSock is a net.Conn's; on Linux, rawSock reads a plain
// TCP or Unix socket outside Go's network poller (sock_linux.go).
type sock interface {
	// read reads what the socket holds, up to len(p), waiting until the read deadline for
	// something to arrive: os.ErrDeadlineExceeded past it, or once wake was called.
	read(p []byte) (int, error)
	setReadDeadline(t time.Time) error
	// wake interrupts a waiting read (it returns os.ErrDeadlineExceeded); any goroutine may call
	// it at any time, also after close.
	wake()
	// write writes all of p before the write deadline.
	write(p []byte) error
	setWriteDeadline(t time.Time) error
	close() error
}

// netSock is a net.Conn as a sock: a read waits in Go's network poller.
type netSock struct{ c net.Conn }

func (s netSock) read(p []byte) (int, error)         { return s.c.Read(p) }
func (s netSock) setReadDeadline(t time.Time) error  { return s.c.SetReadDeadline(t) }
func (s netSock) wake()                              { s.c.SetReadDeadline(aLongTimeAgo) }
func (s netSock) setWriteDeadline(t time.Time) error { return s.c.SetWriteDeadline(t) }
func (s netSock) close() error                       { return s.c.Close() }

func (s netSock) write(p []byte) error {
	_, err := s.c.Write(p)
	return err
}
