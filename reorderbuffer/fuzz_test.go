package reorderbuffer_test

import (
	"encoding/binary"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

// FuzzBuffer feeds arbitrary message sequences (length-prefixed messages in one input) to a
// Buffer with a tiny memory limit and reads every transaction it hands out. Whatever the input:
// no panic; the buffer's invariants hold after every message (memory accounted exactly and
// within the limit, acknowledgement state consistent); after an error every later Add fails and
// nothing more is handed out; the flush position never decreases. FuzzModelResume checks what
// comes out against the model for well-formed streams.
func FuzzBuffer(f *testing.F) {
	seed := func(msgs ...[]byte) {
		var in []byte
		for _, m := range msgs {
			in = binary.BigEndian.AppendUint16(in, uint16(len(m)))
			in = append(in, m...)
		}
		f.Add(in)
	}
	seed(flat(streamTxn(f, 10, true, "a", "b"), [][]byte{streamCommit(f, 10, 0x2000)})...)
	seed(flat(plainTxn(f, 11, 0x2000, "a"), streamTxn(f, 10, true, "x"),
		[][]byte{enc(f, &decoding.StreamAbort{Xid: 10, SubXid: 10}, false)})...)
	var recs []capture.Record
	g := generate(f, 1, 40)
	for _, w := range g.out {
		recs = append(recs, capture.Record{Data: w.data})
	}
	var ms [][]byte
	for _, r := range recs {
		ms = append(ms, r.Data)
	}
	seed(ms...)

	dir := f.TempDir() // one for all runs: Close removes what each run made
	f.Fuzz(func(t *testing.T, in []byte) {
		b, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: 8 << 10, Dir: dir})
		require.NoError(t, err)
		defer b.Close()
		failed := false
		var flushed decoding.LSN
		for len(in) >= 2 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			queued := b.Pending()
			err := b.Add(0, in[:n])
			in = in[n:]
			if failed {
				require.ErrorIs(t, err, reorderbuffer.ErrFailed)
				continue
			}
			failed = err != nil
			if failed {
				require.Equal(t, queued, b.Pending(), "a failed Add queued a transaction")
			}
			for x, ok := b.Next(); ok; x, ok = b.Next() {
				for _, err := range x.Changes() {
					if err != nil {
						break
					}
				}
				require.NoError(t, b.Ack(x))
			}
			require.NoError(t, b.CheckInvariants())
			require.LessOrEqual(t, b.Stats().MemoryBytes, int64(8<<10))
			f := b.FlushPosition()
			require.GreaterOrEqual(t, f, flushed, "flush position went back")
			flushed = f
		}
	})
}
