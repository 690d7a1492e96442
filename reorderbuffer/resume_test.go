package reorderbuffer_test

import (
	"runtime"
	"strings"
	"syscall"
	"testing"
	"weak"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
)

// Tests of what a consumer goes through beyond an uninterrupted stream: resuming with a skip
// position, schema changes read late, out-of-order acknowledgements, misuse while reading, and
// messages for transactions whose beginning never arrived.

func prepared(t testing.TB, xid uint32, gid string, at decoding.LSN, rel *decoding.Relation, vals ...string) [][]byte {
	out := [][]byte{enc(t, &decoding.BeginPrepare{PrepareLSN: at, EndLSN: at + 8, PrepareTime: epoch, Xid: xid, GID: gid}, false)}
	if rel != nil {
		out = append(out, enc(t, rel, false))
	}
	for _, v := range vals {
		out = append(out, enc(t, insert(1, 0, v), false))
	}
	return append(out, enc(t, &decoding.Prepare{PrepareLSN: at, EndLSN: at + 8, PrepareTime: epoch, Xid: xid, GID: gid}, false))
}

func commitPrepared(t testing.TB, xid uint32, gid string, end decoding.LSN) []byte {
	return enc(t, &decoding.CommitPrepared{CommitLSN: end - 8, EndLSN: end, CommitTime: epoch, Xid: xid, GID: gid}, false)
}

// plainNoSchema is a plain transaction that relies on relation 1 being described earlier.
func plainNoSchema(t testing.TB, xid uint32, end decoding.LSN, vals ...string) [][]byte {
	out := [][]byte{enc(t, &decoding.Begin{FinalLSN: end - 8, CommitTime: epoch, Xid: xid}, false)}
	for _, v := range vals {
		out = append(out, enc(t, insert(1, 0, v), false))
	}
	return append(out, enc(t, &decoding.Commit{CommitLSN: end - 8, EndLSN: end, CommitTime: epoch}, false))
}

// column returns the name of the first column of the relation each insert of x refers to.
func columns(t testing.TB, x *reorderbuffer.Txn) []string {
	t.Helper()
	var names []string
	for c, err := range x.Changes() {
		m := c.Msg
		require.NoError(t, err)
		if ins, ok := m.(*decoding.Insert); ok {
			r, ok := c.Relation, c.Relation != nil
			require.True(t, ok, "relation %d unknown", ins.RelationID)
			names = append(names, r.Columns[0].Name)
		}
	}
	return names
}

func relationNamed(col string) *decoding.Relation {
	r := relation(1, 0)
	r.Columns[0].Name = col
	return r
}

func TestCommitPreparedOfATransactionNeverReceived(t *testing.T) {
	// Replication that starts between PREPARE and COMMIT PREPARED gets only COMMIT PREPARED:
	// the changes are gone. Unless the consumer already has the transaction, that is an error.
	b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0x1000})
	err := b.Add(0x2000, commitPrepared(t, 12, "lost", 0x2008))
	var me *reorderbuffer.MissingError
	require.ErrorAs(t, err, &me)
	require.ErrorIs(t, err, reorderbuffer.ErrProtocol)
	require.Equal(t, "lost", me.GID)
	require.Equal(t, decoding.LSN(0x2000), me.LSN)
	require.Contains(t, err.Error(), `"lost"`)
	require.ErrorIs(t, b.Add(0, streamCommit(t, 1, 0x3000)), reorderbuffer.ErrFailed)

	t.Run("at or before SkipThrough it is what the consumer has", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0x3000})
		feed(t, b, commitPrepared(t, 12, "done", 0x2008))
		_, ok := b.Next()
		require.False(t, ok)
		require.EqualValues(t, 1, b.Stats().SkippedTxns)
	})
}

func TestStreamCommitOfATransactionNeverReceived(t *testing.T) {
	b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0x1000})
	err := b.Add(0x2000, streamCommit(t, 10, 0x2000))
	var me *reorderbuffer.MissingError
	require.ErrorAs(t, err, &me)
	require.Equal(t, uint32(10), me.Xid)

	t.Run("at or before SkipThrough", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0x2000})
		feed(t, b, streamCommit(t, 10, 0x2000))
		_, ok := b.Next()
		require.False(t, ok)
	})
}

func TestBeginWhileStreamedPartOpen(t *testing.T) {
	// One session never sends a transaction both streamed and whole: a Begin for the xid of an
	// open streamed transaction means a new session was fed without Restart. The Begin is the
	// message that shows it, so the Begin is rejected, with its position.
	streamPrepare := func(t testing.TB, xid uint32, gid string, at decoding.LSN) []byte {
		return enc(t, &decoding.StreamPrepare{PrepareLSN: at, EndLSN: at + 8, PrepareTime: epoch, Xid: xid, GID: gid}, false)
	}
	const at = decoding.LSN(0x5000) // where the whole transaction is fed
	for _, tc := range []struct {
		name    string
		cfg     reorderbuffer.Config
		before  func(t testing.TB) [][]byte // fed first
		restart bool                        // Restart after before
		whole   func(t testing.TB) [][]byte // fed at at, at+1, ...
		typ     decoding.MessageType        // the message rejected, 0 if none
		want    []string                    // what is handed out, if nothing is rejected
	}{
		{
			name:   "Begin",
			before: func(t testing.TB) [][]byte { return streamTxn(t, 10, true, "streamed") },
			whole:  func(t testing.TB) [][]byte { return plainTxn(t, 10, 0x3000, "whole") },
			typ:    decoding.MsgBegin,
		},
		{
			name:   "Begin after several stream blocks",
			before: func(t testing.TB) [][]byte { return flat(streamTxn(t, 10, true, "a"), streamTxn(t, 10, false, "b")) },
			whole:  func(t testing.TB) [][]byte { return plainTxn(t, 10, 0x3000, "whole") },
			typ:    decoding.MsgBegin,
		},
		{
			name:   "Begin Prepare",
			before: func(t testing.TB) [][]byte { return streamTxn(t, 10, true, "streamed") },
			whole:  func(t testing.TB) [][]byte { return prepared(t, 10, "g", 0x3000, relation(1, 0), "whole") },
			typ:    decoding.MsgBeginPrepare,
		},
		{
			name:   "Begin, in parts",
			cfg:    reorderbuffer.Config{Incremental: true},
			before: func(t testing.TB) [][]byte { return streamTxn(t, 10, true, "streamed") },
			whole:  func(t testing.TB) [][]byte { return plainTxn(t, 10, 0x3000, "whole") },
			typ:    decoding.MsgBegin,
		},
		{
			name:   "Begin of a transaction the consumer has",
			cfg:    reorderbuffer.Config{SkipThrough: 0x3000},
			before: func(t testing.TB) [][]byte { return streamTxn(t, 10, true, "streamed") },
			whole:  func(t testing.TB) [][]byte { return plainTxn(t, 10, 0x3000, "whole") },
		},
		{
			name:    "Begin after Restart",
			before:  func(t testing.TB) [][]byte { return streamTxn(t, 10, true, "streamed") },
			restart: true,
			whole:   func(t testing.TB) [][]byte { return plainTxn(t, 10, 0x3000, "whole") },
			want:    []string{"whole"},
		},
		{
			name: "Begin after Stream Commit",
			before: func(t testing.TB) [][]byte {
				return append(streamTxn(t, 10, true, "streamed"), streamCommit(t, 10, 0x2000))
			},
			whole: func(t testing.TB) [][]byte { return plainTxn(t, 10, 0x3000, "whole") },
			want:  []string{"streamed", "whole"},
		},
		{
			name: "Begin Prepare of a streamed transaction prepared",
			before: func(t testing.TB) [][]byte {
				return append(streamTxn(t, 10, true, "streamed"), streamPrepare(t, 10, "g", 0x2000))
			},
			whole: func(t testing.TB) [][]byte {
				return append(prepared(t, 10, "g", 0x2000, relation(1, 0), "streamed"), commitPrepared(t, 10, "g", 0x3000))
			},
			want: []string{"streamed"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuffer(t, tc.cfg)
			feed(t, b, tc.before(t)...)
			if tc.restart {
				require.NoError(t, b.Restart())
			}
			var err error
			var typ decoding.MessageType
			for i, m := range tc.whole(t) {
				if err = b.Add(at+decoding.LSN(i), m); err != nil {
					typ = decoding.MessageType(m[0])
					break
				}
			}
			var got []string
			for x, ok := b.Next(); ok; x, ok = b.Next() {
				if x.Part == reorderbuffer.Whole || x.Part == reorderbuffer.PartCommit {
					got = append(got, values(t, x)...)
				}
			}
			if tc.typ == 0 {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			require.Equal(t, tc.typ, typ, "rejected at the wrong message: %v", err)
			require.ErrorIs(t, err, reorderbuffer.ErrProtocol)
			var ie *reorderbuffer.InputError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, at, ie.LSN)
			require.Equal(t, tc.typ, ie.Type)
			require.Contains(t, err.Error(), "transaction 10 ")
			require.Contains(t, err.Error(), "Restart")
			require.Empty(t, got, "a transaction with a lost part was handed out")
			require.ErrorIs(t, b.Add(0, streamCommit(t, 10, 0x4000)), reorderbuffer.ErrFailed)
		})
	}
}

func TestSchemaTakesEffectInStreamOrder(t *testing.T) {
	t.Run("a skipped transaction's schema reaches later ones", func(t *testing.T) {
		// The consumer applied the first transaction and crashed before acknowledging it: on
		// restart the server sends it again and the buffer skips it, but the second one relies
		// on the relation the first described.
		b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0x2000})
		feed(t, b, plainTxn(t, 10, 0x2000, "applied")...)
		feed(t, b, plainNoSchema(t, 11, 0x3000, "new")...)
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"v"}, columns(t, x))
	})
	t.Run("a PREPARE between two queued transactions", func(t *testing.T) {
		// T1 describes the relation with column "old" and stays queued; a prepared transaction
		// describes it with "new" (in effect from its PREPARE on); T3 relies on "new". Read in
		// order after all arrived, each resolves as of its own position.
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, enc(t, &decoding.Begin{FinalLSN: 0x1ff8, CommitTime: epoch, Xid: 10}, false),
			enc(t, relationNamed("old"), false), enc(t, insert(1, 0, "a"), false),
			enc(t, &decoding.Commit{CommitLSN: 0x1ff8, EndLSN: 0x2000, CommitTime: epoch}, false))
		feed(t, b, prepared(t, 11, "g", 0x2100, relationNamed("new"), "p")...)
		feed(t, b, plainNoSchema(t, 12, 0x3000, "b")...)
		feed(t, b, commitPrepared(t, 11, "g", 0x4000))
		var got [][]string
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			got = append(got, columns(t, x))
		}
		require.Equal(t, [][]string{{"old"}, {"new"}, {"new"}}, got)
	})
	t.Run("a transaction not read at all", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		feed(t, b, plainNoSchema(t, 11, 0x3000, "b")...)
		_, _ = b.Next() // skipped by the consumer
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"v"}, columns(t, x))
	})
	t.Run("a relation changed inside a transaction", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 9, 0x1000, "first")...)
		feed(t, b, enc(t, &decoding.Begin{FinalLSN: 0x1ff8, CommitTime: epoch, Xid: 10}, false),
			enc(t, insert(1, 0, "before"), false), // relies on the earlier description
			enc(t, relationNamed("renamed"), false), enc(t, insert(1, 0, "after"), false),
			enc(t, &decoding.Commit{CommitLSN: 0x1ff8, EndLSN: 0x2000, CommitTime: epoch}, false))
		x1, _ := b.Next()
		require.Equal(t, []string{"v"}, columns(t, x1))
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, []string{"v", "renamed"}, columns(t, x))
		require.Equal(t, []string{"v", "renamed"}, columns(t, x), "read again from the start")
	})
	t.Run("an aborted streamed transaction describes nothing", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 9, 0x1000, "first")...)
		feed(t, b, enc(t, &decoding.StreamStart{Xid: 10, FirstSegment: true}, false),
			enc(t, relationNamed("aborted"), true), enc(t, insert(1, 10, "x"), true), enc(t, &decoding.StreamStop{}, true),
			enc(t, &decoding.StreamAbort{Xid: 10, SubXid: 10}, false))
		feed(t, b, plainNoSchema(t, 11, 0x3000, "b")...)
		_, _ = b.Next()
		x, _ := b.Next()
		require.Equal(t, []string{"v"}, columns(t, x))
	})
	t.Run("a spilled transaction's schema, cut by a subtransaction abort", func(t *testing.T) {
		// The description sits in the spill log; the subtransaction that carried a second one
		// is rolled back; the schema in effect after the commit is the first one, found
		// without reading the log back.
		b := newBuffer(t, reorderbuffer.Config{WorkMem: reorderbuffer.SpillEverything})
		kept, cut := relationNamed("kept"), relationNamed("cut")
		kept.Xid, cut.Xid = 10, 11 // in a stream, the xid of the change that needs the description
		feed(t, b, enc(t, &decoding.StreamStart{Xid: 10, FirstSegment: true}, false),
			enc(t, kept, true), enc(t, insert(1, 10, "a"), true),
			enc(t, cut, true), enc(t, insert(1, 11, "b"), true),
			enc(t, &decoding.StreamStop{}, true),
			enc(t, &decoding.StreamAbort{Xid: 10, SubXid: 11}, false), streamCommit(t, 10, 0x2000))
		feed(t, b, plainNoSchema(t, 12, 0x3000, "c")...)
		require.Positive(t, b.Stats().SpillBytes)
		x, _ := b.Next()
		require.Equal(t, []string{"kept"}, columns(t, x))
		x, _ = b.Next()
		require.Equal(t, []string{"kept"}, columns(t, x))
	})
}

func TestAckedThroughIsThePrefix(t *testing.T) {
	b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0x1000})
	require.Equal(t, decoding.LSN(0x1000), b.AckedThrough())
	feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
	feed(t, b, plainTxn(t, 11, 0x3000, "b")...)
	x1, _ := b.Next()
	x2, _ := b.Next()
	require.NoError(t, b.Ack(x2))
	require.Equal(t, decoding.LSN(0x1000), b.AckedThrough(), "x1 is not acknowledged: resuming past it would lose it")
	st := b.Stats()
	require.Equal(t, 2, st.UnackedTxns, "acknowledged out of order, still pending")
	require.Equal(t, decoding.LSN(0x2000), st.OldestUnackedLSN)
	require.NoError(t, b.Ack(x1))
	require.Equal(t, decoding.LSN(0x3000), b.AckedThrough())
	require.NoError(t, b.Ack(x1), "twice is harmless")
	require.Zero(t, b.Stats().UnackedTxns)

	require.ErrorIs(t, b.Ack(nil), reorderbuffer.ErrForeignTxn)
	other := newBuffer(t, reorderbuffer.Config{})
	feed(t, other, plainTxn(t, 12, 0x4000, "c")...)
	y, _ := other.Next()
	require.ErrorIs(t, b.Ack(y), reorderbuffer.ErrForeignTxn)
	require.Equal(t, decoding.LSN(0x3000), b.AckedThrough())
}

func TestFlushNeverPastWhatWasReceived(t *testing.T) {
	// A resume position the server has not sent yet (a typo, or a position from another
	// server) is never reported as flushed: a PREPARE before it would be skipped for good.
	b := newBuffer(t, reorderbuffer.Config{SkipThrough: 0xFF00000000})
	require.Zero(t, b.FlushPosition())
	feed(t, b, prepared(t, 12, "g", 0x2000, relation(1, 0), "p")...)
	b.Keepalive(0x5000)
	require.Equal(t, decoding.LSN(0x2000), b.FlushPosition(), "pinned at the PREPARE, capped by what was received")
}

func TestReadingAReleasedTransaction(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int64
	}{{"in memory", 0}, {"spilled", reorderbuffer.SpillEverything}} {
		t.Run(tc.name, func(t *testing.T) {
			vals := make([]string, 300)
			for i := range vals {
				vals[i] = string(rune('a' + i%26))
			}
			for _, stop := range []string{"next", "close"} {
				b := newBuffer(t, reorderbuffer.Config{WorkMem: tc.limit})
				feed(t, b, plainTxn(t, 10, 0x2000, vals...)...)
				feed(t, b, plainTxn(t, 11, 0x3000, "other")...)
				x, _ := b.Next()
				n := 0
				var last error
				for _, err := range x.Changes() {
					if err != nil {
						last = err
						break
					}
					n++
					if n == 5 {
						if stop == "next" {
							_, _ = b.Next()
						} else {
							require.NoError(t, b.Close())
						}
					}
				}
				require.ErrorIs(t, last, reorderbuffer.ErrReleased, "%s inside the loop: iteration ended silently after %d", stop, n)
				require.Equal(t, 5, n)
				var again []error
				for _, err := range x.Changes() {
					again = append(again, err)
				}
				require.Len(t, again, 1, "a released transaction yields nothing but ErrReleased")
				require.ErrorIs(t, again[0], reorderbuffer.ErrReleased)
			}
		})
	}
}

func TestHandedOutTransactionsAreNotRetained(t *testing.T) {
	// A consumer that never acknowledges must not make the buffer keep every transaction it
	// handed out: only a small entry each, visible in Stats.
	b := newBuffer(t, reorderbuffer.Config{})
	var refs []weak.Pointer[reorderbuffer.Txn]
	for i := range 100 {
		feed(t, b, plainTxn(t, uint32(10+i), decoding.LSN(0x2000+0x100*i), "a")...)
		x, ok := b.Next()
		require.True(t, ok)
		refs = append(refs, weak.Make(x))
	}
	_, _ = b.Next() // releases the last one
	runtime.GC()
	for i, r := range refs {
		require.Nil(t, r.Value(), "transaction %d still referenced after release", i)
	}
	st := b.Stats()
	require.Equal(t, 100, st.UnackedTxns)
	require.Equal(t, decoding.LSN(0x2000), st.OldestUnackedLSN)
}

func TestRestart(t *testing.T) {
	t.Run("complete transactions are not handed out twice", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		feed(t, b, plainTxn(t, 11, 0x3000, "b")...)
		x, _ := b.Next()
		require.NoError(t, b.Ack(x))
		feed(t, b, streamTxn(t, 12, true, "open")...)
		feed(t, b, enc(t, &decoding.Begin{FinalLSN: 0x4ff8, CommitTime: epoch, Xid: 13}, false))
		require.NoError(t, b.Restart())
		require.Equal(t, 1, b.Pending(), "the queued transaction is kept")
		// The server sends again from the confirmed position (0x2000).
		feed(t, b, plainTxn(t, 11, 0x3000, "b")...)
		feed(t, b, streamTxn(t, 12, true, "open")...)
		feed(t, b, streamCommit(t, 12, 0x4000))
		feed(t, b, plainTxn(t, 13, 0x5000, "c")...)
		var got [][]string
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			got = append(got, values(t, x))
		}
		require.Equal(t, [][]string{{"b"}, {"open"}, {"c"}}, got)
	})
	t.Run("a held prepared transaction keeps its pin while sent again", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, prepared(t, 12, "g", 0x2000, relation(1, 0), "p")...)
		feed(t, b, plainTxn(t, 13, 0x3000, "after")...)
		x, _ := b.Next()
		require.NoError(t, b.Ack(x))
		b.Keepalive(0x4000)
		require.Equal(t, decoding.LSN(0x2000), b.FlushPosition())
		require.NoError(t, b.Restart())
		// Sent again from 0x2000: the prepared transaction first, half of it so far.
		feed(t, b, enc(t, &decoding.BeginPrepare{PrepareLSN: 0x2000, EndLSN: 0x2008, PrepareTime: epoch, Xid: 12, GID: "g"}, false))
		require.Equal(t, decoding.LSN(0x2000), b.FlushPosition(), "pin lost while the transaction is received again")
		feed(t, b, enc(t, relation(1, 0), false), enc(t, insert(1, 0, "p"), false),
			enc(t, &decoding.Prepare{PrepareLSN: 0x2000, EndLSN: 0x2008, PrepareTime: epoch, Xid: 12, GID: "g"}, false))
		feed(t, b, plainTxn(t, 13, 0x3000, "after")...)
		feed(t, b, commitPrepared(t, 12, "g", 0x5000))
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, "g", x.GID)
		require.Equal(t, []string{"p"}, values(t, x))
		_, ok = b.Next()
		require.False(t, ok)
		require.Equal(t, decoding.LSN(0x2000), b.FlushPosition())
		require.NoError(t, b.Ack(x))
		require.Equal(t, decoding.LSN(0x5000), b.FlushPosition())
	})
	t.Run("a committed prepared transaction not acknowledged keeps its pin", func(t *testing.T) {
		// PREPARE at 0x2000, a transaction committed at 0x3000 (acknowledged), COMMIT PREPARED
		// at 0x4000 handed out and not acknowledged. Restarted, the server sends all three again.
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, prepared(t, 12, "g", 0x2000, relation(1, 0), "p")...)
		feed(t, b, plainTxn(t, 13, 0x3000, "between")...)
		feed(t, b, commitPrepared(t, 12, "g", 0x4000))
		y, _ := b.Next()
		require.NoError(t, b.Ack(y))
		x, _ := b.Next()
		require.Equal(t, "g", x.GID)
		require.NoError(t, b.Restart())
		feed(t, b, prepared(t, 12, "g", 0x2000, relation(1, 0), "p")...)
		feed(t, b, plainTxn(t, 13, 0x3000, "between")...)
		feed(t, b, commitPrepared(t, 12, "g", 0x4000)) // already handed out: skipped
		_, ok := b.Next()
		require.False(t, ok)
		b.Keepalive(0x5000)
		require.NoError(t, b.CheckInvariants())
		require.Equal(t, decoding.LSN(0x3000), b.AckedThrough())
		require.Equal(t, decoding.LSN(0x2000), b.FlushPosition(), "the unacknowledged COMMIT PREPARED pins its PREPARE")
		require.NoError(t, b.Ack(x))
		require.Equal(t, decoding.LSN(0x5000), b.FlushPosition())
		require.NoError(t, b.CheckInvariants())
	})
}

func TestStatsOnDiskAndChanges(t *testing.T) {
	b := newBuffer(t, reorderbuffer.Config{WorkMem: reorderbuffer.SpillEverything})
	feed(t, b, streamTxn(t, 10, true, "a", "b", "c")...)
	st := b.Stats()
	require.Positive(t, st.SpillBytesNow)
	require.Equal(t, st.SpillBytes, st.SpillBytesNow)
	feed(t, b, streamCommit(t, 10, 0x2000))
	x, _ := b.Next()
	require.Equal(t, []string{"a", "b", "c"}, values(t, x))
	require.EqualValues(t, 3, b.Stats().TotalChanges, "inserts counted, the relation description not")
	require.Positive(t, b.Stats().SpillBytesNow, "still on disk while handed out")
	_, _ = b.Next()
	require.Zero(t, b.Stats().SpillBytesNow)
}

func TestSpillErrorOfAnotherTransactionSurfacesAtOnce(t *testing.T) {
	// A's spilled records wait in the spill store's shared write buffer; spilling B flushes
	// them, and that write fails (disk full). The Add that spilled B must return the error, and
	// A must never be handed out with a hole.
	ffs := faultfs.New(vfs.OS())
	b := newBuffer(t, reorderbuffer.Config{WorkMem: reorderbuffer.SpillEverything, FS: ffs})
	feed(t, b, streamTxn(t, 10, true, "a1", "a2")...)
	ffs.Add(faultfs.Rule{Op: faultfs.OpWrite, Match: func(p string) bool { return strings.HasSuffix(p, "log-1.spill") },
		Err: syscall.ENOSPC})
	var err error
	for _, m := range streamTxn(t, 11, true, "b1") {
		if err = b.Add(1, m); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, syscall.ENOSPC, "the call that hit the write error returns it")
	var le *spill.LogError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, b.Add(1, streamCommit(t, 10, 0x2000)), reorderbuffer.ErrFailed)
	_, ok := b.Next()
	require.False(t, ok)
}
