package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/spill"
)

func pgErr(severity, code string) *pgconn.PgError {
	return &pgconn.PgError{Severity: severity, Code: code, Message: "m"}
}

// stated is an error of some package that states its behaviour.
type stated struct {
	retry bool
	err   error
}

func (e *stated) Error() string   { return fmt.Sprintf("stated %v", e.retry) }
func (e *stated) Unwrap() error   { return e.err }
func (e *stated) Retryable() bool { return e.retry }

// silent is an error type nobody classified.
type silent struct{ err error }

func (e *silent) Error() string { return "silent" }
func (e *silent) Unwrap() error { return e.err }

// TestRule holds the rule of the package documentation, case by case.
func TestRule(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		// Nothing said: stop.
		{"unknown", errors.New("x"), false},
		{"unknown type", &silent{}, false},
		{"unknown, wrapped", fmt.Errorf("a: %w", &silent{errors.New("x")}), false},
		{"joined unknowns", errors.Join(errors.New("x"), &silent{}), false},
		// Stated by the error.
		{"stop sentinel", retry.Stop("s"), false},
		{"retry sentinel", retry.Retry("r"), true},
		{"retry sentinel wrapped", fmt.Errorf("a: %w", retry.Retry("r")), true},
		{"marked retry", retry.Mark(errors.New("x"), true), true},
		{"marked stop around transient", retry.Mark(pgErr("ERROR", "40P01"), false), false},
		// The chain: the first that states decides.
		{"stop around transient", &stated{false, pgErr("ERROR", "40P01")}, false},
		{"stop around lost", &stated{false, io.ErrUnexpectedEOF}, false},
		{"retry around refused", &stated{true, pgErr("ERROR", "23505")}, true},
		{"silent around transient", &silent{pgErr("ERROR", "40P01")}, true},
		{"silent around stop", &silent{retry.Stop("s")}, false},
		{"silent around unknown", &silent{&silent{}}, false},
		{"multi: first stated decides (stop)", fmt.Errorf("%w: %w", retry.Stop("store"), pgErr("ERROR", "57P01")), false},
		{"multi: first stated decides (retry)", fmt.Errorf("%w: %w", retry.Retry("gone"), pgErr("ERROR", "22023")), true},
		{"multi: silent first, then stated", fmt.Errorf("%w: %w", errors.New("x"), io.EOF), true},
		{"join: stop first", errors.Join(context.Canceled, retry.Retry("r")), false},
		{"join: retry first", errors.Join(retry.Retry("r"), context.Canceled), true},
		{"nested join depth first", errors.Join(&silent{errors.Join(&silent{}, retry.Stop("s"))}, retry.Retry("r")), false},
		// Context.
		{"canceled", fmt.Errorf("a: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
		// Server errors: the SQLSTATE table, or a session the server ended.
		{"transient sqlstate", fmt.Errorf("a: %w", pgErr("ERROR", "40001")), true},
		{"refused sqlstate", pgErr("ERROR", "23505"), false},
		{"wal removed", pgErr("ERROR", "58P01"), false},
		{"fatal ends the session", pgErr("FATAL", "XX000"), true},
		{"panic ends the session", pgErr("PANIC", "XX000"), true},
		{"class 08", pgErr("ERROR", "08P01"), true},
		{"database dropped under the session", pgErr("FATAL", "57P04"), true},
		// Lost connections.
		{"eof", io.EOF, true},
		{"unexpected eof", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true},
		{"net.OpError", refused, true},
		{"dns", &net.DNSError{Err: "no such host", Name: "h", IsNotFound: true}, true},
		{"net.ErrClosed", net.ErrClosed, true},
		{"conn closed", pgconn.ErrConnClosed, true},
		{"deadline of a read", os.ErrDeadlineExceeded, true},
		// Local files.
		{"full disk", &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}, true},
		{"bare errno is no network", syscall.ENOSPC, false},
		{"corrupt spill log", &spill.CorruptError{Log: "x", Err: io.ErrUnexpectedEOF}, false},
		{"corrupt sentinel first", fmt.Errorf("%w: %w", spill.ErrCorrupt, &fs.PathError{Op: "read", Path: "x", Err: io.ErrUnexpectedEOF}), false},
		// Attempts to connect.
		{"attempt: network", &pgsession.AttemptError{Err: refused}, true},
		{"attempt: hook", &pgsession.AttemptError{Err: fmt.Errorf("BeforeConnect: %w", errors.New("no token"))}, true},
		{"attempt: hook that says stop", &pgsession.AttemptError{Err: fmt.Errorf("BeforeConnect: %w", retry.Stop("no"))}, false},
		{"attempt: timeout", &pgsession.AttemptError{Err: fmt.Errorf("timeout: %w", context.DeadlineExceeded)}, true},
		{"attempt: canceled", &pgsession.AttemptError{Err: context.Canceled}, false},
		{"attempt: password", &pgsession.AttemptError{Err: pgErr("FATAL", "28P01")}, false},
		{"attempt: missing database", &pgsession.AttemptError{Err: pgErr("FATAL", "3D000")}, false},
		{"attempt: too many connections", &pgsession.AttemptError{Err: pgErr("FATAL", "53300")}, true},
		{"attempt: starting up", &pgsession.AttemptError{Err: pgErr("FATAL", "57P03")}, true},
	} {
		if got := retry.Retryable(tt.err); got != tt.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestConnectError: the refusal of an attempt to connect is decided by its SQLSTATE alone, not
// as a lost connection (pgconn.ConnectError is made by pgconn only: a real attempt).
func TestConnectError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close() // nothing listens there any more: refused
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=u dbname=d sslmode=disable connect_timeout=5", addr.Port))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pgconn.ConnectConfig(ctx, cfg)
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("connecting to a closed port: %v", err)
	}
	if !retry.Retryable(err) || !retry.Lost(err) {
		t.Errorf("a refused connection: Retryable %v, Lost %v, want true, true: %v", retry.Retryable(err), retry.Lost(err), err)
	}
	// Through pgsession, the same with its AttemptError, and a hook's error.
	_, err = pgsession.Connect(ctx, pgsession.Options{Kind: pgsession.Source, Config: cfg})
	var ae *pgsession.AttemptError
	if !errors.As(err, &ae) || !retry.Retryable(err) {
		t.Errorf("pgsession.Connect to a closed port: %v (retryable %v)", err, retry.Retryable(err))
	}
	hook := errors.New("no token")
	_, err = pgsession.Connect(ctx, pgsession.Options{Kind: pgsession.Source, Config: cfg,
		BeforeConnect: func(context.Context, *pgconn.Config) error { return hook }})
	if !errors.Is(err, hook) || !errors.As(err, &ae) || !retry.Retryable(err) {
		t.Errorf("a BeforeConnect error: %v (retryable %v), want it wrapped and retried", err, retry.Retryable(err))
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err = pgsession.Connect(cctx, pgsession.Options{Kind: pgsession.Source, Config: cfg}); retry.Retryable(err) {
		t.Errorf("an attempt whose context was cancelled is retried: %v", err)
	}
	if _, err := pgsession.Connect(ctx, pgsession.Options{Kind: pgsession.Source}); retry.Retryable(err) {
		t.Errorf("a configuration not parsed is retried: %v", err)
	}
}

// TestLost holds the one definition of a lost connection.
func TestLost(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"unknown", errors.New("x"), false},
		{"eof", io.EOF, true},
		{"unexpected eof", fmt.Errorf("a: %w", io.ErrUnexpectedEOF), true},
		{"network", &net.OpError{Op: "read", Err: syscall.ECONNRESET}, true},
		{"closed", pgconn.ErrConnClosed, true},
		{"fatal", pgErr("FATAL", "57P01"), true},
		{"fatal of any class", pgErr("FATAL", "XX000"), true},
		{"class 08", pgErr("ERROR", "08006"), true},
		{"query canceled is no lost connection", pgErr("ERROR", "57014"), false},
		{"deadlock is no lost connection", pgErr("ERROR", "40P01"), false},
		{"refused change", pgErr("ERROR", "23505"), false},
		{"through a stated stop", &stated{false, io.EOF}, true},
		{"in a join", errors.Join(errors.New("x"), pgErr("FATAL", "57P01")), true},
		{"canceled", context.Canceled, false},
		{"full disk", &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}, false},
		{"corrupt spill log", &spill.CorruptError{Log: "x", Err: io.ErrUnexpectedEOF}, false},
		{"attempt refused by the server", &pgsession.AttemptError{Err: pgErr("FATAL", "28P01")}, false},
		{"attempt that met the network", &pgsession.AttemptError{Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}, true},
	} {
		if got := retry.Lost(tt.err); got != tt.want {
			t.Errorf("%s: Lost(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestDecided(t *testing.T) {
	if retry.Decided(errors.New("x")) || retry.Decided(nil) || !retry.Decided(fmt.Errorf("a: %w", context.Canceled)) ||
		!retry.Decided(&silent{retry.Stop("s")}) {
		t.Error("Decided")
	}
}

func TestBackoff(t *testing.T) {
	b := retry.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	for i, w := range want {
		if got := b.Base(i + 1); got != w || b.Delay(i+1) != w {
			t.Errorf("attempt %d: %v (delay %v), want %v", i+1, got, b.Delay(i+1), w)
		}
	}
	if got := b.Base(1000); got != time.Second {
		t.Errorf("attempt 1000: %v", got)
	}
	if got := (retry.Backoff{Min: time.Second, Max: time.Millisecond}).Base(5); got != time.Second {
		t.Errorf("Max below Min: %v", got)
	}
	j := retry.Backoff{Min: time.Second, Max: time.Second, Jitter: 0.2}
	lo, hi := time.Hour, time.Duration(0)
	for range 2000 {
		d := j.Delay(3)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 800*time.Millisecond || hi > 1200*time.Millisecond || hi-lo < 200*time.Millisecond {
		t.Errorf("jitter ±20%% of 1s spread over [%v, %v]", lo, hi)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("stopped")
	cancel(cause)
	if err := (retry.Backoff{Min: time.Hour}).Wait(ctx, 1); err != cause {
		t.Errorf("Wait on an ended context: %v, want its cause", err)
	}
	if err := (retry.Backoff{Min: time.Millisecond}).Wait(context.Background(), 1); err != nil {
		t.Errorf("Wait: %v", err)
	}
}
