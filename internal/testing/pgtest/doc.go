// Package pgtest gives tests throwaway PostgreSQL servers (15 to 18), built on package
// internal/tools/pgserver, which does the work and which the pgreorder commands use directly.
//
// A package calls Main from TestMain; Shared(t, major) gives the test binary's single server of
// that major (started on first use, stopped by Main), Majors lists what is installed and
// NewDatabase gives each test its own database, dropped with its replication slots at the end of
// the test. Without a server of the wanted version these skip the test with a message that says
// how to install one; with PGREORDER_REQUIRE_PG=1 they fail it instead (CI sets it).
//
// NewPair gives a test a primary and a physical standby of it of its own (PostgreSQL 17+), set
// up to keep failover slots: Pair.ConnString names both, WaitSynced waits for the standby's copy
// of a slot, Failover promotes the standby and stops the primary.
//
// Beside them, the query helpers every package's tests share, which fail the test (testify's
// require) on an error: ExecAll, QueryOne, Count, QueryText; and waits on events rather than
// sleeps: Until and Eventually poll a condition until a deadline, ClockPast orders commit
// timestamps by the server's clock.
//
// Start, Record, ParseWorkload and the types they use are those of pgserver. Start here lets
// pgserver create the unprivileged server user when tests run as root, and, when
// PGREORDER_PG_REPORT names a file, appends a line naming the version started to it, so that CI
// can check which versions the tests ran against.
package pgtest
