package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// LockedBuffer collects what several goroutines write (a log handler's output, a child
// process's stderr) and returns it whole. The zero value is ready to use.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Context returns a context that ends after d or when the test ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// EachMajor runs f as a subtest ("pgN") for each of majors that is installed, on its shared
// server; with none installed the test is Unavailable.
func EachMajor(t *testing.T, majors []int, f func(t *testing.T, srv *Server)) {
	ran := false
	for _, major := range Majors(t) {
		if !slices.Contains(majors, major) {
			continue
		}
		ran = true
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) { f(t, Shared(t, major)) })
	}
	if !ran {
		Unavailable(t, fmt.Sprintf("none of PostgreSQL %v is installed", majors))
	}
}

// ExecAll runs statements on connString (see Exec) within a minute, and fails the test on an
// error.
func ExecAll(t testing.TB, connString string, statements ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, Exec(ctx, connString, statements...))
}

// MapDiff returns how got differs from want, one line per key, sorted: "missing K (want W)",
// "K: got G, want W", "extra K (got G)". With limit > 0 it returns at most limit lines and a last
// one that says how many more there are. Tests use it to name the rows a replica gets wrong
// instead of printing two maps that a CI log cuts off.
func MapDiff[K comparable, V comparable](got, want map[K]V, limit int) []string {
	var out []string
	for k, w := range want {
		if g, ok := got[k]; !ok {
			out = append(out, fmt.Sprintf("missing %v (want %v)", k, w))
		} else if g != w {
			out = append(out, fmt.Sprintf("%v: got %v, want %v", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("extra %v (got %v)", k, g))
		}
	}
	slices.Sort(out)
	if limit > 0 && len(out) > limit {
		out = append(out[:limit], fmt.Sprintf("... and %d more", len(out)-limit))
	}
	return out
}
