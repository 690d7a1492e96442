package decoding_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
)

// A reusing Parser must not leave an earlier tuple's value in a column that is NULL or an
// unchanged TOASTed value now (found by comparing with pglogrepl's reading of a real stream).
func TestParserReuseClearsData(t *testing.T) {
	var p decoding.Parser
	full, err := decoding.Append(nil, &decoding.Insert{RelationID: 1, New: decoding.Tuple{
		{Kind: 't', Data: []byte("a")}, {Kind: 't', Data: []byte("b")}}}, false, decoding.Options{})
	require.NoError(t, err)
	nulls, err := decoding.Append(nil, &decoding.Insert{RelationID: 1, New: decoding.Tuple{
		{Kind: 'n'}, {Kind: 'u'}}}, false, decoding.Options{})
	require.NoError(t, err)
	_, err = p.Parse(full, false)
	require.NoError(t, err)
	m, err := p.Parse(nulls, false)
	require.NoError(t, err)
	require.Equal(t, decoding.Tuple{{Kind: 'n'}, {Kind: 'u'}}, m.(*decoding.Insert).New)
}
