package decoding_test

import (
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
)

func TestLSNText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want decoding.LSN
		out  string
	}{
		{"0/0", 0, "0/0"},
		{"0/16B3748", 0x16B3748, "0/16B3748"},
		{"16/b374d848", 0x16B374D848, "16/B374D848"},
		{"FFFFFFFF/FFFFFFFF", ^decoding.LSN(0), "FFFFFFFF/FFFFFFFF"},
	} {
		got, err := decoding.ParseLSN(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.out, got.String())
		// The same text as pglogrepl, which tests use as an independent decoder.
		require.Equal(t, pglogrepl.LSN(got).String(), got.String())
		var u decoding.LSN
		require.NoError(t, u.UnmarshalText([]byte(tc.out)))
		require.Equal(t, got, u)
	}
	for _, bad := range []string{"", "0", "/1", "1/", "0x1/0", "1/2/3", "123456789/0", "0/-1", "g/0", "+1/0", " 0/1"} {
		_, err := decoding.ParseLSN(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestLSNScan(t *testing.T) {
	var l decoding.LSN
	require.NoError(t, l.Scan("16/B374D848"))
	require.Equal(t, decoding.LSN(0x16B374D848), l)
	require.NoError(t, l.Scan([]byte("0/1")))
	require.Equal(t, decoding.LSN(1), l)
	require.Error(t, l.Scan(nil))
	require.Error(t, l.Scan(42))
	v, err := l.Value()
	require.NoError(t, err)
	require.Equal(t, "0/1", v)
}
