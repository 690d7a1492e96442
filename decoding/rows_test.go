package decoding_test

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
)

// TestRowPaths: row changes of every capture (the first 24 of each type), whole, cut short at every length and with
// each byte of their fields changed, give the same result on every path: Parse (the codec), one
// Parser reused for all of them (whose row path keeps column buffers from one message to the
// next), and Decoder.Accept in a block or a transaction, with the same errors and headers.
func TestRowPaths(t *testing.T) {
	var p decoding.Parser
	n := 0
	for _, name := range captureNames(t) {
		d := decoding.NewDecoder(captureOpts[name])
		count := map[byte]int{}
		for _, rec := range readCapture(t, name) {
			inStream := d.InStream() && rec.data[0] != 'S'
			if _, err := d.Accept(rec.data); err != nil {
				t.Fatal(err)
			}
			switch decoding.MessageType(rec.data[0]) {
			case decoding.MsgInsert, decoding.MsgUpdate, decoding.MsgDelete:
			default:
				continue
			}
			if count[rec.data[0]]++; count[rec.data[0]] > 24 {
				continue
			}
			variants := [][]byte{rec.data}
			for i := range len(rec.data) {
				variants = append(variants, rec.data[:i])
			}
			for i := 1; i < len(rec.data); i++ {
				for _, b := range []byte{0, 'n', 't', 'K', 'N', 0xff} {
					if rec.data[i] != b {
						v := bytes.Clone(rec.data)
						v[i] = b
						variants = append(variants, v)
					}
				}
			}
			for _, v := range variants {
				n++
				checkRowPaths(t, &p, v, inStream, captureOpts[name])
			}
		}
	}
	if n < 1000 {
		t.Fatalf("only %d variants of row changes in the captures", n)
	}
}

func checkRowPaths(t *testing.T, p *decoding.Parser, data []byte, inStream bool, opts decoding.Options) {
	t.Helper()
	want, werr := decoding.Parse(data, inStream, opts)
	p.Options = opts
	got, gerr := p.Parse(data, inStream)
	if fmt.Sprint(werr) != fmt.Sprint(gerr) || werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%x (in stream %v): Parser = %#v, %v; Parse = %#v, %v", data, inStream, got, gerr, want, werr)
	}
	d := decoding.NewDecoder(opts)
	placeFor(d, data, inStream)
	h, aerr := d.Accept(data)
	slow := decoding.NewDecoder(opts)
	placeFor(slow, data, inStream)
	m, derr := slow.Decode(data) // the codec's path, through route
	if fmt.Sprint(aerr) != fmt.Sprint(derr) || derr == nil && (h.Type != m.Type() || h.InStream != inStream) {
		t.Fatalf("%x (in stream %v): Accept = %+v, %v; Decode = %#v, %v", data, inStream, h, aerr, m, derr)
	}
	if derr == nil {
		if wh, _ := routing(m, inStream); inStream && h.Xid != wh.Xid {
			t.Fatalf("%x: Accept's xid %d, the message's %d", data, h.Xid, wh.Xid)
		}
	}
}
