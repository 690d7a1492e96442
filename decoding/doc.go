// Package decoding is a pure, defensive decoder and encoder for PostgreSQL's pgoutput logical
// replication protocol, versions 1 to 4: bytes in, typed messages out. It never does I/O, depends
// on the standard library only, and never panics, whatever the input.
//
// # Levels
//
//   - [ParseHeader] reads only the type byte and the few fixed fields a reorder buffer routes on
//     (the leading xid of an in-stream change, the xid of Begin, Stream Start, Stream Abort…). It is
//     stateless and does not allocate.
//   - [Parse] fully decodes one message into one of the message structs ([*Insert], [*Begin], …).
//     It is stateless: the caller says whether the message was inside a stream block, because
//     in-stream changes carry a leading xid that nothing in the message itself announces.
//   - [Parser] decodes like Parse but reuses the messages it returns for the bulk of a stream
//     (Insert, Update, Delete, Begin, Commit, Stream Commit), so that it does not allocate.
//   - [Decoder] owns the protocol state: whether a transaction (Begin…Commit or
//     Begin Prepare…Prepare) or a stream block (Stream Start…Stream Stop) is open, and for which
//     xid. [Decoder.Accept] validates a message against that state and the negotiated protocol
//     version, checks its whole structure and advances the state, without allocating;
//     [Decoder.Decode] does the same and also returns the decoded message.
//
// [Append] is the inverse of [Parse]: it encodes a message exactly as pgoutput does. All of them
// follow one description of each message's wire layout, so they accept and write the same bytes.
//
// # Buffer ownership
//
// A decoded message is a view of its input, not a copy. [Column.Data] and
// [LogicalMessage.Content] are sub-slices of the data passed to Parse, [Parser.Parse] or
// [Decoder.Decode]: they hold valid bytes only until the caller overwrites or reuses that
// buffer, which pgconn does on the next receive. A [Parser] reuses more: the *Insert, *Update,
// *Delete, *Begin, *Commit and *StreamCommit it returns, and their tuples, are overwritten by its
// next call. A message is valid only until then. To keep one longer, keep m.Clone() (or
// [CloneMessage](m), or [Tuple.Clone] for a row): an independent deep copy of the same type that
// shares no memory with the input or the Parser. Strings (names, GIDs, prefixes) are always
// copies; sub-slices have their capacity clipped, so appending to them never overwrites the
// input. [Decoder.Accept] and [ParseHeader] retain nothing; [Append] only reads its message.
//
// # Protocol state rules (Decoder)
//
// Each violation is a [*DecodeError] wrapping a sentinel that wraps [ErrProtocolViolation]:
//
//   - Stream Start inside a block: [ErrStreamStartInBlock]; inside Begin…Commit: [ErrBeginInTransaction].
//   - Stream Stop outside a block: [ErrStreamStopOutsideBlock].
//   - Insert, Update, Delete, Truncate, Relation, Type, Origin or a transactional Message outside
//     any transaction and block: [ErrChangeOutsideTransaction].
//   - Begin or Begin Prepare inside a transaction or a block: [ErrBeginInTransaction].
//   - Commit or Prepare outside a transaction, or not matching its opening message (Commit after
//     Begin Prepare, Prepare after Begin): [ErrCommitOutsideTransaction].
//   - Stream Commit, Stream Abort, Stream Prepare, Commit Prepared or Rollback Prepared inside a
//     block: [ErrFinishInBlock]; inside Begin…Commit: [ErrFinishInTransaction].
//   - A message type the negotiated [Options.ProtoVersion] does not have: [ErrVersion].
//
// Stream Abort outside a block is always accepted, on every protocol version: PostgreSQL 18 can
// send a Stream Abort for a top-level transaction that never had a Stream Start, even to a
// protocol-1 client that did not ask for streaming. The Decoder returns it like any other Stream
// Abort; a consumer that holds nothing for that xid treats it as a no-op.
//
// Non-transactional logical messages (pg_logical_emit_message(false, …)) are accepted anywhere. In
// PostgreSQL (pgoutput_message, ReorderBufferQueueMessage) they are sent as soon as they are
// decoded, outside any transaction or block, so in practice they arrive between transactions.
// pgoutput would write a leading xid if one were ever sent while a block is open (it tests only
// in_streaming), so inside a block the Decoder parses that xid.
//
// Within a block, Stream Start of a first segment may be followed by Origin; Begin and Begin
// Prepare likewise. The Decoder accepts Origin anywhere inside a transaction or block.
//
// On error the Decoder's state is unchanged, so a caller may log and skip the message.
//
// # Stream Abort fields of protocol 4
//
// With streaming = parallel the server appends abort_lsn and abort_time to Stream Abort. Nothing in
// the message says so; [Options.AbortInfo] chooses: [AbortInfoAuto] (the zero value) decides from
// the length (9 or 25 bytes), [AbortInfoAlways] and [AbortInfoNever] require one layout.
package decoding
