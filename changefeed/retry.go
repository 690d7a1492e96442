package changefeed

// Retryable reports whether the attempt that the handler's error stopped is worth making again:
// only when the error is a lost connection (lostConnection), never for the handler's own
// decision.
func (e *stopError) Retryable() bool { return lostConnection(e.err) }
