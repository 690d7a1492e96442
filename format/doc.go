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
// A Debezium change event per row change, per truncated table and per logical message, field for
// field what Debezium's PostgreSQL connector writes (with the JSON converter, schemas off), so
// that tools written for Debezium can read it, and so that a large transaction is many short
// lines:
//
//	{"before":ROW|null,"after":ROW|null,"source":SOURCE,"transaction":TX,"op":"c|u|d|t|r","ts_ms":N,"ts_us":N,"ts_ns":N}
//	{"op":"m","ts_ms":N,"source":SOURCE,"transaction":TX|null,"message":{"prefix":"…","content":"base64"}}
//
// SOURCE is {"version":…,"connector":"pgreorder","name":…,"ts_ms":N,"snapshot":"false","db":…,
// "sequence":null,"ts_us":N,"ts_ns":N,"schema":…,"table":…,"txId":N,"lsn":N,"xmin":null,"origin":…,
// "origin_lsn":…}: version, name and db come from Config; ts_* is the commit time; lsn is the
// transaction's commit LSN as a number (Debezium gives each change's own LSN, which the reorder
// buffer does not keep; sequence, which Debezium builds from it, is null); txId is null for a
// non-transactional message; origin and origin_lsn name the replication origin the transaction
// came from, null when the server sent none. Rows of an initial copy (Events.Rows) are "r" events
// with snapshot "true", no txId, the snapshot's LSN, and no transaction block. The top-level
// ts_* is when the event was written. TX is {"id":"XID:LSN","total_order":N,
// "data_collection_order":N}: the event's position in its transaction and among the
// transaction's events for its table, from 1.
//
// before is the old row the server sent: the whole old row with REPLICA IDENTITY FULL, the old
// key when an update changed it (other columns null), nothing otherwise; after is the new row of
// an insert or update. In these lines an update that changes the key is one "u" event whose before
// holds the old key; Events, which hands out keyed records, writes it as Debezium does instead: a
// "d" of the old key and a "c" of the new, linked by the headers HeaderNewKey and HeaderOldKey.
//
// Values are typed as Debezium's defaults type them (decimal.handling.mode precise,
// time.precision.mode adaptive, interval.handling.mode numeric; Config.Decimal and
// Config.Interval choose Debezium's other modes):
//
//	bool                          true, false
//	int2, int4, int8, oid         a number
//	float4, float8                a number (shortest form that reads back the same float);
//	                              "NaN", "Infinity", "-Infinity" as strings
//	numeric(p,s)                  base64 of the unscaled value's two's complement bytes
//	                              (org.apache.kafka.connect.data.Decimal); NaN, ±Infinity: null
//	numeric                       {"scale":S,"value":BYTES}, trailing fraction zeros dropped
//	                              (io.debezium.data.VariableScaleDecimal)
//	text, varchar, char, name,
//	enums, xml                    a string
//	bytea                         base64 string
//	date                          days since 1970-01-01 (io.debezium.time.Date)
//	time(0..3), time(4..6)        milliseconds, microseconds since midnight
//	                              (io.debezium.time.Time, MicroTime)
//	timestamp(0..3), (4..6)       milliseconds, microseconds since 1970-01-01
//	                              (io.debezium.time.Timestamp, MicroTimestamp)
//	timestamptz                   ISO 8601 string in UTC with the column's precision in digits,
//	                              "2024-02-29T10:34:56.789012Z" (io.debezium.time.ZonedTimestamp)
//	±infinity                     Debezium's values: date -2147472692 and -2147472691;
//	                              timestamp 9223372036825200000 and -9223372036832400000 (in
//	                              milliseconds, divided by 1000); timestamptz "infinity", "-infinity"
//	interval                      microseconds, months of 365.25/12 days
//	                              (io.debezium.time.MicroDuration)
//	uuid                          a string
//	json, jsonb                   a string holding the JSON text (io.debezium.data.Json)
//	arrays                        a JSON array of the elements, mapped the same way
//	                              (multidimensional arrays flattened, as pgtype decodes them)
//	unchanged TOASTed value       "__debezium_unavailable_value", as Debezium (base64 for bytea)
//	other types pgtype knows      a string, PostgreSQL's text for the value
//	types nobody resolves         text format: a string; binary format: base64
//
// Domains decode as their base type. Register enums and other custom types in the Map of
// Config.Values: an enum in the binary format is otherwise base64. Invalid UTF-8 in string values
// becomes U+FFFD.
//
// # Events: keyed records and Connect schemas
//
// Events hands out each event with the key and headers of a Kafka record of it. With
// Config.Tables (package catalog), the key is the table's primary key (else a unique index of
// NOT NULL columns; a table with neither has none), whatever the replica identity, as Debezium's;
// the columns of a before that the server did not send (a delete's, under the default replica
// identity) are, as Debezium fills them, null when nullable, else the column's default, else the
// type's zero value. Config.KeySchema and ValueSchema add the Kafka Connect schema, as Kafka's
// JsonConverter writes it with schemas.enable=true: {"schema":…,"payload":…}, with Debezium's
// field types, optional flags, literal defaults and logical names.
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
// encoded: a transaction that fails leaves nothing in the output. WriteRows does the same for a
// chunk of an initial copy. Output can be torn only by the process dying while it copies a
// transaction out: such a line lacks its final newline, and a reader should drop it. Package
// changefeed's JSONLines writes these formats to a file exactly once: it stores, durably, where
// the output ends with the position, and cuts whatever a crash left after it.
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
