package reorderbuffer_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// The oracle's second opinion: the server's non-streamed reading is decoded by pglogrepl, a
// decoder written independently of ours, and the buffer's output is rendered from our decoded
// messages directly, without the JSON writer; both are rendered into the same plain text. A bug
// shared by our decoder and the output format cannot cancel out.

// change renders one change from its parts.
func change(op, ns, table string, names []string, kinds []byte, values [][]byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s.%s", op, ns, table)
	for i := range kinds {
		name := "?"
		if i < len(names) {
			name = names[i]
		}
		fmt.Fprintf(&b, " %s=%c:%q", name, kinds[i], values[i])
	}
	return b.String()
}

// independentPlain decodes a non-streamed capture with pglogrepl into one line per committed
// transaction (and per non-transactional message).
func independentPlain(t testing.TB, recs []capture.Record) []string {
	t.Helper()
	rels := map[uint32]*pglogrepl.RelationMessage{}
	var out, cur []string
	in := false
	tuple := func(op string, relID uint32, tup *pglogrepl.TupleData) string {
		r, ok := rels[relID]
		require.True(t, ok, "pglogrepl: relation %d undescribed", relID)
		var names []string
		for _, c := range r.Columns {
			names = append(names, c.Name)
		}
		var kinds []byte
		var vals [][]byte
		if tup != nil {
			for _, c := range tup.Columns {
				kinds = append(kinds, c.DataType)
				vals = append(vals, c.Data)
			}
		}
		return change(op, r.Namespace, r.RelationName, names, kinds, vals)
	}
	for _, rec := range recs {
		m, err := pglogrepl.Parse(rec.Data)
		require.NoError(t, err)
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			in, cur = true, nil
		case *pglogrepl.CommitMessage:
			if len(cur) > 0 {
				out = append(out, strings.Join(cur, "\n"))
			}
			in = false
		case *pglogrepl.RelationMessage:
			rels[m.RelationID] = m
		case *pglogrepl.InsertMessage:
			cur = append(cur, tuple("insert", m.RelationID, m.Tuple))
		case *pglogrepl.UpdateMessage:
			s := tuple("update", m.RelationID, m.NewTuple)
			if m.OldTuple != nil {
				s += " old(" + string(m.OldTupleType) + "):" + tuple("", m.RelationID, m.OldTuple)
			}
			cur = append(cur, s)
		case *pglogrepl.DeleteMessage:
			cur = append(cur, tuple("delete("+string(m.OldTupleType)+")", m.RelationID, m.OldTuple))
		case *pglogrepl.TruncateMessage:
			var names []string
			for _, id := range m.RelationIDs {
				names = append(names, rels[id].Namespace+"."+rels[id].RelationName)
			}
			cur = append(cur, fmt.Sprintf("truncate %d %s", m.Option, strings.Join(names, ",")))
		case *pglogrepl.LogicalDecodingMessage:
			s := fmt.Sprintf("message %v %q %q", m.Transactional, m.Prefix, m.Content)
			if m.Transactional && in {
				cur = append(cur, s)
			} else {
				out = append(out, s)
			}
		}
	}
	return out
}

// ours renders what the buffer hands out for a capture, from our decoded messages.
func ours(t testing.TB, recs []capture.Record, cfg reorderbuffer.Config) []string {
	t.Helper()
	b, err := reorderbuffer.New(cfg)
	require.NoError(t, err)
	defer b.Close()
	var out []string
	tuple := func(s decoding.Schema, op string, relID uint32, tup decoding.Tuple) string {
		r, ok := s.Relation(relID)
		require.True(t, ok, "relation %d undescribed", relID)
		var names []string
		for _, c := range r.Columns {
			names = append(names, c.Name)
		}
		var kinds []byte
		var vals [][]byte
		for _, c := range tup {
			kinds = append(kinds, c.Kind)
			vals = append(vals, c.Data)
		}
		ns := r.Namespace
		return change(op, ns, r.Name, names, kinds, vals)
	}
	// With Config.Incremental, parts are assembled as a consumer applying them would: a
	// savepoint before each subtransaction's first change, undone on PartSubAbort.
	type applying struct {
		changes  []string
		subStart map[uint32]int
	}
	open := map[uint32]*applying{}
	for _, rec := range recs {
		require.NoError(t, b.Add(rec.LSN, rec.Data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			ap := open[x.Xid]
			if ap == nil {
				ap = &applying{subStart: map[uint32]int{}}
			}
			switch x.Part {
			case reorderbuffer.PartAbort:
				delete(open, x.Xid)
				continue
			case reorderbuffer.PartSubAbort:
				cut, ok := ap.subStart[x.SubXid]
				require.True(t, ok, "undo of subtransaction %d that wrote nothing handed out", x.SubXid)
				ap.changes = ap.changes[:cut]
				for s, i := range ap.subStart {
					if i >= cut {
						delete(ap.subStart, s)
					}
				}
				continue
			}
			cur := ap.changes
			for c, err := range x.Changes() {
				m := c.Msg
				if xid := decoding.ChangeXid(m); xid != 0 && xid != x.Xid {
					if _, ok := ap.subStart[xid]; !ok {
						ap.subStart[xid] = len(cur)
					}
				}
				require.NoError(t, err)
				switch m := m.(type) {
				case *decoding.Insert:
					cur = append(cur, tuple(c.Schema, "insert", m.RelationID, m.New))
				case *decoding.Update:
					s := tuple(c.Schema, "update", m.RelationID, m.New)
					if m.OldKind != 0 {
						s += " old(" + string(m.OldKind) + "):" + tuple(c.Schema, "", m.RelationID, m.Old)
					}
					cur = append(cur, s)
				case *decoding.Delete:
					cur = append(cur, tuple(c.Schema, "delete("+string(m.OldKind)+")", m.RelationID, m.Old))
				case *decoding.Truncate:
					var names []string
					for _, id := range m.RelationIDs {
						r, ok := c.Schema.Relation(id)
						require.True(t, ok)
						names = append(names, r.Namespace+"."+r.Name)
					}
					cur = append(cur, fmt.Sprintf("truncate %d %s", m.Options, strings.Join(names, ",")))
				case *decoding.LogicalMessage:
					cur = append(cur, fmt.Sprintf("message %v %q %q", m.Transactional(), m.Prefix, m.Content))
				}
			}
			if x.Part == reorderbuffer.PartChanges {
				ap.changes = cur
				open[x.Xid] = ap
				continue
			}
			delete(open, x.Xid)
			if len(cur) > 0 {
				out = append(out, strings.Join(cur, "\n"))
			}
			require.NoError(t, b.Ack(x))
		}
	}
	require.Empty(t, open, "parts of transactions never ended")
	return out
}

// sameLines compares two renderings transaction by transaction and change by change, reporting
// the first difference (whole renderings of large transactions are too long to print).
func sameLines(t testing.TB, want, got []string, what string) {
	t.Helper()
	for i := range min(len(want), len(got)) {
		if want[i] == got[i] {
			continue
		}
		w, g := strings.Split(want[i], "\n"), strings.Split(got[i], "\n")
		for j := range min(len(w), len(g)) {
			if w[j] != g[j] {
				t.Fatalf("%s: transaction %d, change %d:\n want %.300s\n got  %.300s", what, i, j, w[j], g[j])
			}
		}
		t.Fatalf("%s: transaction %d: %d changes, want %d", what, i, len(g), len(w))
	}
	if len(want) != len(got) {
		t.Fatalf("%s: %d transactions, want %d", what, len(got), len(want))
	}
}
