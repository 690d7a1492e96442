// Package replication runs a logical replication connection (pgoutput) and feeds the reorder
// buffer. It is the only package of pgreorder that speaks the replication protocol.
//
// Start connects with replication=database, runs IDENTIFY_SYSTEM and the pre-flight checks,
// creates the slot when asked (temporary or permanent, with two-phase decoding), and sends
// START_REPLICATION with the highest pgoutput protocol the server speaks (1 below PostgreSQL 14,
// 2 on 14, 3 on 15, 4 on 16+) and the best streaming mode it supports ("parallel" on 16+, "on"
// on 14 and 15), unless Config says otherwise. Config.Negotiate shows exactly what will be sent.
// Stream.Next then returns committed transactions in commit order; the consumer acknowledges
// each with Stream.Ack once it has handled it for good.
//
// Connect and Conn split Start in steps, for an initial copy of the tables (see below).
//
// # Pre-flight checks
//
// Before streaming, the connection checks what would otherwise fail late or, worse, silently:
// wal_level is logical; every publication exists in the database (PostgreSQL 18 only warns
// about a missing one, then confirms the slot with nothing sent); the slot exists (or CreateSlot
// is set), is a logical pgoutput slot of this database with its WAL still there, and has
// two-phase decoding exactly when Config.TwoPhase asks for it, and has not been invalidated
// (pg_replication_slots.invalidation_reason, PostgreSQL 17+); when a slot is created, one is
// free under max_replication_slots; a walsender is free under max_wal_senders; the resume
// position (Config.Buffer.SkipThrough) is not beyond the server's current WAL position. A
// failure is a *CheckError that names the setting and says how to fix it. What each publication
// publishes is logged.
//
// # Session settings
//
// pgoutput formats text values with the settings of the walsender's session, so a server or role
// configured with DateStyle = 'SQL, DMY' would send the date 2024-03-04 as 04/03/2024. Like
// PostgreSQL's own subscriber, every connection pins DateStyle ISO, IntervalStyle postgres and
// extra_float_digits 3 (floating-point values that read back exactly), and client_encoding UTF8,
// whatever postgresql.conf, ALTER ROLE/DATABASE SET or the connection string say; and, so that
// the SQL it sends reads as meant and no timeout ends the session, standard_conforming_strings
// on, search_path pg_catalog, pg_temp, statement_timeout, idle_in_transaction_session_timeout
// and idle_session_timeout 0. Server notices
// (such as PostgreSQL 18's warning about a publication that does not exist yet at a point of the
// WAL) are logged at Warn.
//
// # Acknowledgements and the flush position
//
// The standby status updates sent to the server carry
//
//   - write = the highest position received (XLogData and keepalive messages);
//   - flush = apply = the acknowledged prefix: the highest EndLSN such that it and every
//     transaction handed out before it were acknowledged, held back to the PREPARE of a
//     prepared transaction that is not acknowledged yet (the server sends it again after a
//     restart only while the confirmed position is before its PREPARE); when nothing is pending,
//     the position of the last keepalive, so that an idle slot does not pin WAL (with
//     Config.Buffer.HandOutAdvances, only once the consumer acknowledged it: see Idle advances).
//
// The flush position is never past what was received (a resume position the server never sent
// is not a position to confirm), never below the slot's confirmed position, and never decreases.
// It never passes a transaction the consumer has not acknowledged: the server skips every
// transaction that commits before the confirmed position, so that would lose it.
//
// Updates are sent at least every Config.StatusInterval (10s, or a quarter of the server's
// wal_sender_timeout if that is shorter), on SendStatus, on Close, and in reply to a keepalive
// that asks for one. A reply whose flush position would be behind the keepalive's position
// carries no flush position at all (which never confirms anything): a walsender that stops
// because the server shuts down asks for replies until the flush position, or else the write
// position, reaches what it sent, and would otherwise keep the shutdown waiting for
// acknowledgements.
//
// # Resuming
//
// Streaming always starts at the slot's own confirmed position (START_REPLICATION ... 0/0): the
// server sends again everything that commits after it, including the PREPARE of a prepared
// transaction not acknowledged before. The consumer's durable position is
// Config.Buffer.SkipThrough, a filter: the buffer drops every transaction that ends at or before
// it. Starting at the consumer's position instead would make the server skip a PREPARE that
// lies before it and send a bare COMMIT PREPARED: the transaction's changes would be lost.
//
// The position to persist, and to pass as SkipThrough when starting again, is the acknowledged
// prefix, Position().Acked (once everything acknowledged is durable on the consumer's side), not
// the highest acknowledged EndLSN: with acknowledgements out of order, a transaction before it
// may not be handled yet. Consumers that write the EndLSN of each transaction together with its
// effects (a progress row in the same target transaction) persist exactly that.
//
// A SkipThrough beyond the server's current WAL position is refused (ErrResumeAhead): it cannot
// come from this server, and it would make the slot skip everything up to it. A SkipThrough
// behind the slot's confirmed position means that the transactions that committed in between are
// not sent again. Without Config.Buffer.HandOutAdvances that is logged at Warn: it is harmless
// when the consumer had them, which is the usual case after the slot advanced over WAL in which
// nothing was published, and the stream cannot tell. With it, StartStreaming refuses it
// (ErrSlotAhead): see below.
//
// Positions belong to one database system: a rebuilt server, or another one with a slot of the
// same name, sends different transactions at the same LSNs. Store System().ID (and Timeline) with
// the position and compare them when starting again; a Stream that reconnects to another system
// fails with ErrSystemChanged. A promoted physical standby is the same system on a later
// timeline: its positions continue the former primary's.
//
// # Failover
//
// PostgreSQL 17 and later keep a logical slot on a physical standby when the slot has failover
// enabled and the standby synchronizes slots (sync_replication_slots, hot_standby_feedback,
// primary_slot_name, dbname in primary_conninfo); the primary's synchronized_standby_slots makes
// its logical walsenders wait until the standbys listed there have the WAL they send, so that a
// consumer never has a change the promoted standby lacks. With Config.Failover a created slot is
// created with failover (CREATE_REPLICATION_SLOT ... FAILOVER) and an existing one altered to it
// (ALTER_REPLICATION_SLOT, logged once); servers before 17 refuse it with a *ConfigError. On
// connecting, the stream warns of what the primary lacks for the slot to survive a promotion (no
// synchronized_standby_slots, a slot listed there that no standby streams through), and says
// nothing of missing standbys on a promoted standby, whose new standbys may come later.
//
// When the primary fails and a standby is promoted, a Stream whose connection string names both
// servers (host=a,b port=..., target_session_attrs=read-write) reconnects to the promoted one: the
// same system on a later timeline, with the standby's copy of the slot. That copy may be confirmed
// less far than the former primary's slot was: the server then sends again transactions the
// consumer already had, which the reorder buffer drops as it does after any reconnection, and
// Config.Buffer.SkipThrough does after a restart. A slot that was not created for failover does
// not exist on the promoted standby: the stream ends with a *CheckError wrapping ErrSlotNotFound
// that says so and names Config.Failover; the changes the consumer had not received are lost
// with it, and it starts again from a copy.
//
// # Idle advances
//
// With Config.Buffer.HandOutAdvances, the slot's confirmed position never passes what the consumer
// acknowledged. When nothing is pending at the time of a status update (at most once per
// StatusInterval), Next hands out a reorderbuffer.Advance entry instead: the server has sent
// everything up to its EndLSN and nothing published is pending. The consumer persists EndLSN as its
// position, as it would a transaction's, and acknowledges the entry; the following status update
// confirms it. The consumer's persisted position is then never behind the slot in normal operation,
// so a slot found ahead of it after a restart means that acknowledged transactions were lost (the
// consumer acknowledged before its data was durable, or its storage was restored from an older
// backup). StartStreaming then returns a *CheckError wrapping ErrSlotAhead instead of streaming;
// to continue anyway, accepting the loss, start with SkipThrough 0 (the server only sends what
// follows the slot's position in any case).
//
// # While the consumer works
//
// A goroutine sends status updates every StatusInterval while the consumer is outside Next, for
// instance applying one very large transaction: the server's wal_sender_timeout (60s by default)
// would otherwise end the connection. It only ever reports acknowledged positions. It stops with
// Close.
//
// # Reconnecting
//
// When the connection is lost (network error, walsender terminated, server restarted, stream
// ended by a shutdown, slot still held by the walsender of the previous connection), Next
// connects again with backoff (Config.Reconnect: from 100ms, doubling up to 30s, with jitter,
// for as long as Next's context allows unless MaxAttempts is set), running the pre-flight checks
// and Config.BeforeConnect again, and streams from the slot's confirmed position. The reorder
// buffer is kept: transactions complete before the loss (queued, handed out, or prepared and
// held) stay, those being received are dropped (the server sends them again from their start),
// and those the server sends again after having handed them out are dropped. The consumer's
// Next just continues, without duplicates or gaps. Reconnections are logged and counted
// (Reconnects).
//
// Errors that reconnecting cannot cure end the stream: configuration errors, pre-flight checks,
// protocol errors, data loss reported by the reorder buffer, and server errors outside the
// connection, resource and operator-intervention classes, and errors nobody classified (see
// Retryable: the errors state their behaviour, by the library's one rule). A temporary slot dies
// with its connection, so a stream on one does not reconnect. With Config.Reconnect.Disabled,
// every error ends the stream and the consumer may use Retryable to decide to Start again. Start
// itself retries only while the slot is in use (ErrSlotActive); other errors are returned at
// once. A slot in use is retried, by Start and by reconnections, for Config.Reconnect.SlotWait
// (DefaultSlotWait, 90s, by default): the first refusal is logged at Warn with the connection
// that holds it (pid, application_name, client), and the *SlotActiveError, naming it too, is
// returned once the wait is over.
//
// # Connections
//
// Config.ConnString is a libpq connection string; Config.ConnConfig is a *pgconn.Config made by
// pgconn.ParseConfig and adjusted by the application (TLS, a DialFunc for tunnels, fallbacks,
// hooks). Config.BeforeConnect runs before every connection attempt on a fresh copy of it, so it
// can set a password that expires, such as an IAM authentication token. The copy gets
// replication=database, the pinned settings, application_name "pgreorder" unless one is set, a
// notice logger (calling the configured OnNotice too) and a context watcher that ends waits with
// a deadline, never with a cancel request (which would reach the walsender).
//
// Once streaming, the stream reads the socket itself rather than through pgconn: as much as it
// holds, up to 256 KiB, in one read into a buffer it reuses, messages handed to the reorder buffer
// in place (which copies what it keeps, the only copy), and a read deadline set once per status
// interval rather than a context watched for every message. Next's context, and Close, end a
// waiting read by moving that deadline into the past. Notices and errors the server sends while
// streaming still reach the connection's OnNotice and OnPgError.
//
// # Initial copy
//
// To copy the published tables and then stream exactly what follows, create the slot with an
// exported snapshot on a Conn, copy in that snapshot from other connections, then stream on the
// same Conn:
//
//	conn, err := replication.Connect(ctx, cfg)
//	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
//	// other connections: BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '<snap.Name>';
//	// copy the tables; COMMIT
//	stream, err := conn.StartStreaming(ctx)
//
// The copy sees every transaction committed before snap.ConsistentPoint and none after; the
// stream sends those after it. The snapshot lives until StartStreaming or Close, so the copy must
// have started (SET TRANSACTION SNAPSHOT) before either.
//
// # Concurrency and buffers
//
// Next, SendStatus and Close are the consumer's: one call at a time. Ack, Position, Stats,
// Activity, Reconnects and Negotiated may be called from any goroutine at any time, including
// while Next runs and while the consumer reads a transaction's changes; Close may be called from
// another goroutine to stop a waiting Next (which returns ErrClosed). The stream keeps the reorder
// buffer under one lock, never held while it waits for the network; a transaction Next returned
// owns what reading it needs, so reading it takes no lock and blocks neither acknowledgements nor
// status updates. A transaction returned by
// Next, and the messages its Changes iterator yields, are valid until the next call to Next or
// Close; copy what must outlive that. Its fields (EndLSN...) stay valid, and it may be
// acknowledged later.
//
// # Monitoring
//
// Position, Stats, Activity and Reconnects are what package metrics reads. The reorder buffer has
// no clock, so the stream records the times monitoring needs (Activity): when each transaction
// was handed out (for the age of the oldest one not acknowledged), the commit time of the last
// one, and whether the stream is caught up with the server, which a keepalive that asks for no
// reply tells: the walsender sends one when it has sent everything it decoded. Stats is the
// buffer's own, current at any time, also while the consumer reads a transaction.
package replication
