package reorderbuffer_test

import (
	"fmt"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

// TestTxnReadWhileBufferWorks reads a spilled transaction on one goroutine while the buffer is
// driven on another: more transactions arrive and spill (sharing the spill store's write buffer
// and descriptor budget), Stats, Ack and FlushPosition run. A handed-out Txn owns its spill
// reader and schema, so only the race detector has something to say if that is not so.
func TestTxnReadWhileBufferWorks(t *testing.T) {
	b := newBuffer(t, reorderbuffer.Config{WorkMem: reorderbuffer.SpillEverything, MaxOpenFiles: 1})
	vals := make([]string, 2000)
	for i := range vals {
		vals[i] = fmt.Sprintf("value %d", i)
	}
	feed(t, b, plainTxn(t, 10, 0x2000, vals...)...)
	x, ok := b.Next()
	require.True(t, ok)
	require.NotZero(t, b.Stats().SpillBytesNow)

	got := make(chan []string)
	go func() {
		var v []string
		for i := 0; i < 2; i++ { // the second read starts over
			v = v[:0]
			for c, err := range x.Changes() {
				m := c.Msg
				if err != nil {
					v = append(v, err.Error())
					break
				}
				if ins, ok := m.(*decoding.Insert); ok {
					v = append(v, string(ins.New[0].Data))
				}
			}
		}
		got <- v
	}()
	// The buffer goes on meanwhile: other transactions spill, counters are read.
	for i := range 50 {
		xid := uint32(100 + i)
		end := decoding.LSN(0x10000 + 0x100*i)
		for j, m := range flat(streamTxn(t, xid, true, "a", "b", "c"), [][]byte{streamCommit(t, xid, end)}) {
			require.NoError(t, b.Add(end-0x80+decoding.LSN(j), m))
		}
		b.Keepalive(end)
		_ = b.Stats()
		_ = b.FlushPosition()
		if i == 25 {
			require.NoError(t, b.Ack(x))
		}
		require.NoError(t, b.CheckInvariants())
	}
	require.Equal(t, vals, <-got)
	require.Equal(t, 50, b.Pending())
}
