// Package pgsession is the one place where pgreorder opens connections to PostgreSQL, and what
// goes with a session: the settings pinned on it, connection strings parsed and redacted, the
// backends of pg_stat_activity, SQLSTATE classes, and quoting. Every library package that talks
// to a server (replication, snapshot, catalog, changefeed's TableStore, apply and its target
// side) connects through Connect, Prepare and Open, or ConnectPgx; none calls pgconn or pgx to
// connect on its own.
//
// # Connections
//
// A connection starts from a *pgconn.Config made by pgconn.ParseConfig (ParseConnString, or the
// user's own), which is never modified: each attempt works on a copy, passed to the caller's
// BeforeConnect hook (a password that expires, a dialer), then given the pinned settings of its
// Kind, an application_name unless one is set, and a notice handler that logs the server's
// notices at Warn before the configuration's own OnNotice sees them. A Replication connection
// also gets replication=database and a context watcher that ends waits with a deadline, never a
// cancel request (which would reach the walsender). A configuration pgconn.ParseConfig did not
// make is ErrNotParsed, not pgconn's panic.
//
// # Pinned settings
//
// The settings are sent in the startup packet, where they take precedence over postgresql.conf,
// ALTER ROLE and ALTER DATABASE SET and the "options" connection parameter, and replace the
// configuration's own in any letter case: what the library sends and reads cannot depend on how
// the server, the database or the role are configured. They are listed once, in Settings, each
// with the kinds of connection it is pinned on and the reason:
//
//   - the settings pgoutput formats text values with (DateStyle ISO, IntervalStyle postgres,
//     extra_float_digits 3, client_encoding UTF8), which PostgreSQL's own subscriber pins on its
//     replication connection, on every connection, so that what an ordinary connection reads
//     reads as the stream has it;
//   - standard_conforming_strings on, so that SQL reads as it was written, on every connection;
//   - search_path pg_catalog, pg_temp, so that no object of another schema stands in for a
//     built-in one, on every connection but a Store's, whose SQL is the consumer's own;
//   - no statement, idle-in-transaction, idle-session or (17+) transaction timeout, so that no
//     server-side timeout ends a copy, a worker waiting for its turn or a connection holding a
//     lock for its life; no lock timeout where a lock is waited for on purpose (Target, Store);
//   - on apply's Target connections, what its statements and the values it reads back rely on:
//     bytea_output hex, array_nulls on, xmloption content, read committed, read-write.
//
// A setting newer than some supported server (transaction_timeout, 17+) goes in the startup
// packet too; a server that does not know it refuses the connection, which is then made again
// without it (and that server remembered), and given with set_config those its version has.
//
// # The rest
//
// RedactConnString, RedactConnError and ParseConnString keep passwords out of every message
// about a connection string; TidyConnectError puts pgconn's report of a failed connection on one
// line. TransientSQLState is the one table of SQLSTATEs worth trying again; Code and IsCode read
// a server error's SQLSTATE. An attempt to connect that fails (the driver's error, or
// BeforeConnect's) is returned as an *AttemptError, which states, for the library's one rule of
// what is retried (internal/retry), that a refusal by the server is decided by its SQLSTATE and
// any other failure of the attempt (the network, DNS, TLS, a timeout, the hook) is retried. QuoteIdent, QuoteQualified and QuoteLiteral quote for SQL,
// QuoteCommandLiteral for a replication command, DisplayIdent for a message.
package pgsession
