package conflict_test

import (
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/replication"
)

// Conflict resolutions are given per type, with PostgreSQL's names; the types left out keep
// PostgreSQL's behaviour.
func ExampleParseResolutions() {
	res, err := conflict.ParseResolutions("insert_exists=last_update_wins, update_missing=apply_remote", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := apply.Config{
		Origin: "pgreorder_app", // marks the applied transactions: no loops, *_origin_differs
		// The other direction's applied changes are not sent back.
		Source: replication.Config{OriginFilter: replication.OriginFilterNone},
		Conflicts: conflict.Config{
			Resolutions: res,
			Retention:   5 * time.Minute, // update_deleted: tombstones of local deletions, kept 5 minutes
			LogTable:    "pgreorder_conflicts",
		},
	}
	fmt.Println(cfg.Conflicts.Resolutions[conflict.InsertExists], cfg.Conflicts.Resolutions[conflict.UpdateMissing])
	// Output: last_update_wins apply_remote
}
