// Package format writes committed transactions of a reorder buffer as JSON lines, in two formats:
// the output of `pgreorder replay` and `pgreorder stream`, which tools parse. Both formats are a
// contract; docs/formats.md shows samples from a real server.
//
// # txn: one line per transaction (the default)
//
//	{"xid":N,"commit_lsn":"X/X","end_lsn":"X/X","commit_time":T,"changes":[…]}
//
// plus "gid":"…" (before "changes") for a two-phase transaction. LSNs are printed as PostgreSQL
// prints them; T is RFC 3339 in UTC with microseconds. Changes, in order:
//
//	{"op":"insert","relation":"s.t","schema":"s","table":"t","new":{COLUMN:VALUE,…}}
//	{"op":"update","relation":…,"schema":…,"table":…,"old":{…},"new":{…}}   "old" only when the server sent a key or old row
//	{"op":"delete","relation":…,"schema":…,"table":…,"old":{…}}
//	{"op":"truncate","relations":["s.t",…],"tables":[{"schema":"s","table":"t"},…],"cascade":B,"restart_identity":B}
//	{"op":"message","transactional":true,"prefix":"…","content":"base64"}
//
// "relation" is schema and table joined by a dot, kept for existing readers; it is ambiguous
// when a name contains a dot, "schema" and "table" are not. The schema of a pg_catalog table is
// "pg_catalog". VALUE is the value in PostgreSQL's text format as a JSON string, null for SQL
// NULL, {"unchanged_toast":true} for an unchanged TOASTed value the server did not send,
// {"binary":"base64"} for a binary-format value (a slot read with binary 'true'), and
// {"escaped":"…"} for a text value that is not valid UTF-8 (escaped as names are, below). A
// non-transactional logical message is printed in its place in the stream as
//
//	{"op":"message","transactional":false,"lsn":"X/X","prefix":"…","content":"base64"}
//
// # debezium: one line per change
//
// A Debezium-style change event per row change, per truncated table and per logical message, so
// that tools written for Debezium's PostgreSQL connector (with the JSON converter, schemas off)
// can read it, and so that a large transaction is many short lines:
//
//	{"before":ROW|null,"after":ROW|null,"source":SOURCE,"op":"c|u|d|t","ts_ms":N,"transaction":TX}
//	{"op":"m","ts_ms":N,"source":SOURCE,"message":{"prefix":"…","content":"base64"},"transaction":TX|null}
//
// SOURCE is {"version":…,"connector":"pgreorder","name":…,"ts_ms":N,"snapshot":"false","db":…,
// "schema":…,"table":…,"txId":N,"lsn":N,"xmin":null}: version (omitted unless configured), name and db
// come from Config; ts_ms is the commit time in milliseconds; lsn is the transaction's commit LSN
// as a number (Debezium gives each change's own LSN, which pgoutput does not send); txId is null
// for a non-transactional message. The top-level ts_ms is when the event was written.
// TX is {"id":"XID:LSN","total_order":N,"data_collection_order":N}: the event's position in its
// transaction and among the transaction's events for its table, from 1.
//
// before is the old key (or the whole old row with REPLICA IDENTITY FULL) of an update, when the
// server sent it, and of a delete; after is the new row of an insert or update. Values are typed
// with package pgvalue, mostly as Debezium's defaults give them, and otherwise as strings:
//
//	bool                          true, false
//	int2, int4, int8, oid, xid    a number
//	float4, float8                a number (shortest form that reads back the same float);
//	                              "NaN", "Infinity", "-Infinity" as strings
//	numeric                       a string, PostgreSQL's text ("12.50", "NaN"), as Debezium with
//	                              decimal.handling.mode=string
//	text, varchar, char, name,
//	enums, xml                    a string
//	bytea                         base64 string
//	date                          days since 1970-01-01 (io.debezium.time.Date)
//	timestamp                     microseconds since 1970-01-01 (io.debezium.time.MicroTimestamp)
//	timestamptz                   ISO 8601 string in UTC, "2024-02-29T10:34:56.789012Z"
//	                              (io.debezium.time.ZonedTimestamp)
//	date, timestamp(tz) ±infinity "infinity", "-infinity"
//	time                          microseconds since midnight (io.debezium.time.MicroTime)
//	interval                      ISO 8601 duration string, "P1Y2M3DT4H5M6.789S"
//	                              (Debezium with interval.handling.mode=string)
//	uuid                          a string
//	json, jsonb                   a string holding the JSON text (io.debezium.data.Json)
//	arrays                        a JSON array of the elements, mapped the same way
//	                              (multidimensional arrays flattened, as pgtype decodes them)
//	unchanged TOASTed value       "__debezium_unavailable_value", as Debezium
//	other types pgtype knows      a string, PostgreSQL's text for the value
//	types nobody resolves         text format: a string; binary format: base64
//
// Domains decode as their base type. Register enums and other custom types in the Map of
// Config.Values: an enum in the binary format is otherwise base64. Invalid UTF-8 in string values
// becomes U+FFFD.
//
// # Names
//
// Names PostgreSQL sends (schemas, tables, columns, message prefixes, GIDs) are arbitrary bytes.
// They are printed with an injective escaping (EscapeName): a name that is valid UTF-8 without a
// backslash is printed as it is; in any other, each backslash is doubled and each byte that is not
// part of valid UTF-8 is written \xNN. So distinct names never become the same JSON key or string,
// and UnescapeName gives the original bytes back. A relation with two columns of the same name
// (which PostgreSQL never sends) is an error, ErrDuplicateColumn: the JSON never has duplicate
// keys.
//
// # Whole transactions
//
// A Writer stages a transaction's output (in memory up to Config.StageBytes, then in a
// private temporary file) and copies it to its destination only once every change was read and
// encoded: a transaction that fails leaves nothing in the output. A File writes to a file in
// place, cuts a failed transaction off, and records after each transaction, durably, where the
// output ends and which LSN to resume after; a torn last line left by a crash is cut when the file
// is opened again. Output written elsewhere (a pipe) can be torn only by the process dying while
// it copies a transaction out: such a line lacks its final newline, and a reader should drop it.
//
// # Memory and buffer ownership
//
// Values are encoded in pieces of 64 KiB as the transaction's changes are read, so the memory a
// Writer uses does not grow with the size of a transaction or of a value (beyond Config.StageBytes
// of staging, and Debezium's typed values, which are decoded one at a time). WriteTxn reads the
// transaction's changes itself and retains nothing of them after it returns. The slices it passes
// to the destination's Write are reused afterwards: as io.Writer requires, a destination must not
// keep them.
package format
