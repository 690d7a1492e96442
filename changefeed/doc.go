// Package changefeed is a complete change data capture consumer in one call: the initial copy of
// the published tables, then the change stream from the copy's consistent point, with no gap and
// no overlap, every batch handed to a handler, and a durable position to resume from.
//
// The whole consumer (Example, and examples/changefeed, which is tested against real servers):
// the copy, the stream, each change printed with its table, column names and Go values, the
// position in a file, Prometheus metrics:
//
//	store, err := changefeed.OpenFile("cdc.pos") // slot, server, copy done, end LSN
//	if err != nil {
//		log.Fatal(err)
//	}
//	var mu sync.Mutex // the copy's chunks are handled by several workers at once
//	feed, err := changefeed.New(changefeed.Config{Replication: replication.Config{
//		ConnString: dsn, Slot: "cdc", Publications: []string{"orders"}}}, // text values: enums are strings
//		store, func(ctx context.Context, b *changefeed.Batch) error {
//			var out []byte
//			for ch, err := range pgvalue.NewDecoder(nil).Changes(b) { // copied rows are inserts
//				if err != nil {
//					return err
//				}
//				out = fmt.Appendf(out, "%s %s\n", b.Kind, ch) // "snapshot Insert public.orders"
//				for c := range ch.New.Columns() {
//					v, err := c.Value() // int32, string, time.Time, pgtype.Numeric...
//					if errors.Is(err, pgvalue.ErrUnchanged) {
//						continue // an unchanged TOASTed value: not sent
//					} else if err != nil {
//						return err
//					}
//					out = fmt.Appendf(out, "  %s = %T %v\n", c.Name, v, v)
//				}
//			}
//			mu.Lock()
//			defer mu.Unlock()
//			_, err := os.Stdout.Write(out)
//			return err // the position is stored, and the server told, only now
//		})
//	if err != nil {
//		log.Fatal(err)
//	}
//	srv, err := metrics.Serve("127.0.0.1:9187", feed, metrics.Options{}) // the stream's lag, memory...
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer srv.Close(ctx)
//	err = feed.Run(ctx) // until ctx ends (context.Canceled) or something fails
//
// # What Run does
//
// With no position stored for the slot, Run records in the store that a copy begins (after a
// Reset batch), creates the slot with an exported snapshot, copies the published tables in that
// snapshot in parallel (package snapshot: Config.Copy.Workers connections, large tables in
// chunks) through the handler as Snapshot batches, stores the slot's consistent point with
// CopyDone, and streams from there: every transaction that committed before the consistent
// point is in the copy, every later one in the stream, as Transaction batches, whole and in
// commit order. Once the copy is stored as done, every later Run resumes the stream after the
// stored position (after a Resume batch). Each of those is one attempt of Run: load the position,
// check the source against it, copy or resume, stream; when something fails that another attempt
// can cure, Run makes another from the stored position (see Retries below).
//
// A copy cut short (a crash, a kill, a lost connection, a handler error) is discarded and
// started over: the store still says that a copy began and did not finish, so the next attempt
// (of this Run after a lost connection, or the next Run after a crash) drops the slot it left
// (waiting for a dead process's walsender to let go of it), gives the handler a Reset, and copies
// again from a new slot. Copying again is simpler than resuming a copy: the
// snapshot is gone with the connection that exported it. A slot that exists while the store has
// no position for it was not made by this consumer: Run stops with ErrForeignSlot rather than
// drop it.
//
// With Config.Start set to StartStream, a run with no position stored does no copy: it streams
// the slot from where it is (creating it with Replication.CreateSlot), after a Reset batch, and
// stores that starting position at once; later runs resume as after a copy. That is `pgreorder
// stream`.
//
// InitialCopy is the same copy for consumers that keep their own records (package apply uses it),
// with the records behind the Copier interface.
//
// # Retries
//
// Run is the one loop that starts work over: a lost connection of the stream, of the copy or of
// the store, a server restart, a snapshot no longer exported, a handler's lost connection. The
// errors say what another attempt can cure (the library's one rule: replication.Retryable); Run
// waits, from Replication.Reconnect.MinDelay doubling up to MaxDelay with ±20% jitter (the
// shortest again after an attempt that got somewhere: it acknowledged something, finished the
// copy, or ran a minute), and makes the next attempt from the stored position. The streams it
// starts do not reconnect by themselves, so that no second loop runs underneath; users of
// replication.Stream on their own keep its reconnection. Reconnect.MaxAttempts bounds the
// failures in a row, and Reconnect.Disabled makes Run return the first failure. A slot that
// another connection holds is waited for within Reconnect.SlotWait, inside the attempt.
//
// The first start is bounded: until an attempt has reached both the store (its Load returned)
// and the source (a replication connection was made), Run retries within Config.StartTimeout
// (30s by default) and then stops with a *NotStartedError that names the side that could not be
// reached and the last error: a typo in a host or port stops a service where its manager sees
// it, while a server that is still starting is waited for. Once reached, Run retries for as long
// as ctx allows. A temporary slot is lost with its connection: Run stops then.
//
// A Follower that must prepare each attempt or hear how it ended is a Restarter: its Prepare runs
// before each attempt loads the position (and may change that attempt's reorder buffer
// settings); if it must know the source first, its Source's Identify makes the attempt's
// replication connection, which the attempt then streams on; and its Ended gets Run's account of the attempt (an Outcome), which it may change:
// the error, whether the attempt made progress, or that the next attempt starts at once because
// the Follower cured the cause itself. Package apply runs its sessions this way, one Feed for a
// whole Applier.Run.
//
// # Exactly once
//
// Run stores a position only after the handler returned nil for its batch, in the same unit of
// work of the store (Unit) that the batch was handled in, and acknowledges a transaction to the
// server only after its position is committed; it resumes with the stored position as
// replication.Config.Buffer.SkipThrough. So every committed change reaches the handler, and the
// handler's durable output holds each one exactly once, when the output commits together with the
// position:
//
//   - TableStore: the handler writes in Tx(b), the transaction the position commits in;
//   - JSONLines: a store and its handler in one, for JSON lines in a file (package format's txn
//     or Debezium events): its units flush and fsync the file before they store the position
//     with the file's length, and Resume cuts the file back to it;
//   - FileStore, or any store whose commit cannot include the handler's writes: the handler makes
//     its output durable before it returns, records with Batch.SetState what it needs to cut it
//     back (an output file's length), and cuts it back to Batch.State on Resume and to nothing on
//     Reset. A handler that does not gets every change at least once: a crash between its write
//     and the position's commit hands that transaction out again;
//   - SlotStore keeps nothing: the slot's confirmed position is the position, and a transaction
//     handled but not yet acknowledged when the consumer stopped comes again (at least once),
//     as an output that cannot be cut back (a terminal, a pipe) needs.
//
// # Grouping
//
// A unit of work covers one streamed transaction, unless the store is a Grouper (package
// kafkasink's Sink is; FileStore and TableStore are not: their commit per transaction is cheap
// enough). Then Run keeps the unit open while the stream already holds the next transaction
// complete (replication.Stream.Ready, which never waits for the server) and the store's Grouping
// allows (transactions, bytes of WAL, time): the handler gets each transaction as its own batch,
// in the same Unit, and the unit commits with the position of the last one, the end of the last
// transaction whose handler returned. A transaction is never split across units, and one with
// nothing after it commits at once, alone: a caught-up consumer waits for nothing. The group's
// transactions are acknowledged to the server only after the unit committed; a crash before
// undoes the unit whole, and a later run hands all of them out again. A store that groups
// therefore keeps the promise above, with "the unit the batch was handled in" shared by several
// batches.
//
// Copied chunks are not positions: their units commit without one, and the copy counts only once
// Run has stored CopyDone. Until then a restart discards it (Reset), so a handler whose output of
// copied rows is not removed on Reset holds them twice.
//
// The store also keeps the source's system identifier: a position stored for another server (a
// source rebuilt under the same name) is ErrSystemMismatch, and one beyond the server's WAL is
// replication.ErrResumeAhead, never a position to resume from. A promoted physical standby is the
// same system (on a later timeline): a position stored before the promotion resumes there, in
// every store, when the slot survived it (Config.Replication.Failover, PostgreSQL 17+: the
// stream then also continues on the promoted standby by itself, given a connection string that
// names both servers with target_session_attrs=read-write). A slot created without failover is
// missing there, and Run says so.
//
// # Tables added to the publication
//
// A table added to a publication while the Feed streams (ALTER PUBLICATION ... ADD TABLE, or a
// table created in a FOR ALL TABLES or TABLES IN SCHEMA publication) is copied too, when the Feed
// copies (StartCopy) and Config.NewTables is NewTablesCopy, the zero value. The Feed knows the
// tables whose rows the consumer holds (Position.Tables: those of the initial copy, and those
// added since); it sees a new one at the first Relation message of a table it does not know, or
// in its listing of the publications (Config.PublicationCheck) for a table that has no changes
// yet. From then on it drops that table's changes from the stream, and, on a goroutine of its
// own, while the stream goes on being handled and acknowledged, creates a temporary slot with an
// exported snapshot (its consistent point C) and opens the copy's connections in it. Then, at the
// first unit boundary at or past C (the position stored last, H), the stream waits: the Feed
// stores that the table's copy began at H (Position.Sync), hands the handler the table's rows as
// Snapshot batches with Batch.Table set (concurrently, by copy worker, as the initial copy's),
// then the table's changes of the transactions that end between C and H, read from the
// temporary slot, as Transaction batches with Batch.Table set (they hold that table's changes
// only, and end at or before positions already stored), and stores, in the same unit as those, H
// with the table known. The stream then goes on, with the table's changes of every transaction
// that ends after H. So the table's rows and changes reach the handler each once, whatever is
// written to it meanwhile. Creating the temporary slot waits for the transactions running on
// the source; under synchronous replication those wait for the Feed's acknowledgements, which is
// why the stream is never paused for it. While the table is copied, the stream waits (under
// synchronous replication, so do the source's commits), and the temporary slot's stream buffers
// what the source writes meanwhile (spilling to disk beyond Replication.Buffer.WorkMem), of
// which only the table's changes up to H are handed out. That stream has a reorder buffer of its
// own: while a table is copied, the Feed holds up to twice Replication.Buffer.WorkMem in memory
// (the main stream's buffer and the temporary slot's), and the rest on disk.
//
// A copy cut short (a crash, a handler's error) leaves Position.Sync stored: the next Run, after
// Resume, hands the handler a TableReset batch for that table (Batch.Table; its State is the one
// stored when the copy began) and copies the table again. The handler removes that table's rows
// (a TableStore handler deletes them in Tx(b)), or cuts its output back to State (JSONLines
// does); the Kafka sink has nothing to remove, its copy of the table committing whole with its
// end. A position stored by an earlier release lists no tables: the tables published when Run
// starts reading the stream are taken as known, so a table added while that release was stopped
// (or in the moment before) is not copied. SlotStore keeps nothing, and is used without a copy: a
// Feed on it tracks no tables.
//
// With NewTablesStream, the table's changes are delivered from then on and its rows from before
// are not (PostgreSQL's own behaviour without REFRESH PUBLICATION); the log names the table and
// the switch. A Feed with a Follower (package apply) takes up none of this: the Follower reads
// the stream, and the Feed logs the added tables at Warn.
//
// # Handler, concurrency and buffers
//
// Snapshot batches are handled concurrently, one per copy worker (Batch.Worker, Config.Copy.Workers,
// 4 by default): the handler must be safe for concurrent use, and keep per-worker state (a
// pgvalue.Decoder, which is not safe for concurrent use) by worker. Reset, Resume, TableReset
// and Transaction batches are handled one at a time, on Run's goroutine, never during the copy's
// chunks (of the initial copy, or of a table added to the publication). Copied rows are inserts (pgvalue.Change.Op is decoding.MsgInsert); Batch.Kind tells a
// copied row from a streamed insert.
//
// A batch and everything it holds (its messages, rows, column data) are valid until the handler
// returns, and its messages until the next iteration step; pgvalue's Column.Value copies. The
// handler keeps nothing else: a Batch is not to be used after the handler returned.
//
// # Consumers that read the stream themselves
//
// A consumer that needs more than one whole transaction at a time (one that applies a streamed
// transaction as its parts arrive, or several transactions at once) sets Config.Follower: Run
// still loads the position, checks the source against it, copies or resumes, and hands the
// Handler the Reset or Resume batch, but then gives the started stream to the Follower, which
// reads it, stores what it handled where its Store's Load finds it, and acknowledges only what
// it stored. Config.Copier likewise replaces the Snapshot batches with a Copier of the
// consumer's own (InitialCopy's interface), for a copy whose chunks need connections or
// records of its own. Package apply runs its sessions this way, each an attempt of one Feed (see
// Retries).
//
// # Monitoring
//
// A Feed (New) reads like a replication.Stream for package metrics: metrics.New(feed, ...)
// reports the stream's lag: zero values while the first copy runs. Each attempt has a stream and
// a reorder buffer of its own; the Feed's readings go on across them (counters summed, positions
// never going back, behind between attempts), and Reconnects counts the streams started again.
package changefeed
