// Package spill stores per-transaction logs of opaque records on disk, with checksummed framing,
// truncation to an earlier record boundary, bounded-memory reading and a file-descriptor budget.
package spill
