// Package lint holds tests that keep the architecture honest: the core packages (heap, decoding,
// spill, reorderbuffer) depend, transitively, on the standard library and on each other only, as
// the layering allows, and on no network package; every other library package has a place in
// the layering and imports only the packages below it; only replication,
// snapshot, apply, changefeed and the server
// helpers talk to pgconn, and only replication speaks the walsender's commands; only metrics
// imports the Prometheus client, and nothing below it depends on it; the core has no goroutines
// and no clock; spill reaches files below its directory only through directory handles; and
// every package a user can import has a package doc comment and a runnable Example; and no
// shipped Go file (the benchmarks and internal/tools aside) is longer than 1,000 lines.
package lint
