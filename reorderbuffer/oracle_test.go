package reorderbuffer_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// reorder feeds captured messages through a Buffer and returns the committed transactions as
// describe prints them, with the buffer's statistics.
func reorder(t testing.TB, recs []capture.Record, cfg reorderbuffer.Config) ([]string, reorderbuffer.Stats) {
	t.Helper()
	b, err := reorderbuffer.New(cfg)
	require.NoError(t, err)
	defer b.Close()
	var out []string
	limit := cfg.WorkMem
	if limit < 0 {
		limit = 0
	}
	for i, r := range recs {
		require.NoError(t, b.Add(r.LSN, r.Data), "record %d", i)
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			line, err := describe(x)
			require.NoError(t, err)
			if line != "" {
				out = append(out, line)
			}
			b.Ack(x)
		}
		require.LessOrEqual(t, b.Stats().MemoryBytes, limit)
	}
	st := b.Stats()
	require.Zero(t, st.OpenTxns, "transactions left open at the end of the capture")
	if cfg.WorkMem > 0 {
		require.LessOrEqual(t, st.PeakMemoryBytes, cfg.WorkMem, "peak memory over the limit")
	}
	return out, st
}

// describe prints what a streamed and a plain reading of a transaction must agree on, on one
// line: its xid, positions, commit time and origin, and each change with its relation's name and
// its columns. A transaction without changes is "": the server sends nothing for it with
// streaming off, a Stream Commit with it on. The gid is left out: a two-phase reading names what
// a plain reading sees as an ordinary commit.
func describe(x *reorderbuffer.Txn) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "xid %d commit %s end %s at %s origin %q:", x.Xid, x.CommitLSN, x.EndLSN,
		x.CommitTime.UTC().Format(time.RFC3339Nano), x.Origin)
	var schema decoding.Schema // the change's
	name := func(id uint32) string {
		if r, ok := schema.Relation(id); ok {
			return r.Namespace + "." + r.Name
		}
		return fmt.Sprintf("unknown relation %d", id)
	}
	tuple := func(what string, tup decoding.Tuple) {
		fmt.Fprintf(&b, " %s(", what)
		for i, c := range tup {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%c%q", c.Kind, c.Data)
		}
		b.WriteByte(')')
	}
	changes := 0
	for c, err := range x.Changes() {
		if err != nil {
			return "", err
		}
		schema = c.Schema
		if rc, ok := c.Msg.(decoding.RowChange); ok {
			if r, _ := schema.Relation(rc.RelationOID()); r != c.Relation {
				return "", fmt.Errorf("%T yielded with relation %v, the schema says %v", c.Msg, c.Relation, r)
			}
		}
		switch m := c.Msg.(type) {
		case *decoding.Relation, *decoding.DataType:
			continue
		case *decoding.Insert:
			fmt.Fprintf(&b, " | insert %s", name(m.RelationID))
			tuple("new", m.New)
		case *decoding.Update:
			fmt.Fprintf(&b, " | update %s", name(m.RelationID))
			if m.OldKind != 0 {
				tuple(string(m.OldKind), m.Old)
			}
			tuple("new", m.New)
		case *decoding.Delete:
			fmt.Fprintf(&b, " | delete %s", name(m.RelationID))
			tuple(string(m.OldKind), m.Old)
		case *decoding.Truncate:
			fmt.Fprintf(&b, " | truncate options %d", m.Options)
			for _, id := range m.RelationIDs {
				b.WriteString(" " + name(id))
			}
		case *decoding.LogicalMessage:
			fmt.Fprintf(&b, " | message %q %q transactional %v", m.Prefix, m.Content, m.Transactional())
		default:
			return "", fmt.Errorf("unexpected %T in a committed transaction", m)
		}
		changes++
	}
	if changes == 0 {
		return "", nil
	}
	return b.String(), nil
}

// TestOracle is the differential test against PostgreSQL itself: for each workload, two slots
// created back to back are read with streaming off (the server reorders) and with streaming on
// at logical_decoding_work_mem = 64kB; the Buffer fed the streamed messages must hand out exactly
// the server's non-streamed transactions, whatever its own memory limit.
func TestOracle(t *testing.T) {
	files, err := filepath.Glob("testdata/workloads/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, major := range pgtest.Majors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			for _, f := range files {
				name := strings.TrimSuffix(filepath.Base(f), ".sql")
				t.Run(name, func(t *testing.T) {
					text, err := os.ReadFile(f)
					require.NoError(t, err)
					w, err := pgtest.ParseWorkload(string(text))
					require.NoError(t, err)
					db := pgtest.NewDatabase(t, srv)
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					caps, err := pgtest.Record(ctx, srv.ConnString(db), w, pgtest.RecordOptions{})
					require.NoError(t, err)
					checkCaptures(t, caps)
				})
			}
		})
	}
}

func checkCaptures(t *testing.T, caps []pgtest.Capture) {
	var plain, independent []string
	for _, c := range caps {
		if !c.Variant.Streamed() {
			lines, _ := reorder(t, c.Records, reorderbuffer.Config{WorkMem: math.MaxInt64, Dir: t.TempDir()})
			plain = lines
			independent = independentPlain(t, c.Records)
			sameLines(t, independent, ours(t, c.Records, reorderbuffer.Config{Dir: t.TempDir()}),
				"the plain reading decoded by pglogrepl and by us")
		}
	}
	require.NotNil(t, plain, "no non-streamed capture")
	require.NotEmpty(t, plain, "the workload committed nothing")
	streamedAny := false
	for _, c := range caps {
		if !c.Variant.Streamed() {
			continue
		}
		for _, limit := range []int64{math.MaxInt64, 1 << 20, 64 << 10, reorderbuffer.SpillEverything} {
			dir := t.TempDir()
			lines, st := reorder(t, c.Records, reorderbuffer.Config{
				WorkMem:  limit,
				Dir:      dir,
				Decoding: decoding.Options{ProtoVersion: c.Variant.ProtoVersion},
			})
			require.Equal(t, plain, lines, "%s at work mem %d", c.Variant.Name, limit)
			for _, incremental := range []bool{false, true} {
				sameLines(t, independent, ours(t, c.Records, reorderbuffer.Config{
					WorkMem: limit, Dir: dir, Decoding: decoding.Options{ProtoVersion: c.Variant.ProtoVersion},
					Incremental: incremental,
				}), fmt.Sprintf("%s at work mem %d (incremental %v), against pglogrepl's reading of the plain stream",
					c.Variant.Name, limit, incremental))
			}
			streamedAny = streamedAny || st.StreamTxns > 0
			if limit == reorderbuffer.SpillEverything && st.StreamTxns > 0 {
				require.Positive(t, st.SpillBytes)
			}
			ents, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, ents, "spill files left behind")
		}
	}
	require.True(t, streamedAny, "no variant streamed: the workload is too small to test streaming")
}
