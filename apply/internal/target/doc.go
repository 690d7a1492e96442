// Package target is the applier's side of the target database: a Conn is one connection, set up
// with the session settings the statements it sends rely on (Settings), and the target
// transaction it applies.
//
// The contract with its caller (package apply, which orders source transactions, groups them,
// acknowledges them and retries sessions):
//
//   - Connect opens a Conn; Begin, Change, Savepoint, RollbackTo and Commit (or Rollback) apply
//     one target transaction, whose commit writes the progress row (ProgressKey, PrepareProgress)
//     in the same round trip. Changes are not sent one by one: inserts into one table gather
//     into a run sent through COPY (or as INSERTs when short), other statements into a batch of
//     prepared statements sent in one round trip and checked in order. A Conn is used by one
//     goroutine.
//   - Relations (the stream's descriptions, interned by a Registry shared by a session's
//     connections) are mapped to the target's tables once, from the target's catalog (Table).
//   - A change the target refuses is a *ChangeError, with a Kind and the statement (Op); the
//     caller names the source transaction. Any other error (the connection, a transient SQLSTATE:
//     replication.TransientSQLState) leaves the transaction to be retried as a whole.
//   - A configuration the connections cannot be made with is a *ConfigError, which the caller
//     wraps in its own sentinel.
//   - Every name that came over the wire or from the configuration is quoted by QuoteIdent; every
//     value is a parameter; no statement holds more than one command built from such names.
//   - Conflict detection (SetDetection with the session's Detection) is paid for only where a
//     statement conflicts: checked statements mark the transaction, and conflicts are looked up
//     and resolved on the connection, inside the transaction, before its commit.
//
// Counters are the atomic counters a session's connections add to; the caller reads them.
package target
