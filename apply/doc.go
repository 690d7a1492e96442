// Package apply replicates a PostgreSQL publication into a target PostgreSQL database, exactly
// once, through pgreorder's replication stream: a subscriber like PostgreSQL's own, as a library.
//
//	err := apply.Run(ctx, apply.Config{
//		Source: "host=src dbname=app", Target: "host=dst dbname=app",
//		Slot: "to_dst", Publications: []string{"app"}, CreateSlot: true,
//	})
//
// The target's tables must exist with the source's columns (more columns are fine) and hold
// what the source held when the slot was created.
package apply
