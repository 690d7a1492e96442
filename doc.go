// Package pgreorder is the root of a reorder buffer for PostgreSQL logical replication: it
// reassembles the transactions pgoutput streams while they run (protocol 1 to 4, streaming on or
// parallel, optionally two-phase), drops what was rolled back, holds memory under a limit by
// spilling the largest transaction to disk, and hands back committed transactions in commit
// order with the position that is safe to confirm to the server. This package holds no code.
//
// Where to start:
//
//   - [github.com/pgreorder/pgreorder/changefeed] is a whole consumer in one call: the initial
//     copy of the published tables, then the stream, every batch through a handler, with a
//     durable position (a file, a table in the consumer's own transaction, or a store of one's
//     own) and a copy cut short started over.
//   - [github.com/pgreorder/pgreorder/replication] connects to a server, streams a slot into a
//     reorder buffer and sends the status updates: Start, then Next and Ack in a loop. Most
//     consumers need only this package.
//   - [github.com/pgreorder/pgreorder/reorderbuffer] is the buffer itself, for a program that
//     receives the stream on its own (Add each message, then Next, Changes and Ack); its
//     documentation states the contract: what comes out, the memory bound, acknowledgements
//     and restarts.
//   - [github.com/pgreorder/pgreorder/decoding] decodes pgoutput messages into typed structs;
//     the changes a transaction yields are of its types (Insert, Update, Delete, ...).
//   - [github.com/pgreorder/pgreorder/spill] and [github.com/pgreorder/pgreorder/heap] are the
//     disk logs and the pairing heap underneath the buffer.
//
// Around the buffer, each small and importing only downwards:
//
//   - [github.com/pgreorder/pgreorder/pgvalue]: typed column values (pgx's pgtype, text and
//     binary, enums and custom types), column names, keys, unchanged TOAST.
//   - [github.com/pgreorder/pgreorder/format]: JSON lines per transaction or Debezium-style
//     change events, and a durable, resumable output file.
//   - [github.com/pgreorder/pgreorder/snapshot]: the initial copy of the published tables in the
//     slot's exported snapshot, in parallel.
//   - [github.com/pgreorder/pgreorder/metrics]: lag in bytes and time, memory, spill and rates of
//     a stream, a consumer or an applier, as a struct and a Prometheus collector.
//   - [github.com/pgreorder/pgreorder/apply]: replication into PostgreSQL, exactly once, with
//     conflict detection and resolution as PostgreSQL names them.
//
// Two commands show it at work without writing code:
//
//	go run ./cmd/pgreorder demo     # a throwaway server, a large transaction with rolled-back savepoints, streamed
//	go run ./cmd/pgreorder stream -source DSN -slot NAME -publication NAME -create-slot   # a live slot as JSON lines
//
// The examples directory holds complete consumers (examples/changefeed copies, streams and
// resumes in 60 lines, examples/cdc-jsonl writes JSON lines, examples/apply-postgres applies
// into another database). docs/architecture.md describes the
// layers, the data path and the guarantees, and docs/try-it.md streams from a server started by
// hand.
package pgreorder
