package main

import (
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/apply/conflict"
)

// TestFlagHint: a conflict that stops apply names the -conflict flag that gets past it.
func TestFlagHint(t *testing.T) {
	for ct, want := range map[conflict.Type]string{
		conflict.InsertExists:  "use -conflict insert_exists=apply_remote (or skip) to get past it",
		conflict.DeleteMissing: "use -conflict delete_missing=skip to get past it",
	} {
		ce := &conflict.StopError{Report: &conflict.Report{Type: ct, Relation: `"public"."t"`}, Hint: "set Config..."}
		err := &apply.ApplyError{Kind: apply.ErrConflict, Relation: `"public"."t"`, Op: apply.OpInsert, Xid: 7, Err: ce}
		flagHint(err)
		if msg := err.Error(); !strings.HasSuffix(msg, "; "+want) || strings.Contains(msg, "Config") {
			t.Errorf("%s: %q, want it to end with %q", ct, msg, want)
		}
	}
}
