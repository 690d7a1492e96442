package reorderbuffer_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TestSharedMemory: with a Memory shared with the consumer, the Buffer spills once its records
// and the consumer's bytes together pass the limit, and uses the whole limit while the consumer
// holds nothing; the Memory counts both sides, and a closed Buffer leaves only the consumer's.
func TestSharedMemory(t *testing.T) {
	const limit = 256 << 10
	vals := make([]string, 150) // about 150 kB of records: fits the limit alone, not beside 192 kB
	for i := range vals {
		vals[i] = fmt.Sprintf("%04d%s", i, strings.Repeat("x", 1000))
	}
	for _, tc := range []struct {
		name  string
		taken int64 // what the consumer holds while the transaction arrives
		spill bool
	}{
		{"consumer holds nothing", 0, false},
		{"consumer holds three quarters", 3 * limit / 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := reorderbuffer.NewMemory(limit)
			var peak atomic.Int64
			mem.TrackPeak(&peak)
			require.True(t, mem.Take(tc.taken))
			b := newBuffer(t, reorderbuffer.Config{Memory: mem})
			feed(t, b, streamTxn(t, 7, true, vals...)...)
			st := b.Stats()
			require.Equal(t, tc.spill, st.SpillBytes > 0, "spilled %d bytes", st.SpillBytes)
			require.Equal(t, st.MemoryBytes+tc.taken, mem.Used(), "the Memory counts the Buffer's bytes and the consumer's")
			require.LessOrEqual(t, mem.Used(), int64(limit))
			require.GreaterOrEqual(t, peak.Load(), mem.Used(), "the peak")
			require.LessOrEqual(t, peak.Load(), int64(limit))
			require.False(t, mem.Take(limit-mem.Used()+1), "Take refuses what does not fit")
			require.False(t, mem.Take(-1), "and a negative count")
			feed(t, b, streamCommit(t, 7, 0x9000))
			x, ok := b.Next()
			require.True(t, ok)
			require.Equal(t, vals, values(t, x), "spilled or not, the same changes")
			require.NoError(t, b.Close())
			require.Equal(t, tc.taken, mem.Used(), "a closed Buffer counts nothing")
			mem.Give(tc.taken)
			require.Zero(t, mem.Used())
		})
	}
	t.Run("free chunks given up", func(t *testing.T) {
		mem := reorderbuffer.NewMemory(limit)
		b := newBuffer(t, reorderbuffer.Config{Memory: mem})
		feed(t, b, flat(streamTxn(t, 7, true, vals[:40]...), [][]byte{streamCommit(t, 7, 0x9000)})...)
		_, ok := b.Next()
		require.True(t, ok)
		_, ok = b.Next() // releases the transaction: its chunks are kept for reuse
		require.False(t, ok)
		kept := b.Stats().MemoryBytes
		require.Positive(t, kept, "free chunks kept")
		want := int64(limit) - kept + 1
		require.False(t, mem.Take(want), "the free chunks count")
		_, ok = b.Next()
		require.False(t, ok)
		require.Zero(t, b.Stats().MemoryBytes, "a refused Take makes the next Next give up the free chunks")
		require.True(t, mem.Take(want))
		mem.Give(want)
	})
	_, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: 1 << 20, Memory: reorderbuffer.NewMemory(2 << 20), Dir: t.TempDir()})
	require.ErrorContains(t, err, "set one limit", "two different limits are refused")
}
