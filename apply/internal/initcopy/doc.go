// Package initcopy is apply's side of the initial copy (apply.Config.Copy): the record of the
// copy in the target's copy table, the target tables checked, mapped and emptied, each chunk
// written through the target's COPY path in a target transaction of its own, and the progress
// row written at the slot's consistent point. Copier implements changefeed's Copier; the copy's
// steps (the slot of a copy cut short dropped, the slot created with an exported snapshot, the
// chunks read, the stream started after) are changefeed's and snapshot's.
//
// The chunks commit one by one, on several connections, so a crash leaves part of a copy on the
// target. The copy table (the progress table's name with "_copy") says so: a row (slot, ”) is
// committed, durably, before the slot is created, and a row (slot, table) for every target table
// before the first row is written into it; the transaction that writes the progress row deletes
// them. A session that finds the slot's copy rows but no progress row drops the slot, truncates
// the tables they name, and starts the copy over. The slot is never dropped without them.
//
// Tables added to the publications later (Tables, Copier.Added) are copied otherwise: from a
// snapshot of their own, in ONE target transaction that also records them in the tables table
// (the progress table's name with "_tables") with the snapshot's consistent point, so a crash
// leaves either all of it or nothing. Tables says which tables the target holds whole, which
// are new, and which changes of the stream the copies hold already (Keep).
//
// Contract: the session owns the leader's connection, the registry and the counters it lends
// in Copier; the Copier owns the copy's connections (opened through Host.Connect, closed by Done
// and Discard). Its methods are called on one goroutine, but Chunk, from the snapshot's workers,
// concurrently, each on its own connection. Tables' Start and Copied run before the session
// streams; Seen and Known may run concurrently with each other (the leader, the publication
// check), and Keep with them.
package initcopy
