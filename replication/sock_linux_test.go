package replication

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/pgreorder/pgreorder/internal/retry"
)

// rawPair returns a rawSock made of one end of a fresh TCP or Unix connection, and the other end.
func rawPair(t *testing.T, network string) (*rawSock, net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = t.TempDir() + "/s"
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial(network, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	s, ok := newSock(c).(*rawSock)
	if !ok {
		t.Fatalf("newSock(%T) is not a rawSock", c)
	}
	t.Cleanup(func() { s.close() })
	return s, peer
}

// TestRawSock checks the socket the wire reads outside Go's poller: reads of what arrived, a
// read that waits until its deadline, a wake that interrupts a waiting read from another
// goroutine, whole writes, and the errors of a lost connection, for TCP and Unix sockets.
func TestRawSock(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			s, peer := rawPair(t, network)
			buf := make([]byte, 64)

			if _, err := peer.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			s.setReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := s.read(buf); err != nil || string(buf[:n]) != "hello" {
				t.Fatalf("read = %q, %v; want hello", buf[:n], err)
			}

			// Nothing to read: the read waits until its deadline.
			t0 := time.Now()
			s.setReadDeadline(t0.Add(50 * time.Millisecond))
			if _, err := s.read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read with nothing sent: %v, want os.ErrDeadlineExceeded", err)
			}
			if d := time.Since(t0); d < 50*time.Millisecond {
				t.Fatalf("read returned after %v, before its deadline", d)
			}

			// A wake ends a read that would wait for a minute; the next read reads again.
			s.setReadDeadline(time.Now().Add(time.Minute))
			done := make(chan error, 1)
			go func() {
				_, err := s.read(buf)
				done <- err
			}()
			s.wake()
			select {
			case err := <-done:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("woken read: %v, want os.ErrDeadlineExceeded", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("wake did not end the read")
			}
			if _, err := peer.Write([]byte("again")); err != nil {
				t.Fatal(err)
			}
			if n, err := s.read(buf); err != nil || string(buf[:n]) != "again" {
				t.Fatalf("read after the wake = %q, %v; want again", buf[:n], err)
			}

			// Writes arrive whole, also beyond the socket's buffer while the peer reads slowly.
			big := make([]byte, 4<<20)
			for i := range big {
				big[i] = byte(i)
			}
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
				got <- b
			}()
			s.setWriteDeadline(time.Now().Add(time.Minute))
			if err := s.write(big); err != nil {
				t.Fatal(err)
			}
			if b := <-got; string(b) != string(big) {
				t.Fatalf("the peer read %d bytes, not the %d written", len(b), len(big))
			}

			// The peer gone: io.EOF, which the retry rule takes as a lost connection.
			peer.Close()
			s.setReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := s.read(buf); err != io.EOF || !retry.Lost(err) {
				t.Fatalf("read after the peer closed: %v, want io.EOF", err)
			}
			if err := s.close(); err != nil {
				t.Fatal(err)
			}
			if err := s.close(); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("second close: %v, want net.ErrClosed", err)
			}
			s.wake() // after close: nothing to wake, no error
		})
	}
}

// TestRawSockWriteDeadline checks that a write the peer does not read ends at its deadline.
func TestRawSockWriteDeadline(t *testing.T) {
	s, _ := rawPair(t, "unix")
	s.setWriteDeadline(time.Now().Add(100 * time.Millisecond))
	err := s.write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write to a peer that does not read: %v, want os.ErrDeadlineExceeded", err)
	}
}

// TestRawSockTrickle checks the pacing of a stream that arrives a little at a time: after a read
// that found fewer than trickleBelow bytes without waiting, the next read comes tricklePace after
// it at the earliest and takes what arrived meanwhile; a wake ends that pause; a stream that
// fills trickleBelow within a pause is not paced until a read waits.
func TestRawSockTrickle(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			s, peer := rawPair(t, network)
			buf := make([]byte, 64<<10)
			s.setReadDeadline(time.Now().Add(time.Minute))
			// sent writes b and waits until the socket has it, so that the read finds it there.
			sent := func(b []byte) {
				t.Helper()
				if _, err := peer.Write(b); err != nil {
					t.Fatal(err)
				}
				if _, err := s.wait(pollIn, time.Now().Add(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
			sent([]byte("a"))
			if n, err := s.read(buf); err != nil || string(buf[:n]) != "a" {
				t.Fatalf("read = %q, %v; want a", buf[:n], err)
			}
			if !s.trickle {
				t.Fatal("a small read that did not wait does not pace the next one")
			}
			prev := s.last
			sent([]byte("b"))
			if _, err := peer.Write([]byte("c")); err != nil {
				t.Fatal(err)
			}
			n, err := s.read(buf)
			if d := time.Since(prev); d < tricklePace {
				t.Fatalf("the paced read returned %v after the one before, want at least %v", d, tricklePace)
			}
			if err != nil || string(buf[:n]) != "bc" && string(buf[:n]) != "b" {
				t.Fatalf("paced read = %q, %v; want bc (or b)", buf[:n], err)
			}
			if string(buf[:n]) == "b" { // the c had not arrived
				sent(nil)
				if n, err := s.read(buf); err != nil || string(buf[:n]) != "c" {
					t.Fatalf("read = %q, %v; want c", buf[:n], err)
				}
			}

			// A wake during the pause ends the read; the next one reads.
			if !s.trickle {
				t.Fatal("a small read that did not wait does not pace the next one")
			}
			sent([]byte("d"))
			s.wake()
			if _, err := s.read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read woken in its pause: %v, want os.ErrDeadlineExceeded", err)
			}
			if n, err := s.read(buf); err != nil || string(buf[:n]) != "d" {
				t.Fatalf("read after the wake = %q, %v; want d", buf[:n], err)
			}

			// A stream that fills trickleBelow within a pause is not paced until a read waits.
			sent([]byte("e"))
			if n, err := s.read(buf); err != nil || string(buf[:n]) != "e" || !s.trickle {
				t.Fatalf("read = %q, %v, pacing %v; want e, pacing", buf[:n], err, s.trickle)
			}
			if _, err := peer.Write(make([]byte, trickleBelow)); err != nil {
				t.Fatal(err)
			}
			for queued(t, s) < trickleBelow {
				if _, err := s.wait(pollIn, time.Now().Add(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
			s.last = time.Now() // the read follows the one before at once, however slow this test runs
			if n, err := s.read(buf); err != nil || n != trickleBelow || !s.fast || s.trickle {
				t.Fatalf("paced read of a fast stream: %d bytes, %v, fast %v, pacing %v; want %d, fast, no pacing", n, err, s.fast, s.trickle, trickleBelow)
			}
			sent([]byte("f"))
			if n, err := s.read(buf); err != nil || string(buf[:n]) != "f" || s.trickle {
				t.Fatalf("small read of a fast stream = %q, %v, pacing %v; want f, no pacing", buf[:n], err, s.trickle)
			}
			s.setReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := s.read(buf); !errors.Is(err, os.ErrDeadlineExceeded) || s.fast {
				t.Fatalf("read of nothing: %v, fast %v; want os.ErrDeadlineExceeded, not fast", err, s.fast)
			}
			s.setReadDeadline(time.Now().Add(time.Minute))
			sent([]byte("g"))
			if n, err := s.read(buf); err != nil || string(buf[:n]) != "g" || !s.trickle {
				t.Fatalf("read after a wait = %q, %v, pacing %v; want g, pacing", buf[:n], err, s.trickle)
			}
		})
	}
}

// queued returns how many bytes s's socket holds unread.
func queued(t *testing.T, s *rawSock) int {
	t.Helper()
	var n int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(s.fd), syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	return int(n)
}
