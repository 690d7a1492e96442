package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
)

// TestMain stops the servers pgtest.Shared starts in this package's tests.
func TestMain(m *testing.M) { pgtest.Main(m) }

const recordTestWorkload = `-- setup
CREATE TABLE items (id int PRIMARY KEY, note text);
-- workload
BEGIN;
INSERT INTO items SELECT g, repeat('n', 200) FROM generate_series(1, 1500) g;
SAVEPOINT a;
UPDATE items SET note = 'rolled back' WHERE id <= 1000;
ROLLBACK TO SAVEPOINT a;
DELETE FROM items WHERE id > 1400;
COMMIT;
INSERT INTO items VALUES (0, 'small');
`

// readCapture returns the comment lines and the first byte (message type) of every record.
func readCapture(t *testing.T, path string) (comments string, types []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(l, "#") {
			comments += l + "\n"
		}
	}
	r := capture.NewReader(strings.NewReader(string(b)))
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return comments, types
		}
		require.NoError(t, err)
		types = append(types, rec.Data[0])
	}
}

func count(types []byte, c byte) int { return strings.Count(string(types), string(c)) }

func checkRecorded(t *testing.T, dir string, major int) {
	t.Helper()
	comments, plain := readCapture(t, filepath.Join(dir, "plain.capture"))
	require.Contains(t, comments, "# server: PostgreSQL ")
	require.Contains(t, comments, "'proto_version', '1'")
	require.Contains(t, comments, "#     CREATE TABLE items", "the workload is in the header")
	require.Zero(t, count(plain, 'S'), "plain capture has no Stream Start")
	require.Equal(t, 2, count(plain, 'C'))
	require.Equal(t, 1501, count(plain, 'I'))
	require.Equal(t, 100, count(plain, 'D'))
	require.Zero(t, count(plain, 'U'), "the rolled-back update is not sent")

	comments, streamed := readCapture(t, filepath.Join(dir, "stream-v2.capture"))
	require.Contains(t, comments, "'streaming', 'on'")
	require.Contains(t, comments, "logical_decoding_work_mem = 64kB")
	require.NotZero(t, count(streamed, 'S'), "streamed capture has Stream Start")
	require.Equal(t, count(streamed, 'S'), count(streamed, 'E'))
	require.Equal(t, 1, count(streamed, 'c'), "one Stream Commit")
	require.NotZero(t, count(streamed, 'A'), "the streamed savepoint's Stream Abort")

	_, err := os.Stat(filepath.Join(dir, "stream-v4-parallel.capture"))
	if major >= 16 {
		require.NoError(t, err)
	} else {
		require.ErrorIs(t, err, os.ErrNotExist)
	}
}

func writeWorkload(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "w.sql")
	require.NoError(t, os.WriteFile(path, []byte(recordTestWorkload), 0o644))
	return path
}

// TestRecordThrowaway records on a server the command starts itself.
func TestRecordThrowaway(t *testing.T) {
	major := pgtest.Majors(t)[0]
	dir := filepath.Join(t.TempDir(), "out")
	require.NoError(t, runRecord(context.Background(), []string{"-pg-major", strconv.Itoa(major), "-o", dir, writeWorkload(t)}))
	checkRecorded(t, dir, major)
}

// TestRecordDSN records on a server given by -source.
func TestRecordDSN(t *testing.T) {
	majors := pgtest.Majors(t)
	major := majors[len(majors)-1]
	s := pgtest.Shared(t, major)
	db := pgtest.NewDatabase(t, s)
	dir := t.TempDir()
	require.NoError(t, runRecord(context.Background(), []string{"-source", s.ConnString(db), "-o", dir, writeWorkload(t)}))
	checkRecorded(t, dir, major)
}

func TestRecordUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"w.sql"}, // no -o
		{"-o", "x", "a.sql", "b.sql"},
		{"-o", "x", "-source", "host=/tmp", "-pg-major", "15", "w.sql"},
	} {
		err := runRecord(context.Background(), args)
		require.ErrorIs(t, err, flag.ErrHelp, "%q", args)
	}
	err := runRecord(context.Background(), []string{"-o", t.TempDir(), "-variants", "plain,nope", writeWorkload(t)})
	require.ErrorContains(t, err, `unknown variant "nope"`)
}
