// Package apply replicates a PostgreSQL publication into a target PostgreSQL database, exactly
// once: a subscriber like PostgreSQL's own, as a library, over pgreorder's replication stream.
//
//	err := apply.Run(ctx, apply.Config{
//		Source: replication.Config{ConnString: "host=src dbname=app",
//			Slot: "to_dst", Publications: []string{"app"}, CreateSlot: true},
//		Target: "host=dst dbname=app",
//		Mode:   apply.Eager,
//	})
//
// The target's tables must exist, matched by schema and name, with every source column (matched
// by name; the target may have more), and hold what the source held when the slot was created,
// or be empty and let Config.Copy fill them. A session checks the published tables before it
// applies anything (the copy's tables, or those the publications hold): those the target lacks
// stop Run with one *MissingTablesError naming all of them, or, with Config.SchemaChanges, are
// created from the source's definition (see Migrations).
//
// # Initial copy
//
// With Config.Copy, a session that finds no progress row for the slot makes the initial copy: it
// creates the slot with an exported snapshot (the slot must not exist), copies the published tables
// as that snapshot sees them with package snapshot (Config.CopyWorkers tables, or page ranges of
// large tables, at once, each chunk written through the same COPY path as streamed inserts, in a
// target transaction of its own), then writes the progress row at the slot's consistent point,
// durably, and streams from it: every transaction that committed before that point is in the copy,
// every later one in the stream, none in both. The schema is not copied: the target's tables must
// exist (or, with Config.SchemaChanges, are created before the copy), and be empty; one that holds
// rows stops Run with ErrTargetNotEmpty before anything is copied (and the slot is dropped again),
// unless Config.CopyTruncate lets the copy truncate it.
//
// A crash, kill or lost connection during the copy leaves part of it on the target. The copy
// table (the progress table's name with "_copy", created next to it) records, before the slot is
// created and before the first row goes into each table, that a copy for the slot is under way
// and which tables it writes; the transaction that writes the progress row deletes those rows.
// A failed session discards its copy (drops the slot, truncates the tables it recorded); a
// session that finds the records but no progress row (the process died) does the same, then
// copies again from a new slot. A slot that exists while the target records neither a copy nor
// progress for it is someone else's: Run stops with ErrCopySlotExists. Once the progress row
// exists, Copy changes nothing.
//
// # Tables added to the publications
//
// The tables table (the progress table's name with "_tables") records the source tables the
// target holds whole: those of the initial copy, or, for a slot followed without one, those
// published when it was first followed. A table added to the publications later (ALTER
// PUBLICATION ... ADD TABLE, or a new table in a FOR ALL TABLES or FOR TABLES IN SCHEMA
// publication) is copied, as ALTER SUBSCRIPTION ... REFRESH PUBLICATION and its table
// synchronization do for a PostgreSQL subscription: a session that starts lists the published
// tables, and copies those the tables table does not record from a snapshot of their own (a
// temporary slot's, consistent point C), in ONE target transaction that also records them with C,
// before it streams. It then leaves out their changes of the source transactions that commit
// before C (the copy holds them) and applies the rest, so no row is missing or applied twice
// whatever is written to the table meanwhile. A session that streams when a table is added (the
// stream describes a table it does not know, or the publication check, every 10 seconds, lists
// one) ends, and the next session copies it at once. While its progress is behind C a session
// applies as Buffered, then starts over in Config.Mode.
//
// A crash during that copy rolls its transaction back, and the next session copies again. A
// target table that holds rows stops Run with ErrTargetNotEmpty unless Config.CopyTruncate; with
// Config.SchemaChanges a missing one is created from the source's definition first. A table
// removed from the publications is forgotten, with a log line: its changes stop, its rows stay;
// added again, it is copied again. Config.NewTables = changefeed.NewTablesStream keeps
// PostgreSQL's behaviour without REFRESH PUBLICATION: the table's changes are applied from then
// on, its earlier rows are not copied, and the log names it.
//
// The copy's snapshot waits for the transactions running on the source to end. When some of
// them wait at their COMMIT for a synchronous standby and none streams (the source's
// synchronous_standby_names names the Applier, which does not stream while it copies), they would
// wait for it for ever: Run stops with ErrCopyBlocked, whose message says what to do (take the
// Applier out of synchronous_standby_names until its next start has copied the tables).
//
// # Exactly once
//
// Each source transaction is applied in one target transaction, which also writes the slot's row
// of the progress table (Config.ProgressTable: slot, end_lsn, and the source system) with the
// transaction's end LSN, and is acknowledged to the source only after that transaction committed
// durably. On start, and after every retried failure, replication starts at the slot's confirmed
// position and whatever the source sends again that ends at or before the progress row's LSN is
// dropped (the reorder buffer's SkipThrough), as PostgreSQL's subscriber does with its replication
// origin. A crash (even SIGKILL, of the Applier or of either server) or a lost connection on
// either side at any point therefore neither loses nor repeats a transaction: what committed on
// the target carries its progress row, and the source keeps everything after the last acknowledged
// commit. Transactions that change nothing on the target are acknowledged without a target
// transaction of their own.
//
// Acknowledged means: the target has flushed to disk the transaction's commit and a progress row at
// or past its end LSN, so it survives a crash of the target server too (as long as the target's own
// fsync is on: a server that does not flush its WAL keeps nothing). By default target transactions
// commit with synchronous_commit = off, as PostgreSQL's subscriber does, and a synchronous commit
// every few dozen transactions or milliseconds makes the earlier ones durable before they are
// acknowledged: one WAL flush for many transactions, checked against the target's flush position.
// Once the stream goes idle (nothing to read for a millisecond: the source may be waiting for the
// acknowledgement, as under synchronous replication), every commit is synchronous and acknowledged
// at once, and one made just before is flushed at once by a transaction that writes the progress
// row. Config.SynchronousCommit makes each commit wait for its own flush instead. Transactions with
// nothing to apply, and idle advances (the source's WAL moving on with nothing published), are
// acknowledged once the progress row has durably reached them.
//
// # The slot and the progress row
//
// The slot's confirmed position therefore never passes the progress row on the target. A slot
// found ahead of it when a session starts means that transactions the source will not send again
// are missing on the target (it was restored from an older backup, or written by a version that
// let the slot confirm what the target had not flushed): Run stops with ErrSlotAhead, which says
// so, unless Config.AcceptSlotAhead lets it continue from the slot's position without them. A
// progress row written before rows recorded idle positions is moved to the slot's position, with
// a log line.
//
// The progress row records the source's database system identifier and timeline. A row of another
// system (a rebuilt source reusing the slot name, or another source replicating into the same
// target with the same slot name and progress table), one written on a later timeline than the
// source's, or one beyond the source's current WAL position stops Run with ErrSourceChanged:
// positions of one system mean nothing on another. A row without a system (from before the table
// had the columns, which are added in place) takes the current source's, once, with a log line.
// A row of an earlier timeline of the same system is a promoted standby's: Run continues from it
// and records the new timeline. With Config.Source.Failover (PostgreSQL 17+) the slot survives
// that promotion: a Source.ConnString naming both servers with target_session_attrs=read-write
// reconnects to the promoted standby and applying goes on.
//
// # Ordering
//
// By default, in every mode, the target commits in the source's commit order, so the progress
// row only moves forward and every state of the target is one the source had at a commit. The
// acknowledged position is the contiguous prefix of committed transactions.
//
// # Relaxed commit order
//
// Config.CommitOrder = CommitRelaxed (Parallel only; Buffered and Eager refuse it with
// ErrInvalidConfig) lets a worker commit a transaction, or a run, as soon as its changes are
// applied, without waiting for its turn, once every transaction it depends on committed: those
// in flight that touched the same rows (relation and replica identity key), and every earlier
// one for what Parallel applies in order (a change without a usable key, TRUNCATE, a table whose
// triggers fire on the target, streamed and large transactions, those applied by the leader),
// which also make every later transaction wait for them. The target may then briefly show a
// transaction without an earlier, independent one: a state the source never had at a commit
// (two rows updated by two transactions, the later one visible first). Transactions that share
// a row still commit in the source's order. What is acknowledged to the source is still the
// contiguous prefix of transactions committed, and durable, on the target: never a position
// past a transaction the target does not have.
//
// A worker that commits records, in the same target transaction, its row of the ahead table
// (the progress table's name with "_ahead", created next to it when a relaxed session starts:
// slot, worker, system_id, end_lsn, spans): the prefix it knew when it sent the commit, and the
// transactions it committed past that prefix, as spans of end LSNs (a run is one span), this one
// included; each of its commits rewrites the row and drops the spans the prefix passed. The
// progress row itself is written as before by the transactions that commit in order and when
// the stream goes idle. A session, in any mode, reads the slot's rows when it starts: it resumes
// from the highest of the progress row's position and of the rows' prefixes (every commit a
// row's prefix counts returned before the row's commit was sent, so it is earlier in the WAL and
// survived whatever crash the row survived), and it does not apply again the transactions the
// stream hands out that end inside a span past that position; it counts them as applied with
// nothing to apply. It then folds the rows into one, with the progress row moved forward, in one
// target transaction. A SIGKILL of the Applier or a crash of the target at any moment thus
// neither loses nor repeats a transaction, and a restart in another mode or commit order (a
// session that skips with Config.SkipLSN runs as Buffered) honours the rows too. Rows of a slot
// that has no progress row are deleted (the row was deleted to copy again); a relaxed session
// writes the progress row first when the slot has none. Applier.Uninstall with Progress deletes
// the slot's rows and drops the table once empty. Stats.CommittedAhead counts the commits made
// ahead of an earlier transaction.
//
// # Modes
//
// Buffered (the default) applies each transaction whole at its commit, in commit order; the
// reorder buffer holds large transactions in memory up to Config.Source.Buffer.WorkMem and on disk
// beyond. Transactions already received are applied together, set-based (a few statements per
// table of their net effect, checked row by row), in one target transaction with the progress row
// of the last: a backlog takes a round trip per group of up to 1024 transactions, and once caught
// up a transaction commits alone within a millisecond. A change that meets a conflict, or a
// statement that fails, goes again one statement each, so that conflicts are handled and errors
// named per change.
//
// Eager applies a large transaction the server streams while it is still running on the source,
// on a worker connection of its own (savepoints for its subtransactions, rolled back with them),
// committing it in order; the other transactions as Buffered does. A worker reads each part
// where the reorder buffer holds it, in memory or in its spill file; a part past the worker's
// share of WorkMem is copied into its queue. The queues and the reorder buffer share WorkMem
// (reorderbuffer.Memory), each using what the other leaves, and spill to disk past it.
//
// Parallel is Eager plus committed transactions applied by several workers at once, in runs, each
// run waiting before a change for any earlier run in flight that touched the same row (relation
// and replica identity key). A transaction whose rows cannot be told apart by a key (UPDATE or
// DELETE of a keyless table), a TRUNCATE, or a table whose triggers fire on the target is applied
// alone. Lock waits between the Applier's own connections that the target cannot see are broken by
// a watchdog, which applies the later transaction alone.
//
// Which mode, for which machine and workload (BENCHMARKS.md in the repository has the figures,
// all measured where the source, the target and the Applier share 2 cores):
//
//   - Buffered, the default, spends the least CPU per transaction: its groups cost the target a
//     round trip and a commit per group rather than per transaction (0.65–0.9× the CPU of
//     PostgreSQL's subscriber on pgbench's workloads at scale 100, 0.8–1.1× on smaller tables).
//     Pick it where cores are few or shared, and wherever the other two have not been measured to
//     win.
//   - Eager, where transactions larger than the source's logical_decoding_work_mem must commit
//     soon after their source commit: synchronous replication, or a lag bound. It applies them as
//     they stream, so their commit waits for the last part only (0.55–0.74× the time of
//     PostgreSQL's streaming = parallel on 2 cores, with less than half its subscriber-side
//     CPU); everything else goes as in Buffered. Where the source's walsender is short of CPU
//     (it shares the cores, and sends over TCP), the walsender sets the pace and the lead goes.
//   - Parallel, where the target has cores to spare beyond those of the Applier's one reader and
//     the source's walsender, and transactions seldom touch the same rows. On 2 cores it catches
//     up in 0.77–1.03× of PostgreSQL's time with 8 workers but spends more CPU than Buffered (the
//     hand-offs between the reader and its workers): it buys speed with cores. The reader (the
//     stream, the reorder buffer, the dispatch) is one goroutine and the walsender one process,
//     so throughput stops growing once the workers outpace them. CommitRelaxed takes it further
//     where the target may show transactions committed out of the source's order.
//
// docs/apply.md in the repository says in full how each mode applies, and how the changes go to
// the target (COPY, prepared statements, set statements, REPLICA IDENTITY FULL, identity columns).
//
// # Conflicts
//
// A change that does not fit the target's rows is a conflict, detected and named as PostgreSQL's
// subscriber does (insert_exists, update_exists, multiple_unique_conflicts, update_missing,
// update_deleted, delete_missing, update_origin_differs, delete_origin_differs; see conflict.Type),
// resolved as conflict.Config says (by default as PostgreSQL: the *_exists ones stop Run with an
// *ApplyError wrapping ErrConflict, missing rows are skipped, rows another origin changed are
// overwritten; or skip, apply_remote, last_update_wins), logged in PostgreSQL's words, counted in
// Stats, and optionally recorded in a conflict log table. The checks cost no round trip when
// nothing conflicts: rows are looked up only for statements that met a conflict. Config.Origin
// marks the applied transactions with a replication origin, which lets the target tell the
// Applier's rows from others' (with track_commit_timestamp) and lets a reverse replication leave
// them out (Config.Source.OriginFilter replication.OriginFilterNone): two databases can replicate into
// each other. conflict.Config.Retention turns on update_deleted detection, from a bounded record of
// the target's local deletions rather than retained dead tuples; Applier.Uninstall removes that
// record (and, as asked, the slot's progress and the origins) from the target.
//
// # Monitoring
//
// Stats counts what was applied (InsertsViaCopy the inserts sent with COPY, InitialCopyRows the
// initial copy's rows, apart from Inserts). Progress, Activity, BufferStats and Reconnects report
// the replication streams of the sessions, as replication.Stream's methods of those names do,
// also between sessions: the Applier is a metrics.Source, so metrics.Serve(addr, applier, opts)
// serves its lag in bytes (source WAL received past what the target holds durably and was
// acknowledged) and in time (from the source commit time of the last transaction committed on
// the target; 0 while caught up). All of them may be called from any goroutine at any time.
//
// # Session settings
//
// Every connection to the target pins, whatever ALTER DATABASE, ALTER ROLE or the connection
// string say, the settings that change how the SQL and the values it sends are read
// (standard_conforming_strings on, client_encoding UTF8, DateStyle ISO, search_path pg_catalog,
// pg_temp and others) and those that could end a session it keeps open (statement_timeout,
// lock_timeout, idle_in_transaction_session_timeout, idle_session_timeout and, on 17+,
// transaction_timeout, all 0). As in PostgreSQL's own apply worker, the search_path finds no
// user schema: triggers enabled ALWAYS or REPLICA on target tables, and the functions of
// defaults and constraints, must name their objects with their schema (or set search_path on
// the function). Table names of the configuration without a schema are resolved once, when the
// connection opens, in the user's own search_path. The connections to the source pin
// standard_conforming_strings, the same search_path and the timeouts too.
//
// # Errors and retries
//
// Run retries, from the progress row and with a growing delay, whatever starting again can cure:
// lost connections to either server (including a session the server ended: FATAL, 57P05), server
// shutdowns and restarts, deadlocks, serialization failures, resource shortages. A slot that
// another session holds (the walsender or target connections of one that died, which end when the
// server notices; or a second Applier of the slot, which does not) is waited for up to
// Config.SlotWait, naming the holder at once, and then stops Run with a *SlotInUseError (target) or
// *replication.SlotActiveError (source). It stops with an error for what it cannot cure: an
// *ApplyError for a change the target refuses when applied alone, in order (ErrMissingTable,
// ErrSchemaMismatch, ErrNoReplicaIdentity, ErrPermission, ErrConstraint, ErrData), naming the
// table, the column when the target says which value it refused, the source transaction and its
// commit LSN (never the statements the Applier generates); a conflict resolved as an error also
// names the resolutions that get past it; bad configuration (ErrInvalidConfig, the replication
// package's option errors, and its failed pre-flight checks, *replication.CheckError: wal_level, a
// missing publication, a slot made by another plugin, and so on); a progress row that does not fit
// the source (ErrSourceChanged, ErrSlotAhead: see above); and corrupt or lost data reported by the
// reorder buffer. Nothing at or after a refused transaction is acknowledged, so a new Run, once the
// cause is fixed, resumes with it, or skips it with Config.SkipLSN set to the commit LSN the error
// names. A change refused while applied concurrently with earlier transactions (Eager, Parallel) is
// first retried alone. The decision is the library's one rule (the errors state their behaviour,
// and an error that states none, of a kind nobody classified, stops Run rather than being retried
// for ever), and the delay its one backoff: from 200ms, doubling up to 30s, with ±20% jitter, back
// to 200ms after a session that applied a transaction or ran for a minute. Until a session has
// reached both servers, connection failures are retried only within Config.StartTimeout (30s by
// default) from the start of Run: a wrong host or port then stops Run with ErrNotStarted, naming
// the side, instead of being retried for ever.
//
// # Migrations
//
// Config.SchemaChanges = SchemaAddColumns creates the published tables the target lacks, from the
// source's catalog: the published columns in the source's order, each with the source's type
// (schema, name and type modifier, looked up on the target by schema and name: numeric(10,2),
// text[] and timestamptz(3) come as they are, an enum, domain or extension's type must exist there)
// and NOT NULL, and the primary key when every one of its columns is published. Nothing else: no
// default, identity, check, unique or foreign key constraint, other index, trigger, collation,
// storage option or partitioning. The table goes into the schema of the source's name, which must
// exist on the target: a schema or a type the target lacks stops Run with a *MissingTablesError
// naming each table that cannot be created and why (none is created then). The tables are created
// on connections outside any applied transaction (each statement commits on its own), before the
// initial copy, when a session starts streaming (a table added to the publications too, before it
// is copied), and, with NewTablesStream, for a table that first appears in the stream, before its
// first change is applied; each is logged and counted in Stats.TablesCreated. It also adds to a
// target table a column the source added, with the source catalog's type (format_type, typmod
// included; a user-defined type must exist on the target by schema and name), nullable and without
// default, in the target transaction of the first change that needs it; columns dropped or renamed
// on the source are logged, counted in Stats.SourceColumnsGone and kept on the target. Without it,
// a missing table stops Run (a *MissingTablesError when a session starts; with NewTablesStream, an
// *ApplyError wrapping ErrMissingTable for a table that first appears in the stream), and a missing
// column with an *ApplyError wrapping ErrSchemaMismatch; each names the table, the column if any,
// and the option. Config.SkipLSN skips the one source transaction with that commit LSN, as ALTER
// SUBSCRIPTION ... SKIP does, and records it in the progress row (see the field).
// Config.SyncSequences (and Applier.SyncSequences) copies the values of the sequences owned by the
// published tables' columns forward to the target; Config.UntilCaughtUp makes Run return nil once
// it has applied and acknowledged everything up to the source's WAL position when it started.
// docs/migrations.md in the repository describes a cut-over with them.
//
// # Layout
//
// Package apply is the public API (Applier, Config, the errors and Stats) and each session's
// setup: the fence, the progress row, conflict detection and origins, the tables' check, then the
// changefeed.Feed that runs the session. Beneath it, internal packages apply the stream in each
// mode, schedule the workers, write the initial copy, follow the source's schema and send every
// statement to the target; docs/architecture.md in the repository describes each, and the
// imports between them. Package apply/conflict, public, holds the conflict types, resolutions
// and reports, and depends on nothing of apply.
package apply
