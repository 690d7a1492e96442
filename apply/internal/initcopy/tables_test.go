package initcopy

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/snapshot"
)

// TestTablesKeep: the stream leaves out a copied table's changes of the transactions that commit
// before its copy's consistent point, and only those.
func TestTablesKeep(t *testing.T) {
	var ts Tables
	ts.Known([]target.KnownTable{{OID: 1}})
	if ts.Keep(5) != nil {
		t.Fatal("Keep filters with no copy")
	}
	ts.Copied([]*snapshot.Table{{OID: 2}}, 100)
	ts.Copied([]*snapshot.Table{{OID: 3}}, 200)
	for _, c := range []struct {
		commit  decoding.LSN
		kept    []uint32
		dropped []uint32
		all     bool
	}{
		{commit: 50, kept: []uint32{1, 9}, dropped: []uint32{2, 3}},
		{commit: 99, kept: []uint32{1}, dropped: []uint32{2, 3}},
		{commit: 100, kept: []uint32{1, 2}, dropped: []uint32{3}},
		{commit: 199, kept: []uint32{2}, dropped: []uint32{3}},
		{commit: 200, all: true},
		{commit: 300, all: true},
	} {
		keep := ts.Keep(c.commit)
		if c.all {
			if keep != nil {
				t.Errorf("commit %s: a filter, want none", c.commit)
			}
			continue
		}
		for _, id := range c.kept {
			if !keep(id) {
				t.Errorf("commit %s: relation %d left out", c.commit, id)
			}
		}
		for _, id := range c.dropped {
			if keep(id) {
				t.Errorf("commit %s: relation %d kept", c.commit, id)
			}
		}
	}
	if ts.SyncTo() != 200 {
		t.Errorf("SyncTo %s, want 0/C8", ts.SyncTo())
	}
}

// TestTablesSeen: a table the session does not know ends it, unless tables are streamed only
// (then a log line names it, once) or it is one of the Applier's own; nothing is followed
// before Start or Known.
func TestTablesSeen(t *testing.T) {
	var log bytes.Buffer
	ts := Tables{Log: slog.New(slog.NewTextHandler(&log, nil)), Own: map[string]bool{`"public"."progress"`: true}}
	if err := ts.Seen(7, "public", "new"); err != nil {
		t.Fatalf("Seen before the tables are known: %v", err)
	}
	ts.Known([]target.KnownTable{{OID: 1}})
	if err := ts.Seen(1, "public", "old"); err != nil {
		t.Errorf("Seen of a known table: %v", err)
	}
	var ae *AddedError
	if err := ts.Seen(7, "public", "New"); !errors.As(err, &ae) || ae.Table != `public."New"` {
		t.Errorf("Seen of a new table: %v, want an *AddedError naming it", err)
	}
	if err := ts.Seen(8, "public", "progress"); err != nil {
		t.Errorf("Seen of an own table: %v", err)
	}
	ts.StreamOnly, ts.StreamOnlyOption = true, "-copy-new-tables=false"
	for range 2 {
		if err := ts.Seen(7, "public", "New"); err != nil {
			t.Errorf("Seen, streamed only: %v", err)
		}
	}
	if n := strings.Count(log.String(), "its rows from before are not copied (-copy-new-tables=false)"); n != 1 {
		t.Errorf("%d log lines name the table streamed only, want 1:\n%s", n, log.String())
	}
}
