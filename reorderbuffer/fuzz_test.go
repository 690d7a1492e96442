package reorderbuffer_test

import (
	"encoding/binary"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/capture"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

// FuzzBuffer feeds arbitrary message sequences (length-prefixed messages in one input) to a
// Buffer with a tiny memory limit and reads every transaction it hands out. Whatever the input:
// no panic, and after an error every later Add fails.
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
		for len(in) >= 2 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			err := b.Add(0, in[:n])
			in = in[n:]
			if failed {
				require.ErrorIs(t, err, reorderbuffer.ErrFailed)
				continue
			}
			failed = err != nil
			for x, ok := b.Next(); ok; x, ok = b.Next() {
				for _, err := range x.Changes() {
					if err != nil {
						break
					}
				}
				b.Ack(x)
			}
			_ = b.FlushPosition()
		}
	})
}
