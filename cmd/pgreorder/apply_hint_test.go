package main

import (
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/apply"
)

// TestFlagHint: a conflict that stops apply names the -conflict flag that gets past it.
func TestFlagHint(t *testing.T) {
	for ct, want := range map[apply.ConflictType]string{
		apply.InsertExists:  "use -conflict insert_exists=apply_remote (or skip) to get past it",
		apply.DeleteMissing: "use -conflict delete_missing=skip to get past it",
	} {
		ce := &apply.ConflictError{Conflict: &apply.Conflict{Type: ct, Relation: `"public"."t"`}, Hint: "set Config..."}
		err := &apply.ApplyError{Kind: apply.ErrConflict, Relation: `"public"."t"`, Op: "INSERT", Xid: 7, Err: ce}
		flagHint(err)
		if msg := err.Error(); !strings.HasSuffix(msg, "; "+want) || strings.Contains(msg, "Config") {
			t.Errorf("%s: %q, want it to end with %q", ct, msg, want)
		}
	}
}
