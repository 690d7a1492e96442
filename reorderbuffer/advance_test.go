package reorderbuffer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// With HandOutAdvances, the flush position follows keepalives only through Advance entries the
// consumer acknowledges.
func TestHandOutAdvances(t *testing.T) {
	t.Run("keepalives are not confirmed by themselves", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{HandOutAdvances: true, SkipThrough: 0x1000})
		b.Keepalive(0x5000)
		require.Equal(t, decoding.LSN(0x1000), b.FlushPosition())
		require.True(t, b.QueueAdvance())
		require.False(t, b.QueueAdvance(), "one Advance at a time")
		b.Keepalive(0x6000)
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, reorderbuffer.Advance, x.Part)
		require.Equal(t, decoding.LSN(0x5000), x.EndLSN)
		require.Empty(t, values(t, x))
		require.False(t, b.QueueAdvance(), "the handed-out Advance is not acknowledged yet")
		require.Equal(t, decoding.LSN(0x1000), b.FlushPosition())
		require.NoError(t, b.Ack(x))
		require.Equal(t, decoding.LSN(0x5000), b.FlushPosition())
		require.Equal(t, decoding.LSN(0x5000), b.AckedThrough())
		require.True(t, b.QueueAdvance())
		x, _ = b.Next()
		require.Equal(t, decoding.LSN(0x6000), x.EndLSN)
		require.NoError(t, b.Ack(x))
		require.False(t, b.QueueAdvance(), "nothing new")
		require.Equal(t, decoding.LSN(0x6000), b.FlushPosition())
	})
	t.Run("no Advance while something is pending or received", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{HandOutAdvances: true})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		b.Keepalive(0x3000)
		require.False(t, b.QueueAdvance(), "a transaction is queued")
		x, _ := b.Next()
		require.False(t, b.QueueAdvance(), "a transaction is handed out, not acknowledged")
		require.NoError(t, b.Ack(x))
		require.Equal(t, decoding.LSN(0x2000), b.FlushPosition(), "the keepalive is not confirmed")
		feed(t, b, enc(t, &decoding.Begin{FinalLSN: 0x4000, CommitTime: epoch, Xid: 11}, false))
		b.Keepalive(0x3800)
		require.False(t, b.QueueAdvance(), "a transaction is being received")
		feed(t, b, enc(t, relation(1, 0), false), enc(t, insert(1, 0, "b"), false),
			enc(t, &decoding.Commit{CommitLSN: 0x4000, EndLSN: 0x4008, CommitTime: epoch}, false))
		x, _ = b.Next()
		require.NoError(t, b.Ack(x))
		require.False(t, b.QueueAdvance(), "the keepalive is behind the acknowledged position")
		require.Equal(t, decoding.LSN(0x4008), b.FlushPosition())
	})
	t.Run("transactions after an Advance come after it", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{HandOutAdvances: true, Incremental: true})
		b.Keepalive(0x3000)
		require.True(t, b.QueueAdvance())
		feed(t, b, plainTxn(t, 10, 0x4000, "a")...)
		adv, _ := b.Next()
		require.Equal(t, reorderbuffer.Advance, adv.Part)
		x, _ := b.Next()
		require.Equal(t, reorderbuffer.PartCommit, x.Part)
		require.NoError(t, b.Ack(x))
		require.Zero(t, b.FlushPosition(), "the Advance before it is not acknowledged")
		require.NoError(t, b.Ack(adv))
		require.Equal(t, decoding.LSN(0x4000), b.FlushPosition())
	})
	t.Run("after Restart what the server sends again up to an Advance is dropped", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{HandOutAdvances: true})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		x, _ := b.Next()
		require.NoError(t, b.Ack(x))
		b.Keepalive(0x3000)
		require.True(t, b.QueueAdvance())
		require.NoError(t, b.Restart())
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		adv, _ := b.Next()
		require.Equal(t, reorderbuffer.Advance, adv.Part)
		_, ok := b.Next()
		require.False(t, ok)
	})
	t.Run("off: QueueAdvance does nothing", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		b.Keepalive(0x5000)
		require.False(t, b.QueueAdvance())
		require.Equal(t, decoding.LSN(0x5000), b.FlushPosition())
	})
}
