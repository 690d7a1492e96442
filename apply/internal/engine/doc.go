// Package engine applies one session's replication stream on the target: the leader's loop,
// the workers, the queues between them, the commit order, grouping, and the acknowledgements to
// the source. It is what apply's three modes run once the session is set up:
//
//   - Buffered (runBuffered): whole transactions, grouped, on the leader's connection;
//   - Eager (the eager mode): streamed transactions on workers as they arrive, whole ones on the
//     leader's connection, grouped while nothing else is in flight;
//   - Parallel (the parallel mode): whole transactions too on workers, in runs ordered by their
//     dependencies, or grouped on the leader while the runs are chained.
//
// The decisions that need no server, no goroutine and no clock (when a commit may be
// acknowledged, when a commit must be synchronous, when a group or a run is full, whether the
// runs are chained) are package plan's; this package holds the state they are made on under its
// locks, and acts on them.
//
// Contract. The session builds an Engine with New from a Config and a Session, and calls Run
// once, on the goroutine that reads the stream. Everything in Session belongs to the session:
// the leader's connection (which the session closes), the stream, the relation registry, the
// Applier's shared counters and maps (Serial and Stepwise are read and cleared by the leader
// only). The engine owns what it makes: the workers' connections (opened through
// Host.ConnectWorker, closed before Run returns), their goroutines (all ended before Run
// returns), and the queues' spill files (removed). Run returns the error that ended the
// session; ErrCaughtUp once caught up (Config.UntilCaughtUp); an error of Host.Restart's to
// start the session over with transactions applied alone. A transaction is acknowledged to
// the source only once the target holds it durably, with a progress row at or past its end.
package engine
