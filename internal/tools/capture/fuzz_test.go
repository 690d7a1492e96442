package capture_test

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"errors"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/stretchr/testify/require"
)

// reference reads a capture the simplest way: whole, split into lines. It returns the records
// before the first malformed line and that line's number (0 if none).
func reference(in []byte) ([]capture.Record, int) {
	var recs []capture.Record
	lines := bytes.Split(in, []byte{'\n'})
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	for i, line := range lines {
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		cols := strings.Split(string(line), "\t")
		if len(cols) != 3 || len(cols[0])+len(cols[1])+2 > capture.MaxHeader {
			return recs, i + 1
		}
		lsn, err := decoding.ParseLSN(cols[0])
		if err != nil {
			return recs, i + 1
		}
		var xid uint64
		if cols[1] != "" {
			if xid, err = strconv.ParseUint(cols[1], 10, 32); err != nil {
				return recs, i + 1
			}
		}
		data, err := hex.DecodeString(strings.TrimPrefix(cols[2], `\x`))
		if err != nil || len(data) == 0 {
			return recs, i + 1
		}
		recs = append(recs, capture.Record{LSN: lsn, Xid: uint32(xid), Data: data})
	}
	return recs, 0
}

// readAll reads every record with a read buffer of the given size.
func readAll(in []byte, size int) ([]capture.Record, int, error) {
	r := capture.NewReaderSize(bytes.NewReader(in), size)
	var recs []capture.Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return recs, 0, nil
		}
		if err != nil {
			var le *capture.LineError
			if !errors.As(err, &le) {
				return recs, -1, err
			}
			return recs, le.Line, err
		}
		rec.Data = append([]byte(nil), rec.Data...)
		recs = append(recs, rec)
	}
}

// FuzzReader: the Reader reads what the line-splitting reference reads, whatever the input and
// however its lines are cut into reads, fails on the same line with ErrSyntax, and what it reads
// the Writer writes back so that it reads the same again.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		"0/16B3750\t750\t4200\n",
		"# c\n\n0/1\t\t\\x42\r\n0/2\t3\t43",
		"0/1\t2\n", "0/1\t1\t4\n", "0/1\t1\tzz\n", "0/1\t1\t\n", "0/1\t1\t42\textra\n",
		"0/1\t1\t\\42\n", "0/1\t1\t42\r\r\n", "0/1\t1\t" + strings.Repeat("ab", 100) + "\r\n",
		"FFFFFFFF/FFFFFFFF\t4294967295\t" + strings.Repeat("0", 300) + "\n#" + strings.Repeat("x", 300),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if bytes.HasPrefix(in, []byte{0x1f, 0x8b}) {
			readAll(in, 80) // gzip: only must not panic
			return
		}
		want, wantLine := reference(in)
		for _, size := range []int{80, 97, 4096} {
			got, line, err := readAll(in, size)
			require.Equal(t, wantLine, line, "size %d: %v", size, err)
			if line != 0 {
				require.ErrorIs(t, err, capture.ErrSyntax)
			}
			require.Equal(t, len(want), len(got), "size %d", size)
			for i := range want {
				require.Equal(t, want[i], got[i], "size %d record %d", size, i)
			}
		}
		var buf bytes.Buffer
		w := capture.NewWriter(&buf)
		for _, rec := range want {
			require.NoError(t, w.Write(rec))
		}
		require.NoError(t, w.Flush())
		again, line, err := readAll(buf.Bytes(), 4096)
		require.NoError(t, err)
		require.Zero(t, line)
		require.Equal(t, len(want), len(again))
	})
}

func TestGzip(t *testing.T) {
	plain := "# comment\n0/16B3750\t750\t4200\n0/16B3760\t750\t43\n"
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte(plain))
	zw.Close()
	got, line, err := readAll(z.Bytes(), 4096)
	require.NoError(t, err)
	require.Zero(t, line)
	want, _ := reference([]byte(plain))
	require.Equal(t, want, got)

	// A corrupt gzip stream is an error, not a malformed line.
	bad := append([]byte(nil), z.Bytes()[:z.Len()/2]...)
	_, _, err = readAll(bad, 4096)
	require.Error(t, err)
	require.NotErrorIs(t, err, io.EOF)
}

// TestLargeRecordMemory: reading a 32 MiB message holds about twice the message, not the line
// (64 MiB of hex) or more. The bound is on the bytes the Reader allocates, which do not depend on
// the collector's timing.
func TestLargeRecordMemory(t *testing.T) {
	const size = 32 << 20
	data := bytes.Repeat([]byte{0xab}, size)
	line := hex.AppendEncode([]byte("0/1\t1\t"), data)
	line = append(line, "\n0/2\t1\t43\n"...)
	in := bytes.NewReader(line)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r := capture.NewReader(in)
	rec, err := r.Next()
	require.NoError(t, err)
	runtime.ReadMemStats(&after)
	require.Equal(t, size, len(rec.Data))
	require.True(t, bytes.Equal(data, rec.Data))
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d bytes for a %d-byte message", allocated, size)
	require.Less(t, allocated, uint64(2*size+size/4))
	rec, err = r.Next()
	require.NoError(t, err)
	require.Equal(t, []byte{0x43}, rec.Data)
}
