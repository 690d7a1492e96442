package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a schedule of delays between attempts: Min before the first, doubling for each
// attempt after it up to Max, each spread at random over ±Jitter of itself (0.2: from 80% to
// 120%). A Max below Min is Min; a Jitter outside [0, 1) is 0 or just below 1.
type Backoff struct {
	Min, Max time.Duration
	Jitter   float64
}

// Base returns the delay before attempt n (from 1), without jitter.
func (b Backoff) Base(n int) time.Duration {
	hi := max(b.Max, b.Min)
	d := b.Min
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// Delay returns the delay before attempt n (from 1), with jitter.
func (b Backoff) Delay(n int) time.Duration { return b.Spread(b.Base(n)) }

// Spread returns d spread at random over ±Jitter of itself.
func (b Backoff) Spread(d time.Duration) time.Duration {
	j := min(max(b.Jitter, 0), 0.999)
	if j == 0 || d <= 0 {
		return d
	}
	return d + time.Duration((rand.Float64()*2-1)*j*float64(d))
}

// Wait waits the delay before attempt n (Delay), or until ctx ends, and then returns
// context.Cause(ctx).
func (b Backoff) Wait(ctx context.Context, n int) error {
	t := time.NewTimer(b.Delay(n))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
