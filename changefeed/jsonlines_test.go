package changefeed_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
)

// smallTxn is one committed transaction of one insert, ending at end.
func smallTxn(xid uint32, end decoding.LSN) []decoding.Message {
	return []decoding.Message{
		&decoding.Begin{FinalLSN: end - 8, Xid: xid},
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}}},
		&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("1")}}},
		&decoding.Commit{CommitLSN: end - 8, EndLSN: end},
	}
}

// failingTxn is a transaction with a change for a relation the stream never described, after
// kilobytes of output.
func failingTxn() []decoding.Message {
	msgs := []decoding.Message{
		&decoding.Begin{FinalLSN: 0x9000, Xid: 800},
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}, {Name: "v", TypeOID: 25}}},
	}
	for range 50 {
		msgs = append(msgs, &decoding.Insert{RelationID: 1, New: decoding.Tuple{
			{Kind: 't', Data: []byte("1")}, {Kind: 't', Data: bytes.Repeat([]byte{'v'}, 1<<10)}}})
	}
	msgs = append(msgs, &decoding.Insert{RelationID: 2, New: decoding.Tuple{{Kind: 'n'}}})
	return append(msgs, &decoding.Commit{CommitLSN: 0x9000, EndLSN: 0x9030})
}

// txnOf runs msgs through a reorder buffer and calls f with the transaction they make.
func txnOf(t *testing.T, msgs []decoding.Message, f func(*reorderbuffer.Txn) error) error {
	t.Helper()
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	defer b.Close()
	var ferr error
	n := 0
	for _, m := range msgs {
		data, err := decoding.Append(nil, m, false, decoding.Options{})
		require.NoError(t, err)
		require.NoError(t, b.Add(0, data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			ferr = f(x)
			n++
		}
	}
	require.Equal(t, 1, n, "one transaction")
	return ferr
}

// writeTxn hands j one transaction as Run does: a unit, the handler, the commit with the
// transaction's end, or the rollback.
func writeTxn(t *testing.T, j *changefeed.JSONLines, msgs []decoding.Message) error {
	t.Helper()
	ctx := context.Background()
	return txnOf(t, msgs, func(x *reorderbuffer.Txn) error {
		u, err := j.Begin(ctx, changefeed.StreamWorker)
		if err != nil {
			return err
		}
		if err := j.Handle(ctx, &changefeed.Batch{Kind: changefeed.Transaction, Txn: x, Worker: changefeed.StreamWorker, Unit: u}); err != nil {
			u.Rollback(ctx)
			return err
		}
		p := changefeed.Position{Slot: "s", SystemID: "1", CopyDone: true, EndLSN: x.EndLSN}
		if err := u.Commit(ctx, &p); err != nil {
			u.Rollback(ctx)
			return err
		}
		return nil
	})
}

// openJSONLines opens the output at path and starts it as Run does: Load, then a Reset (nothing
// stored, with the starting position stored) or a Resume. It returns the stored position.
func openJSONLines(t *testing.T, path string, cfg changefeed.JSONLinesConfig) (*changefeed.JSONLines, changefeed.Position, error) {
	t.Helper()
	ctx := context.Background()
	j, err := changefeed.OpenJSONLines(path, cfg)
	if err != nil {
		return nil, changefeed.Position{}, err
	}
	p, ok, err := j.Load(ctx, "s")
	if err != nil {
		j.Close()
		return nil, changefeed.Position{}, err
	}
	u, err := j.Begin(ctx, changefeed.StreamWorker)
	require.NoError(t, err)
	if !ok {
		require.NoError(t, j.Handle(ctx, &changefeed.Batch{Kind: changefeed.Reset, Worker: changefeed.StreamWorker, Unit: u}))
		p = changefeed.Position{Slot: "s", SystemID: "1", CopyDone: true}
		require.NoError(t, u.Commit(ctx, &p))
		return j, p, nil
	}
	if err := j.Handle(ctx, &changefeed.Batch{Kind: changefeed.Resume, Worker: changefeed.StreamWorker, State: p.State, Unit: u}); err != nil {
		j.Close()
		return nil, changefeed.Position{}, err
	}
	require.NoError(t, u.Commit(ctx, nil))
	return j, p, nil
}

// stored returns the position stored for path, and the output's length it records.
func stored(t *testing.T, path string) (decoding.LSN, int) {
	t.Helper()
	s, err := changefeed.OpenFile(path + changefeed.PositionSuffix)
	require.NoError(t, err)
	defer s.Close()
	p, ok, err := s.Load(context.Background(), "s")
	require.NoError(t, err)
	require.True(t, ok)
	n := 0
	for _, c := range p.State {
		n = n*10 + int(c-'0')
	}
	return p.EndLSN, n
}

// checkLines checks that every line is one JSON object.
func checkLines(t *testing.T, out []byte) {
	t.Helper()
	require.True(t, len(out) == 0 || out[len(out)-1] == '\n', "output ends with a newline")
	for line := range bytes.Lines(out) {
		var v map[string]any
		require.NoError(t, json.Unmarshal(line, &v), "%s", line)
	}
}

func TestJSONLines(t *testing.T) {
	for _, kind := range format.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.jsonl")
			cfg := changefeed.JSONLinesConfig{Format: format.Config{Kind: kind}}
			j, p, err := openJSONLines(t, path, cfg)
			require.NoError(t, err)
			require.Zero(t, p.EndLSN)
			require.FileExists(t, path+changefeed.PositionSuffix, "a new output records its empty state at once")
			require.NoError(t, writeTxn(t, j, smallTxn(10, 0x100)))
			require.NoError(t, writeTxn(t, j, smallTxn(11, 0x200)))
			end, size := stored(t, path)
			require.Equal(t, decoding.LSN(0x200), end)
			require.NoError(t, j.Close())
			require.NoError(t, j.Close())
			require.ErrorIs(t, writeTxn(t, j, smallTxn(12, 0x300)), changefeed.ErrClosed)
			whole, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Len(t, whole, size)
			checkLines(t, whole)

			// The process died while writing a third transaction: a torn line at the end.
			fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			fh.Write([]byte(`{"xid":12,"commit_lsn":"0/2F8","end_l`))
			fh.Close()
			j, p, err = openJSONLines(t, path, cfg)
			require.NoError(t, err)
			require.Equal(t, decoding.LSN(0x200), p.EndLSN)
			got, _ := os.ReadFile(path)
			require.Equal(t, string(whole), string(got), "the torn line is cut")

			// A transaction that fails leaves the file as it was.
			require.ErrorIs(t, writeTxn(t, j, failingTxn()), format.ErrUnknownRelation)
			got, _ = os.ReadFile(path)
			require.Equal(t, string(whole), string(got))
			require.NoError(t, writeTxn(t, j, smallTxn(12, 0x300)))
			end, _ = stored(t, path)
			require.Equal(t, decoding.LSN(0x300), end)
			require.NoError(t, j.Close())
			got, _ = os.ReadFile(path)
			require.True(t, bytes.HasPrefix(got, whole))
			checkLines(t, got)
			require.Equal(t, bytes.Count(whole, []byte{'\n'})+1, bytes.Count(got, []byte{'\n'}))
		})
	}
}

// TestJSONLinesLegacyPosition: the position file of an earlier release's output (its length and
// end LSN) is read, the output cut back to it, and replaced in the new form at the next commit.
func TestJSONLinesLegacyPosition(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("{\"a\":1}\n{\"torn"), 0o600))
	require.NoError(t, os.WriteFile(path+changefeed.PositionSuffix, []byte("pgreorder output position v1\noffset 8\nend_lsn 0/100\n"), 0o600))
	j, p, err := openJSONLines(t, path, changefeed.JSONLinesConfig{})
	require.NoError(t, err)
	require.Equal(t, decoding.LSN(0x100), p.EndLSN)
	require.True(t, p.CopyDone)
	require.Empty(t, p.SystemID, "Run adopts the server's")
	got, _ := os.ReadFile(path)
	require.Equal(t, "{\"a\":1}\n", string(got))
	require.NoError(t, writeTxn(t, j, smallTxn(11, 0x200)))
	require.NoError(t, j.Close())
	end, size := stored(t, path)
	require.Equal(t, decoding.LSN(0x200), end)
	got, _ = os.ReadFile(path)
	require.Len(t, got, size)
	require.True(t, strings.HasPrefix(string(got), "{\"a\":1}\n{\"xid\":11"))
}

func TestJSONLinesPositionErrors(t *testing.T) {
	dir := t.TempDir()
	// Data but no position file: someone else's file.
	foreign := filepath.Join(dir, "foreign.jsonl")
	require.NoError(t, os.WriteFile(foreign, []byte("{}\n"), 0o600))
	_, _, err := openJSONLines(t, foreign, changefeed.JSONLinesConfig{})
	require.ErrorIs(t, err, changefeed.ErrStore)
	require.ErrorContains(t, err, "not written by this program")
	got, _ := os.ReadFile(foreign)
	require.Equal(t, "{}\n", string(got), "left alone")

	// A position past the end of the file: data was lost.
	path := filepath.Join(dir, "out.jsonl")
	j, _, err := openJSONLines(t, path, changefeed.JSONLinesConfig{})
	require.NoError(t, err)
	require.NoError(t, writeTxn(t, j, smallTxn(10, 0x100)))
	require.ErrorIs(t, j.Handle(context.Background(), nil), changefeed.ErrInvalidConfig, "misuse is an error")
	require.NoError(t, j.Close())
	require.NoError(t, os.Truncate(path, 3))
	_, _, err = openJSONLines(t, path, changefeed.JSONLinesConfig{})
	require.ErrorIs(t, err, changefeed.ErrStore)

	// A damaged position file.
	require.NoError(t, os.WriteFile(path+changefeed.PositionSuffix, []byte("offset 3\n"), 0o600))
	_, _, err = openJSONLines(t, path, changefeed.JSONLinesConfig{})
	require.ErrorIs(t, err, changefeed.ErrStore)

	_, err = changefeed.OpenJSONLines(path, changefeed.JSONLinesConfig{Format: format.Config{Kind: "csv"}})
	require.ErrorIs(t, err, format.ErrUnknownKind)
	require.ErrorIs(t, err, changefeed.ErrInvalidConfig)
	_, err = changefeed.OpenJSONLines(filepath.Join(dir, "missing", "out.jsonl"), changefeed.JSONLinesConfig{})
	require.Error(t, err)
}

// TestJSONLinesFaults: a fault while a transaction is made durable (ENOSPC writing the output or
// the position file, EIO on their fsync, a rename of the position file that fails, EIO on the
// directory's fsync) fails the unit with that error, and no position is claimed that was not made
// durable. After a fault in the output the unit's rollback cuts the transaction off again and the
// output takes the next; after one in the position file (which may hold the old position or the
// new) it takes no more. Opened again, output and position agree: the last transaction whose
// position file was renamed into place is the last in the output.
func TestJSONLinesFaults(t *testing.T) {
	const name = "out.jsonl"
	is := func(base string) func(string) bool { return func(p string) bool { return filepath.Base(p) == base } }
	tmp := name + changefeed.PositionSuffix + vfs.TempSuffix
	for _, tc := range []struct {
		name    string
		rule    func(dir string) faultfs.Rule
		goesOn  bool // the output takes further transactions once the fault is gone
		renamed bool // the failed transaction's position is in place all the same
	}{
		{"output disk full", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpWrite, Match: is(name), Err: syscall.ENOSPC, Partial: true}
		}, true, false},
		{"output fsync", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: is(name), Err: syscall.EIO}
		}, true, false},
		{"position disk full", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpWrite, Match: is(tmp), Err: syscall.ENOSPC, Partial: true}
		}, false, false},
		{"position fsync", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: is(tmp), Err: syscall.EIO}
		}, false, false},
		{"position rename", func(string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpRename, Match: is(tmp), Err: syscall.EIO}
		}, false, false},
		{"directory fsync", func(dir string) faultfs.Rule {
			return faultfs.Rule{Op: faultfs.OpSync, Match: func(p string) bool { return p == dir }, Err: syscall.EIO}
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, name)
			ffs := faultfs.New(vfs.OS())
			j, _, err := openJSONLines(t, path, changefeed.JSONLinesConfig{FS: ffs})
			require.NoError(t, err)
			require.NoError(t, writeTxn(t, j, smallTxn(10, 0x100)))
			before, err := os.ReadFile(path)
			require.NoError(t, err)

			rule := tc.rule(dir)
			ffs.Add(rule)
			require.ErrorIs(t, writeTxn(t, j, smallTxn(11, 0x200)), rule.Err)
			require.Equal(t, 1, ffs.Fired())
			ffs.Reset()
			want, lines := decoding.LSN(0x100), 1
			if tc.goesOn {
				got, err := os.ReadFile(path)
				require.NoError(t, err)
				require.Equal(t, string(before), string(got), "the failed transaction is cut off")
				require.NoError(t, writeTxn(t, j, smallTxn(12, 0x300)))
				want, lines = 0x300, 2
			} else {
				require.ErrorContains(t, writeTxn(t, j, smallTxn(12, 0x300)), "refusing to write after storing a position failed")
				if tc.renamed {
					want, lines = 0x200, 2
				}
			}
			require.NoError(t, j.Close())

			j, p, err := openJSONLines(t, path, changefeed.JSONLinesConfig{})
			require.NoError(t, err)
			defer j.Close()
			require.Equal(t, want, p.EndLSN)
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			_, size := stored(t, path)
			require.Len(t, got, size)
			require.True(t, bytes.HasPrefix(got, before))
			require.Equal(t, lines, bytes.Count(got, []byte{'\n'}))
			checkLines(t, got)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Len(t, entries, 2, "the output and its position file, no temporary file")
		})
	}
}

// TestJSONLinesCrash: the process dies at each step of a transaction's unit in turn (every
// operation from there on fails, nothing more reaches the disk): between the output's write and
// its fsync, between the position file's write and its rename, after the rename... Opened again,
// the output resumes after the previous transaction, with the output as it was, or after the new
// one, with it whole; after a commit that returned nil, always the new one.
func TestJSONLinesCrash(t *testing.T) {
	// open opens an output through a new faultfs.FS and writes a first transaction.
	open := func() (string, *faultfs.FS, *changefeed.JSONLines) {
		path := filepath.Join(t.TempDir(), "out.jsonl")
		ffs := faultfs.New(vfs.OS())
		j, _, err := openJSONLines(t, path, changefeed.JSONLinesConfig{FS: ffs})
		require.NoError(t, err)
		require.NoError(t, writeTxn(t, j, smallTxn(10, 0x100)))
		return path, ffs, j
	}
	path, ffs, j := open()
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	seen := 0
	ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Match: func(string) bool { seen++; return false }})
	require.NoError(t, writeTxn(t, j, smallTxn(11, 0x200)))
	ops := seen
	require.NoError(t, j.Close())
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, ops, 9, "the output's write and fsync, then the position file's remove, create, write, sync, close, rename, and the directory's sync")

	outcomes := map[decoding.LSN]int{}
	for crash := range ops + 1 {
		path, ffs, j := open()
		ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Skip: crash, Err: syscall.EIO})
		err := writeTxn(t, j, smallTxn(11, 0x200))
		j.Close() // the process dies: its descriptors are closed, nothing more is written
		require.Equal(t, crash == ops, err == nil, "crash after %d of %d operations: %v", crash, ops, err)

		j, p, err := openJSONLines(t, path, changefeed.JSONLinesConfig{})
		require.NoError(t, err, "crash after %d operations", crash)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		switch p.EndLSN {
		case 0x100:
			require.Equal(t, string(before), string(got), "crash after %d operations", crash)
			require.Less(t, crash, ops)
		case 0x200:
			require.Equal(t, string(after), string(got), "crash after %d operations", crash)
		default:
			t.Fatalf("crash after %d operations: resumes after %s", crash, p.EndLSN)
		}
		outcomes[p.EndLSN]++
		require.NoError(t, j.Close())
	}
	require.Equal(t, map[decoding.LSN]int{0x100: ops - 1, 0x200: 2}, outcomes,
		"the new position is there once the rename was made, before the directory's fsync")
}

// TestJSONLinesTableReset: a TableReset cuts the output back to its State, the length stored
// when the added table's copy began, whatever was written since without a position.
func TestJSONLinesTableReset(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "out.jsonl")
	j, _, err := openJSONLines(t, path, changefeed.JSONLinesConfig{})
	require.NoError(t, err)
	defer j.Close()
	require.NoError(t, writeTxn(t, j, smallTxn(700, 0x1000)))
	_, n := stored(t, path)
	require.Positive(t, n)
	// Written and made durable, but stored with no position, as an added table's chunks are.
	require.NoError(t, txnOf(t, smallTxn(701, 0x2000), func(x *reorderbuffer.Txn) error {
		u, err := j.Begin(ctx, changefeed.StreamWorker)
		require.NoError(t, err)
		require.NoError(t, j.Handle(ctx, &changefeed.Batch{Kind: changefeed.Transaction, Txn: x, Worker: changefeed.StreamWorker, Unit: u}))
		return u.Commit(ctx, nil)
	}))
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Greater(t, int(st.Size()), n)
	u, err := j.Begin(ctx, changefeed.StreamWorker)
	require.NoError(t, err)
	require.NoError(t, j.Handle(ctx, &changefeed.Batch{Kind: changefeed.TableReset, Worker: changefeed.StreamWorker, Unit: u,
		State: []byte(strconv.Itoa(n)), Table: &changefeed.TableRef{OID: 1, Schema: "public", Name: "t"}}))
	require.NoError(t, u.Commit(ctx, nil))
	st, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, n, int(st.Size()))
}
