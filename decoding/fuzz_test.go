package decoding_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
)

// seedCaptures adds every distinct message shape of the real captures (first 8 of each type per
// capture), in and out of stream, to f's corpus.
func seedCaptures(f *testing.F) {
	for _, name := range captureNames(f) {
		d := decoding.NewDecoder(captureOpts[name])
		count := map[byte]int{}
		for _, rec := range readCapture(f, name) {
			inStream := d.InStream() && rec.data[0] != 'S'
			if _, err := d.Next(rec.data); err != nil {
				f.Fatal(err)
			}
			if count[rec.data[0]]++; count[rec.data[0]] <= 8 {
				f.Add(rec.data, inStream, uint8(captureOpts[name].ProtoVersion), uint8(captureOpts[name].AbortInfo))
			}
		}
	}
}

// FuzzParse: any input gives a message or an error, never a panic; a parsed message encodes back
// to exactly the input; Next accepts exactly what Parse accepts (Next also checks state, so it is
// run on a Decoder forced into the matching state).
func FuzzParse(f *testing.F) {
	seedCaptures(f)
	f.Fuzz(func(t *testing.T, data []byte, inStream bool, version, abortInfo uint8) {
		opts := decoding.Options{ProtoVersion: int(version % 6), AbortInfo: decoding.AbortInfo(abortInfo % 3)}
		input := bytes.Clone(data)
		_, herr := decoding.ParseHeader(data, inStream)
		m, err := decoding.Parse(data, inStream, opts)
		if !bytes.Equal(data, input) {
			t.Fatal("Parse modified its input")
		}
		if err != nil {
			return
		}
		if herr != nil {
			t.Fatalf("Parse accepted what ParseHeader rejects: %v", herr)
		}
		out, err := decoding.Append(nil, m, inStream, opts)
		if err != nil {
			t.Fatalf("Append(%#v): %v", m, err)
		}
		if !bytes.Equal(out, data) {
			t.Fatalf("Append(Parse(%x)) = %x", data, out)
		}
		again, err := decoding.Parse(out, inStream, opts)
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("Parse(Append(m)) = %#v, %v; want %#v", again, err, m)
		}
	})
}

// FuzzDecoder feeds a sequence of messages (length-prefixed by one byte) to a Decoder: never a
// panic, Next and Decode agree, and a failed message leaves the state unchanged.
func FuzzDecoder(f *testing.F) {
	for _, name := range captureNames(f) {
		var seq []byte
		for i, rec := range readCapture(f, name) {
			if i >= 40 {
				break
			}
			if len(rec.data) < 256 {
				seq = append(seq, byte(len(rec.data)))
				seq = append(seq, rec.data...)
			}
		}
		f.Add(seq, uint8(captureOpts[name].ProtoVersion))
	}
	f.Fuzz(func(t *testing.T, seq []byte, version uint8) {
		opts := decoding.Options{ProtoVersion: int(version % 6)}
		a, b := decoding.NewDecoder(opts), decoding.NewDecoder(opts)
		for len(seq) > 0 {
			n := min(int(seq[0]), len(seq)-1)
			msg := seq[1 : 1+n]
			seq = seq[1+n:]
			inStream, inTxn := a.InStream(), a.InTransaction()
			h, herr := a.Next(msg)
			m, merr := b.Decode(msg)
			if (herr == nil) != (merr == nil) {
				t.Fatalf("Next err %v, Decode err %v", herr, merr)
			}
			if herr != nil {
				if a.InStream() != inStream || a.InTransaction() != inTxn {
					t.Fatal("state changed on error")
				}
				continue
			}
			if h.Type != m.Type() {
				t.Fatalf("Next type %v, Decode type %v", h.Type, m.Type())
			}
		}
	})
}
