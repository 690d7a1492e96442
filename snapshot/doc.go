// Package snapshot makes the initial copy of the published tables for a logical replication
// consumer: it reads them in the snapshot that a new slot exports, in parallel over several
// normal connections, and delivers their rows through the same typed-change interface as the
// stream's, so that the copy followed by the stream from the slot's consistent point holds every
// committed change exactly once.
package snapshot
