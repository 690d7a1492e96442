package decoding_test

import (
	"time"

	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/stretchr/testify/require"
)

// TestParserMatchesParse: the reusing Parser decodes every message exactly as Parse does, also
// when wide and narrow tuples alternate, and rejects what Parse rejects.
func TestParserMatchesParse(t *testing.T) {
	col := func(s string) decoding.Column { return decoding.Column{Kind: 't', Data: []byte(s)} }
	msgs := []struct {
		m        decoding.Message
		inStream bool
	}{
		{&decoding.Insert{RelationID: 1, New: decoding.Tuple{col("a")}}, false},
		{&decoding.Insert{Xid: 9, RelationID: 1, New: decoding.Tuple{col("a"), col("b"), {Kind: 'n'}, {Kind: 'u'}, col("e"), {Kind: 'b', Data: []byte{1}}}}, true},
		{&decoding.Update{RelationID: 2, OldKind: 'K', Old: decoding.Tuple{col("k")}, New: decoding.Tuple{col("x"), col("y")}}, false},
		{&decoding.Update{Xid: 7, RelationID: 2, New: decoding.Tuple{col("x")}}, true},
		{&decoding.Delete{RelationID: 3, OldKind: 'O', Old: decoding.Tuple{col("1"), col("2"), col("3")}}, false},
		{&decoding.Insert{RelationID: 1, New: decoding.Tuple{}}, false},
		{&decoding.Begin{FinalLSN: 4, CommitTime: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), Xid: 8}, false},
		{&decoding.StreamCommit{Xid: 8, CommitLSN: 5, EndLSN: 6, CommitTime: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)}, false},
		{&decoding.StreamStart{Xid: 8, FirstSegment: true}, false},
		{&decoding.Commit{CommitLSN: 5, EndLSN: 6, CommitTime: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)}, false},
	}
	var p decoding.Parser
	for i, tc := range msgs {
		data, err := decoding.Append(nil, tc.m, tc.inStream, decoding.Options{})
		require.NoError(t, err)
		want, err := decoding.Parse(data, tc.inStream, decoding.Options{})
		require.NoError(t, err)
		got, err := p.Parse(data, tc.inStream)
		require.NoError(t, err)
		require.Equal(t, want, got, "message %d", i)
		for n := 1; n < len(data); n++ { // every truncation fails the same way
			_, werr := decoding.Parse(data[:n], tc.inStream, decoding.Options{})
			_, gerr := p.Parse(data[:n], tc.inStream)
			require.Equal(t, werr == nil, gerr == nil, "message %d cut at %d", i, n)
			if werr != nil {
				require.Equal(t, werr.Error(), gerr.Error())
			}
		}
	}
	_, err := p.Parse(nil, false)
	require.ErrorIs(t, err, decoding.ErrTruncated)
}

func TestParserDoesNotAllocate(t *testing.T) {
	data, err := decoding.Append(nil, &decoding.Insert{Xid: 9, RelationID: 1,
		New: decoding.Tuple{{Kind: 't', Data: []byte("abc")}, {Kind: 'n'}, {Kind: 't', Data: []byte("12")}}}, true, decoding.Options{})
	require.NoError(t, err)
	var p decoding.Parser
	_, err = p.Parse(data, true)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := p.Parse(data, true); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}
