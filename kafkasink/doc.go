// Package kafkasink writes a PostgreSQL change feed to Apache Kafka, exactly once for consumers
// that read committed, each source transaction atomically visible.
//
//	sink, err := kafkasink.Open(kafkasink.Config{Brokers: []string{"localhost:9092"}})
//	err = changefeed.Run(ctx, changefeed.Config{Replication: replication.Config{
//		ConnString: dsn, Slot: "cdc", Publications: []string{"pub"}}}, sink, sink.Handle)
//
// A Sink is a changefeed.Store whose units of work are Kafka transactions, and Handle is the
// changefeed.Handler that produces a batch's events into the unit's transaction.
//
// # Records
//
// The records are those Debezium's PostgreSQL connector writes for the same changes (its tests
// compare them with Debezium's own, field for field, and through Kafka Connect). Each row change
// is one record on topic PREFIX.SCHEMA.TABLE (Config.TopicPrefix; characters a topic name cannot
// hold become '_'; Config.TopicMap names other topics), whose value is the change event of the
// debezium format of package format (docs/formats.md) and whose key is the row's primary key
// columns as a JSON object of typed values ({"id":1}), whatever the replica identity; without a
// primary key, a unique index's of NOT NULL columns; for a table with neither, a null key. The
// key of a create or update is the new row's, of a delete the old row's, so that Kafka's default
// partitioner keeps every change of a key in one partition, in commit order. A change of key is a
// delete of the old key (its header format.HeaderNewKey names the new key) and a create of the new
// one (format.HeaderOldKey). A TRUNCATE is one event per table with a null key; a logical
// decoding message is an "m" event on PREFIX.message with key {"prefix":"…"}; rows of the initial
// copy are "r" events (source.snapshot "true", source.lsn the snapshot's). With Config.Tombstones,
// a delete is followed by a tombstone (the key and its headers, no value) where the table has a
// key. KeyFormat and ValueFormat FormatJSONSchema add the Kafka Connect schema to keys and values.
//
// Keys, NOT NULL columns (which Connect schemas mark required), defaults and enum labels come
// from the source's catalog: Config.Format.Tables, or, when it is nil, the changefeed's reader
// (changefeed.Batch.Catalog).
//
// Topic names that Kafka would take for one ('.' and '_' are the same character to it) or that
// are one (x."a.b" and "x.a".b) are refused with a *TopicCollisionError naming both tables: the
// Sink is a changefeed.TableChecker, so the published tables are checked before a slot is made
// (and before a stream resumes), against each other and against the topics the brokers hold;
// a table added to a publication later is checked at its first change, before anything of that
// transaction is visible.
//
// # Exactly once
//
// Every source transaction is in one Kafka transaction (transactional.id "pgreorder-SLOT")
// holding its events and, last, the source position (slot, end LSN, source system identifier) as
// a record keyed by the slot on the compacted offsets topic (PREFIX.offsets). Consecutive source
// transactions that the stream already holds share one Kafka transaction (the Sink is a
// changefeed.Grouper, within Config.Group), the position being the last one's end; one with
// nothing after it commits at once, alone. A source transaction is never split across Kafka
// transactions. Every source transaction of a Kafka transaction is acknowledged only after its
// commit returned, and a restart resumes after the last committed position: Load first initializes the transactional id, which fences any earlier
// producer of the slot and aborts its open transaction, then reads the offsets topic with
// read_committed. So a consumer with isolation.level=read_committed sees every committed source
// transaction exactly once, whole or not at all, and every change of a key in commit order,
// across crashes of pgreorder, of the brokers and of PostgreSQL. The initial copy is one Kafka
// transaction too, committed with the copy's end: a copy cut short leaves nothing visible.
//
// A second Sink of the same slot (or transactional id) fences the first: its next produce or
// commit fails with ErrFenced, and it stops without acknowledging anything more.
//
// The limits: a read_uncommitted consumer sees aborted events too (the events of a transaction
// that was being produced when pgreorder died, which its successor aborts and sends again).
// A transaction must be produced within Config.TransactionTimeout, which the brokers' cap
// (transaction.max.timeout.ms) bounds; the initial copy as a whole too. Events of one source
// transaction on several topics or partitions commit together, but a consumer reading several
// partitions interleaves them as it pleases: use source.lsn and transaction.id to group them.
// A killed pgreorder's open transaction holds back what read_committed consumers of its
// partitions see (the last stable offset) until the next Sink of the slot starts, which aborts
// it, or until the transaction timeout passes. Deleting or recreating the offsets topic loses
// the positions.
//
// A Kafka transaction costs a few round trips to the brokers, and one begun at once after the
// last waits for the brokers to finish writing its commit markers (tens of milliseconds): one
// Kafka transaction per source transaction (Group.MaxTransactions 1) takes a backlog of small
// transactions at tens per second; grouped, at thousands. A big transaction streams at the
// producer's speed. A group's events are written to the brokers while it is open, and become
// readable to read_committed consumers when it commits. A group stays open, while the next source
// transaction is there, for at most Group.CommitMultiple (4) times the recent duration of a Kafka
// commit, between Group.MinDelay (10ms) and Group.MaxDelay (250ms): under a steady load the first
// source transaction of a group becomes readable about five commits' time after it was handled,
// and in a backlog commits take about a fifth of the time.
//
// # Memory
//
// A source transaction is produced while it is read from the reorder buffer (which holds at most
// its WorkMem and spills the rest): the producer holds at most Config.MaxBufferedBytes and
// MaxBufferedRecords of records the brokers have not acknowledged, and waits for room; a
// transaction is never held whole.
//
// # Refusals
//
// A SASL password the brokers refuse, or a TLS certificate not trusted, is ErrAuthentication,
// met when the Sink first connects (Load), before anything is produced; an operation the
// brokers' ACLs deny is ErrAuthorization, whenever it is met: the open Kafka transaction is
// aborted and nothing of it is acknowledged. Both name the user.
//
// # Topics
//
// A missing topic is created with Config.Partitions and Config.ReplicationFactor (the offsets
// topic with one partition, compacted), or, with RequireTopics, refused (ErrTopicMissing). An
// offsets topic with more than one partition, or not compacted (its records would be deleted
// after retention, and with them the position), is refused with ErrInvalidConfig. An
// event larger than its topic's max.message.bytes stops the sink with ErrRecordTooLarge, naming
// the table, the key and the size: an event is never dropped.
package kafkasink
