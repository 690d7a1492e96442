// Package retry decides, in one place, whether work that failed is worth starting again (a
// stream reconnected, a copy started over, an apply session run again), and how long to wait
// before it does.
//
// # The rule
//
// Errors carry their behaviour. An error that knows whether another attempt can cure it says
// so with a method
//
//	Retryable() bool
//
// (the Behaviour interface), as pgconn's errors say with SafeToRetry whether a statement was
// sent. The package's own types implement it (replication.CheckError stops, a
// replication.SlotActiveError retries until its wait is over, apply.ApplyError retries only
// when the connection went...), and so do sentinels made with Stop and Retry. Retryable walks
// err's chain in the order errors.Is and errors.As do: depth first, an error before what it
// wraps, and the errors a multi-error wraps (errors.Join, fmt.Errorf with several %w) from the
// first to the last. The first error in that order that states a behaviour decides; what it
// wraps is not looked at. That is why a package's classifying sentinel comes first in its
// messages ("%w: %w", ErrStore, cause): the classification decides before the raw cause. Besides
// the errors that implement Behaviour, these state one:
//
//   - context.Canceled and context.DeadlineExceeded stop: the work's context ended. (A caller
//     that cancels its own internal waits and knows that its context is alive decides those
//     itself.)
//   - A server's error (*pgconn.PgError) retries when its SQLSTATE is transient, in the one table
//     of pgsession.TransientSQLState, or when it ended the session (Lost).
//   - A lost connection (Lost) retries: a network error, an unexpected end of the connection, a
//     connection already closed after one of those.
//   - An error of a local file (*fs.PathError: a spill file or a queue that could not be written,
//     a full disk) retries: the files are the library's own and another attempt starts them
//     afresh. A corrupt spill log (spill.ErrCorrupt) stops, whatever it wraps.
//   - A *pgconn.ConnectError (an attempt to connect that failed) is decided by what it wraps,
//     except that a server's error in it is a refusal (a password, a missing database, too many
//     connections) decided by its SQLSTATE alone, not a lost connection. The attempts that
//     pgsession makes are wrapped in a *pgsession.AttemptError, which states that an attempt
//     that failed for another reason (the network, DNS, TLS, a timeout of the attempt, an error
//     of the BeforeConnect hook) is retried.
//
// An error that states nothing, from one end of its chain to the other, stops: an error type
// that nobody classified is never retried for ever.
//
// # Lost connections
//
// Lost is the one definition of a lost connection: an error of the network (net.Error, but not
// a bare system call error of a file, and net.ErrClosed), io.EOF or io.ErrUnexpectedEOF, a
// connection pgconn had closed already (pgconn.ErrConnClosed), or a server's error that ends the
// session (severity FATAL or PANIC, or SQLSTATE class 08) on a connection that was made, not the
// refusal of an attempt to connect. It looks at the whole chain, whatever states a behaviour on
// the way, but not into a corrupt spill log. Packages use it where only a lost connection
// excuses an error: a handler's error during a copy, a change the target did not refuse.
//
// # Backoff
//
// Backoff is the one schedule of delays between attempts: from Min, doubling up to Max, each
// spread at random over ±Jitter of itself so that many consumers do not try again in step.
package retry
