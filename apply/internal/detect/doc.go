// Package detect is the applier's conflict detection, as PostgreSQL 18's subscriber defines
// conflicts (package apply/conflict names them): what a target connection keeps of the
// transaction it applies to resolve them, the decisions, the reports, the conflict log table and
// the tombstone store that update_deleted detection reads.
//
// The contract with the target connections (package apply/internal/target), which call it as
// they queue statements, as their results arrive and as they commit:
//
//   - A Detector per connection holds the session's Detection (nil: detection off, and every
//     method is cheap). Source names the source transaction being applied; Keep and KeepTuple
//     copy a queued statement's parameters until ResetArgs (after its batch's results);
//     Savepoint, RollbackTo and Rollback follow the target transaction; Committed counts and
//     logs its conflicts once it committed, never before, and never those of a transaction or
//     subtransaction rolled back.
//   - The statements it makes (Counted, Detection.CheckedSQL, Detection.LocalQuery, UniqueQuery,
//     the tombstone store's) name tables and columns only as the caller quoted them (Table) and
//     take every value as a parameter.
//   - Resolve decides a conflict from the configured resolution: apply the source's change,
//     skip it (the report kept for Committed), or stop with a *conflict.StopError whose hint
//     names the setting that gets past it. Last-update-wins compares commit timestamps, a
//     source transaction whose commit has not arrived counting as committing now, equal times
//     decided by the rows' text so that two nodes replicating to each other agree; its local
//     rows are looked up locked (Detection.Locks), so that the decision still holds when the
//     source's change is written.
//   - Tombstones records local deletions through a trigger the maintainer installs, on its own
//     connection, and stops recording while the apply lag exceeds the retention.
//
// It touches the target only through connections its caller gives it, and imports neither
// apply nor the target connections.
package detect
