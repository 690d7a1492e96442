// Package target is the applier's side of the target database: a Conn is one connection, set up
// with the session settings the statements it sends rely on (Settings), and the target
// transaction it applies.
//
// The contract with its caller (package apply, which orders source transactions, groups them,
// acknowledges them and retries sessions):
//
//   - Connect opens a Conn; Begin, Change, Savepoint, RollbackTo and Commit (or Rollback) apply
//     one target transaction, whose commit writes the progress row (ProgressKey, PrepareProgress)
//     in the same round trip, or with relaxed commit order the worker's row of the ahead table
//     (CommitAhead, PrepareAhead, AheadSQL). Changes are not sent one by one: inserts into one table gather
//     into a run sent through COPY (or as INSERTs when short), other statements into a batch of
//     prepared statements sent in one round trip and checked in order. A Conn is used by one
//     goroutine.
//   - Relations (the stream's descriptions, interned by a Registry shared by a session's
//     connections) are mapped to the target's tables once, from the target's catalog (Table).
//   - A change the target refuses is a *ChangeError, with a Kind and the statement (Op); the
//     caller names the source transaction. Any other error (the connection, a transient SQLSTATE:
//     pgsession.TransientSQLState) leaves the transaction to be retried as a whole.
//   - A configuration the connections cannot be made with is a *ConfigError, which the caller
//     wraps in its own sentinel.
//   - Every name that came over the wire or from the configuration is quoted by pgsession.QuoteIdent; every
//     value is a parameter; no statement holds more than one command built from such names.
//   - Conflict detection (SetDetection with the session's detect.Detection; package detect keeps
//     the state, makes the decisions and the reports) is paid for only where a statement
//     conflicts, as below.
//
// Counters are the atomic counters a session's connections add to; the caller reads them.
//
// Conflict detection keeps the applier's fast paths as they are and pays only where something
// conflicts:
//
//   - Inserts go as INSERT ... ON CONFLICT DO NOTHING (short runs) or through COPY after a
//     savepoint (long runs; on a unique violation the run is rolled back to it and sent again
//     as INSERT ... ON CONFLICT DO NOTHING). An insert that affects no row met a unique index:
//     the local rows of every unique index are looked up, and the conflict reported
//     (insert_exists, or multiple_unique_conflicts when several indexes conflict).
//   - Updates and deletes are sent as before, plus, when the target tracks commit timestamps
//     and the Applier has a replication origin, a condition that the row was last changed by
//     one of the Applier's origins. One that affects no row is looked up: found, the row was
//     changed by another origin (*_origin_differs); missing, it is update_missing (or
//     update_deleted when a tombstone for its key is newer than the source transaction) or
//     delete_missing.
//   - An update that sets a column of a unique index goes after a savepoint, at the end of its
//     batch; a unique violation rolls back to it and is update_exists (or
//     multiple_unique_conflicts).
//   - On a connection that may apply a transaction before earlier ones committed (SetSettle), a
//     conflict is one only if it is still there once they did: the settle function waits for
//     them, and the row is looked up (and the statement sent) again.
//   - A batch's conflicts are resolved in order after the batch ran, as if one at a time; a
//     resolution that must write, or decide its conflict, after later statements of the batch
//     changed its table returns ErrOutOfOrder, and package apply applies the transaction again
//     with Stepwise on (one statement per batch).
//   - Checked statements return the rows they changed and mark the transaction when none; the
//     batch that commits checks the mark after a savepoint, before its COMMIT, so that a
//     conflict holds the commit back (see commitCheck) and nothing else costs a round trip.
//
// Lookups and resolutions run on the connection applying the transaction, inside it, in the
// order of the statements.
//
// The Conn's jobs, by file: conn.go connects and sets the session up; txn.go is the target
// transaction (begin, savepoints, commit with the progress row, the rows counted); statements.go
// makes each change's statement; stmtcache.go keeps the prepared statements, at most
// Options.MaxStatements; batch.go sends the batch and checks its results; copyrun.go gathers runs
// of inserts and sends them through COPY; coalesce*.go is set-based apply; resolve.go resolves
// conflicts; progress.go and origin.go are the progress row and the replication origin; errors.go
// says what failed. Besides applying: uninstall.go removes what an Applier made on the target,
// locks.go reads the lock waits apply's watchdog breaks, sequences.go moves a sequence forward;
// fence.go takes the advisory locks that fence a slot's sessions, progress_setup.go sets up the
// progress, skip and ahead tables, copytable.go is the initial copy's record, published.go and
// create.go read the source's tables and create them on the target.
package target
