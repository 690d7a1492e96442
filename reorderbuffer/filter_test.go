package reorderbuffer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TestFilter: a filtered transaction yields the row changes of the relations kept only, a
// Truncate with its kept relations only (without the server's record when it named others),
// and every Relation message, and Heads likewise; Described lists those without reading the changes; Filter(nil)
// yields everything again.
func TestFilter(t *testing.T) {
	b := newBuffer(t, reorderbuffer.Config{})
	feed(t, b,
		enc(t, &decoding.Begin{FinalLSN: 0x1ff8, CommitTime: epoch, Xid: 10}, false),
		enc(t, relation(1, 0), false), enc(t, insert(1, 0, "a"), false),
		enc(t, relation(2, 0), false), enc(t, insert(2, 0, "b"), false),
		enc(t, &decoding.Update{RelationID: 2, New: decoding.Tuple{{Kind: 't', Data: []byte("c")}}}, false),
		enc(t, &decoding.Delete{RelationID: 1, Old: decoding.Tuple{{Kind: 't', Data: []byte("a")}}, OldKind: 'K'}, false),
		enc(t, &decoding.Truncate{RelationIDs: []uint32{1, 2}}, false),
		enc(t, &decoding.Truncate{RelationIDs: []uint32{2}}, false),
		enc(t, &decoding.Commit{CommitLSN: 0x1ff8, EndLSN: 0x2000, CommitTime: epoch}, false))
	x, ok := b.Next()
	require.True(t, ok)

	var ids []uint32
	for _, r := range x.Described() {
		ids = append(ids, r.RelationID)
	}
	require.Equal(t, []uint32{1, 2}, ids)

	read := func() []string {
		var out []string
		for c, err := range x.Changes() {
			require.NoError(t, err)
			switch m := c.Msg.(type) {
			case *decoding.Relation:
				out = append(out, "relation "+m.Name)
			case *decoding.Insert:
				out = append(out, "insert "+c.Relation.Name)
			case *decoding.Update:
				out = append(out, "update "+c.Relation.Name)
			case *decoding.Delete:
				out = append(out, "delete "+c.Relation.Name)
			case *decoding.Truncate:
				s := "truncate"
				for _, id := range m.RelationIDs {
					r, _ := c.Schema.Relation(id)
					s += " " + r.Name
				}
				if c.Raw == nil {
					s += " (no raw)"
				}
				out = append(out, s)
			}
		}
		// Heads yields the same, its row changes read only as far as their relation.
		var heads []string
		for h, err := range x.Heads() {
			require.NoError(t, err)
			switch h.Type {
			case decoding.MsgInsert, decoding.MsgUpdate, decoding.MsgDelete:
				require.Nil(t, h.Msg)
				require.Equal(t, h.RelationID, h.Relation.RelationID)
				heads = append(heads, map[decoding.MessageType]string{
					decoding.MsgInsert: "insert ", decoding.MsgUpdate: "update ", decoding.MsgDelete: "delete "}[h.Type]+h.Relation.Name)
			case decoding.MsgRelation:
				heads = append(heads, "relation "+h.Msg.(*decoding.Relation).Name)
			case decoding.MsgTruncate:
				s := "truncate"
				for _, id := range h.Msg.(*decoding.Truncate).RelationIDs {
					r, _ := h.Schema.Relation(id)
					s += " " + r.Name
				}
				if h.Raw == nil {
					s += " (no raw)"
				}
				heads = append(heads, s)
			}
		}
		require.Equal(t, out, heads, "Heads")
		return out
	}
	all := []string{"relation t1", "insert t1", "relation t2", "insert t2", "update t2", "delete t1", "truncate t1 t2", "truncate t2"}
	require.Equal(t, all, read())
	x.Filter(func(id uint32) bool { return id != 2 })
	require.Equal(t, []string{"relation t1", "insert t1", "relation t2", "delete t1", "truncate t1 (no raw)"}, read())
	x.Filter(func(id uint32) bool { return id == 2 })
	require.Equal(t, []string{"relation t1", "relation t2", "insert t2", "update t2", "truncate t2 (no raw)", "truncate t2"}, read())
	x.Filter(nil)
	require.Equal(t, all, read())
}
