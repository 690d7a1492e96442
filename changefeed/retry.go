package changefeed

import (
	"time"

	"github.com/pgreorder/pgreorder/internal/retry"
)

// copyBackoff is the wait between two attempts of the initial copy, and between two attempts to
// resume on a slot still in use: from 200ms, doubling up to 5s, with ±20% jitter.
var copyBackoff = retry.Backoff{Min: 200 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}

// Retryable reports whether the copy that the handler's error stopped is worth starting over:
// only when the error is a lost connection (lostConnection), never for the handler's own
// decision.
func (e *stopError) Retryable() bool { return lostConnection(e.err) }
