package apply

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// closedAddr returns a TCP port on 127.0.0.1 that refuses connections: one that was just listened
// on and closed.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	must(t, l.Close())
	return fmt.Sprintf("host=127.0.0.1 port=%d dbname=x user=x connect_timeout=5", port)
}

// TestStartTimeout: a first start that cannot reach one of the servers stops after StartTimeout
// with ErrNotStarted, naming the side; with StartTimeout negative it goes on trying until ctx ends.
func TestStartTimeout(t *testing.T) {
	for _, major := range testMajors {
		e := newEnv(t, major)
		for _, tc := range []struct {
			side   string
			config func(Config) Config
		}{
			{"source", func(c Config) Config { c.Source.ConnString = closedAddr(t); return c }},
			{"target", func(c Config) Config { c.Target = closedAddr(t); return c }},
		} {
			t.Run(fmt.Sprintf("pg%d/%s", major, tc.side), func(t *testing.T) {
				cfg := tc.config(e.config(t, Buffered))
				cfg.StartTimeout = time.Second
				ctx := pgtest.Context(t, time.Minute)
				began := time.Now()
				err := Run(ctx, cfg)
				took := time.Since(began)
				if !errors.Is(err, ErrNotStarted) {
					t.Fatalf("Run: %v, want ErrNotStarted", err)
				}
				if want := "the " + tc.side + " could not be reached"; !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
				if !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "StartTimeout") {
					t.Errorf("%q does not give the cause and the setting", err)
				}
				if took > 20*time.Second {
					t.Errorf("stopped after %v with StartTimeout 1s", took)
				}

				// No limit: still trying when ctx ends.
				cfg.StartTimeout = -1
				short, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				if err := Run(short, cfg); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Run with no start timeout: %v, want the context's end", err)
				}
			})
		}
	}
}
