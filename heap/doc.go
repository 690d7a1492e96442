// Package heap provides a generic pairing heap with removal and update of arbitrary elements.
//
// pgreorder uses it to pick the transaction with the most bytes in memory when the reorder buffer
// exceeds logical_decoding_work_mem, as PostgreSQL 17+ does in reorderbuffer.c.
package heap
