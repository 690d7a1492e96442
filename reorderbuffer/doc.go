// Package reorderbuffer reassembles PostgreSQL's streamed logical replication transactions and
// hands back committed transactions in commit order, holding at most logical_decoding_work_mem
// bytes in memory and spilling the largest transaction to disk beyond that.
package reorderbuffer
