package capture_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := capture.NewWriter(&buf)
	require.NoError(t, w.Comment("workload: x\nsecond"))
	recs := []capture.Record{{LSN: 0x16B3750, Xid: 750, Data: []byte("B\x00\x01")}, {LSN: 0, Xid: 0, Data: []byte{'R'}}}
	for _, r := range recs {
		require.NoError(t, w.Write(r))
	}
	require.NoError(t, w.Flush())
	require.Equal(t, "# workload: x\n# second\n0/16B3750\t750\t420001\n0/0\t0\t52\n", buf.String())

	r := capture.NewReader(&buf)
	for _, want := range recs {
		got, err := r.Next()
		require.NoError(t, err)
		require.Equal(t, want.LSN, got.LSN)
		require.Equal(t, want.Xid, got.Xid)
		require.Equal(t, want.Data, got.Data)
	}
	_, err := r.Next()
	require.ErrorIs(t, err, io.EOF)
}

func TestMalformed(t *testing.T) {
	for _, line := range []string{
		"0/1\t2",            // two columns
		"zz\t1\t42",         // bad lsn
		"0/1\t-1\t42",       // bad xid
		"0/1\t1\t4",         // odd hex
		"0/1\t1\tzz",        // not hex
		"0/1\t1\t",          // empty message
		"0/1\t1\t42\textra", // four columns
	} {
		r := capture.NewReader(strings.NewReader("# c\n\n" + line + "\n"))
		_, err := r.Next()
		require.ErrorIs(t, err, capture.ErrSyntax, line)
		var le *capture.LineError
		require.True(t, errors.As(err, &le))
		require.Equal(t, 3, le.Line, line)
	}
}

func TestPostgresByteaOutput(t *testing.T) {
	// psql prints bytea as \x...; accept it so captures can be made with plain psql too.
	r := capture.NewReader(strings.NewReader("0/1\t7\t\\x4200\n"))
	rec, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, []byte{'B', 0}, rec.Data)
}

// TestLargeRoundTrip: a message larger than the Reader's pieces and the Writer's steps reads back
// whole, and Release keeps the Reader usable.
func TestLargeRoundTrip(t *testing.T) {
	data := make([]byte, 3<<20+7)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var buf bytes.Buffer
	w := capture.NewWriter(&buf)
	require.NoError(t, w.Write(capture.Record{LSN: 1, Xid: 2, Data: data}))
	require.NoError(t, w.Write(capture.Record{LSN: 3, Xid: 4, Data: []byte{'C'}}))
	require.NoError(t, w.Flush())
	r := capture.NewReader(&buf)
	rec, err := r.Next()
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, rec.Data))
	r.Release()
	rec, err = r.Next()
	require.NoError(t, err)
	require.Equal(t, []byte{'C'}, rec.Data)
	_, err = r.Next()
	require.ErrorIs(t, err, io.EOF)
}
