// Package snapshot makes the initial copy of the published tables for a logical replication
// consumer: it reads them in the snapshot that a new slot exports, in parallel over several
// normal connections, and hands their rows out through the same typed-change interface as the
// stream's. The copy followed by the slot's stream holds every committed change exactly once:
// the copy sees every transaction that committed before the slot's consistent point and none
// after it, and the stream sends exactly those that commit at or after it.
//
// # Usage
//
//	conn, err := replication.Connect(ctx, rcfg)                 // rcfg.Slot must not exist yet
//	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
//	sess, err := snapshot.Open(ctx, snapshot.Config{ConnString: dsn, Publications: rcfg.Publications}, snap)
//	stream, err := conn.StartStreaming(ctx)                     // allowed once Open has returned
//	res, err := sess.Run(ctx, func(ctx context.Context, c *snapshot.Chunk) error {
//		dec := pgvalue.NewDecoder(nil)                           // one per call: Run calls in parallel
//		for ch, err := range dec.Changes(c) {                   // ch.Op is decoding.MsgInsert
//			// apply ch.New as an insert into c.Table
//		}
//		return nil
//	})
//	sess.Close(ctx)
//	for { txn, err := stream.Next(ctx); ... }                   // only after Run returned nil
//
// Copy does Open, Run and Close in one call, for callers that start streaming afterwards.
//
// # The snapshot's lifetime
//
// The server exports the snapshot for as long as the replication connection that created the
// slot stays open and runs no other command: StartStreaming and Close end it. A transaction
// that has imported it (SET TRANSACTION SNAPSHOT) keeps it until the transaction ends,
// whatever the exporting connection does next. So:
//
//   - between CreateSlot and the return of Open, the replication connection must stay open and
//     idle: Open imports the snapshot on every worker connection before it returns (it fails
//     with ErrSnapshotNotExported otherwise);
//   - once Open has returned without error, StartStreaming may be called at any time: right
//     away (recommended for a long copy: the walsender otherwise waits "idle in transaction" for
//     the whole copy, exposed to idle_in_transaction_session_timeout, while the Stream keeps the
//     connection alive with status updates), or after Run;
//   - the stream's transactions must be applied after every copied row: call Stream.Next only
//     once Run has returned nil and its rows are applied.
//
// If Open fails, the snapshot is still exported (unless the replication connection moved on)
// and Open can be tried again. If Run fails, what was applied is incomplete: if StartStreaming
// has not been called, Open the same snapshot again (copying, with Config.Tables, only the
// tables not applied whole); otherwise drop the slot, discard the copy and start over with a
// new slot. A consumer that persists its state should record the end of the copy durably, with
// the slot's consistent point, before acknowledging streamed transactions.
//
// # What is copied
//
// Open lists the tables of Config.Publications with pg_publication_tables, the way the stream
// publishes them: with the publications' column lists and row filters (PostgreSQL 15+; row
// filters of several publications are joined with OR, and no filter wins over any; different
// column lists are ErrColumnLists, as the server refuses them too), partitions under their
// root when a publication says publish_via_partition_root (the partitions are read, the rows
// delivered as the root's), each partition as a table of its own otherwise, inheritance
// children as tables of their own, generated columns only where pgoutput sends them (stored
// generated columns on PostgreSQL 18 with publish_generated_columns). Table.Relation describes
// each table exactly as the stream's Relation message does (its RelationID is the table's OID),
// and Chunk.Type its non-built-in types as the Type messages do.
//
// pg_publication_tables reflects the catalog as it is, not as it was at the consistent point,
// so Open checks that no publication of Config.Publications was created, altered or dropped
// since (ErrPublicationChanged: drop the slot and start again). A table created after the
// consistent point (in a FOR ALL TABLES or TABLES IN SCHEMA publication) is not copied: the
// stream carries all its rows. Open then takes an ACCESS SHARE lock on every table, on every
// worker, held until Close, so that no TRUNCATE, ALTER TABLE or VACUUM FULL runs under the copy
// (they wait for it; one already waiting when a worker after the first asks for its locks makes
// Open fail after 10s with lock_not_available rather than wait forever); one that ran
// between the slot's creation and Open, such as a TRUNCATE (not MVCC-safe) is not detected.
//
// # Chunks and workers
//
// Each worker is a normal connection with a REPEATABLE READ READ ONLY transaction in the
// snapshot; Open uses at most Config.Workers of them, no more than there are chunks. A table
// (or partition) larger than Config.ChunkSize is split in ranges of its pages, read with
// COPY (SELECT ... WHERE ctid >= '(lo,0)' AND ctid < '(hi,0)') TO STDOUT, which PostgreSQL 14
// and later serve with a TID range scan; the last range is open-ended. In one snapshot every
// row the snapshot sees has one ctid, so the ranges hold each row exactly once, however the
// table changes meanwhile. Chunks are handed to the workers largest table first.
//
// # Rows
//
// A Chunk is a pgvalue.Source: a pgvalue.Decoder resolves its rows into pgvalue.Change values
// with Op decoding.MsgInsert, so a consumer handles a copied ("read") row with the code that
// handles a streamed insert; it knows it is a read because it comes from a Chunk. Column
// values are in the format the stream uses: PostgreSQL's text output (COPY's text format,
// unescaped), or with Config.Binary the types' send format (COPY's binary format), a column
// whose type has no send function in the text format, as pgoutput does. The connections pin
// the session settings that text output depends on to those of the replication connection
// (DateStyle ISO, IntervalStyle postgres, extra_float_digits 3, client_encoding UTF8), so a
// value reads the same copied or streamed, byte for byte. TimeZone is left as configured. They
// pin as well what the SQL they send relies on (standard_conforming_strings on, search_path
// pg_catalog, pg_temp) and turn off the timeouts that would end a long copy
// (statement_timeout, idle_in_transaction_session_timeout, idle_session_timeout and, on 17+,
// transaction_timeout).
//
// # Tables added later
//
// A table added to a publication while the stream runs appears in the stream from then on, but
// its existing rows never do. SyncTables copies it in a snapshot of its own, from a temporary
// slot; the consumer applies those rows, and from then on skips the streamed changes the
// Result Covers: those of the table in transactions that committed before the sync's
// consistent point, which the copy holds already. A consumer can call it when the stream
// shows a relation that no Result has Copied.
//
// # Errors and cancellation
//
// Configuration errors wrap ErrInvalidConfig; the snapshot's and the publications' problems
// have their sentinels; a failure while copying a chunk (the server's *pgconn.PgError, a
// *FormatError, the handler's own error, ErrNotConsumed, the context's) is a *ChunkError that
// names the table and wraps the cause. The first failure stops every worker: their COPY is
// interrupted and Run returns once all have stopped. Cancelling Run's context, or calling Close
// from another goroutine, does the same. Run returns the failure that stopped the copy, never a
// cancellation that followed it: an error that is context.Canceled (what a stopped worker
// returns, or a handler whose shared work another chunk's failure ended) gives way to any other
// error a worker returns, whichever came first. A handler that returns without reading its
// chunk once the copy is stopped is stopped too: its ErrNotConsumed comes with the context's
// error.
//
// # Concurrency and buffers
//
// Run calls the Handler from its worker goroutines at once, one chunk each: the handler must
// be safe for concurrent use, and keep per-worker state (a pgvalue.Decoder, a target
// connection) by Chunk.Worker or per call. The rows of a chunk are read from the server while
// the handler ranges over Chunk.Changes: the message, its tuple and the Data of its columns
// alias the connection's buffers and are valid until the next iteration step; copy what must
// last longer (pgvalue's Column.Value copies). Session.Close may be called from any goroutine,
// but not from a handler.
package snapshot
