// Package decoding is a pure, defensive decoder for PostgreSQL's pgoutput logical replication
// protocol, versions 1 to 4: bytes in, typed messages out. It never does I/O and never panics on
// bad input.
package decoding
