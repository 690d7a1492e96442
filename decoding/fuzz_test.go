package decoding_test

import (
	"bytes"
	"errors"
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
			if _, err := d.Accept(rec.data); err != nil {
				f.Fatal(err)
			}
			if count[rec.data[0]]++; count[rec.data[0]] <= 8 {
				f.Add(rec.data, inStream, uint8(captureOpts[name].ProtoVersion), uint8(captureOpts[name].AbortInfo))
			}
		}
	}
}

// placeFor puts d in a protocol state where a message of data's type is allowed, inStream
// meaning inside a stream block for the messages that carry a leading xid there. It reports
// whether d is in a stream block.
func placeFor(d *decoding.Decoder, data []byte, inStream bool) (inBlock bool) {
	if len(data) == 0 {
		return false
	}
	const txnXid, blockXid = 70, 80
	t := decoding.MessageType(data[0])
	h, err := decoding.ParseHeader(data, inStream)
	switch {
	case t == decoding.MsgCommit:
		d.SetStateForTest(true, false, txnXid, false, 0)
	case t == decoding.MsgPrepare:
		d.SetStateForTest(true, true, txnXid, false, 0)
	case t == decoding.MsgStreamStop:
		d.SetStateForTest(false, false, 0, true, blockXid)
		return true
	case t.IsChange() || t == decoding.MsgOrigin:
		switch {
		case inStream:
			d.SetStateForTest(false, false, 0, true, blockXid)
			return true
		case t == decoding.MsgLogicalMessage && (err != nil || !h.Transactional):
			// A non-transactional message comes between transactions.
		default:
			d.SetStateForTest(true, false, txnXid, false, 0)
		}
	}
	return false
}

// routing returns the header fields that ParseHeader reads from m, and whether m carries an xid
// of its own (in-stream changes: their leading xid).
func routing(m decoding.Message, inStream bool) (h decoding.Header, hasXid bool) {
	h = decoding.Header{Type: m.Type(), InStream: inStream}
	xid := func(x uint32) { h.Xid, hasXid = x, true }
	switch v := m.(type) {
	case *decoding.Begin:
		xid(v.Xid)
	case *decoding.BeginPrepare:
		xid(v.Xid)
	case *decoding.Prepare:
		xid(v.Xid)
	case *decoding.StreamPrepare:
		xid(v.Xid)
	case *decoding.CommitPrepared:
		xid(v.Xid)
	case *decoding.RollbackPrepared:
		xid(v.Xid)
	case *decoding.StreamCommit:
		xid(v.Xid)
	case *decoding.StreamStart:
		xid(v.Xid)
		h.FirstSegment = v.FirstSegment
	case *decoding.StreamAbort:
		xid(v.Xid)
		h.SubXid = v.SubXid
	case *decoding.LogicalMessage:
		h.Transactional = v.Transactional()
	case *decoding.Relation:
		h.RelationID = v.RelationID
	case decoding.RowChange:
		h.RelationID = v.RelationOID()
	}
	if inStream && m.Type().IsChange() {
		xid(reflect.ValueOf(m).Elem().FieldByName("Xid").Interface().(uint32))
	}
	return h, hasXid
}

// FuzzParse: any input gives a message or an error, never a panic, and every level agrees:
//   - Parse does not modify its input;
//   - a parsed message encodes back to exactly the input, and the encoding parses to it again;
//   - ParseHeader accepts what Parse accepts and reads the same routing fields;
//   - the reusing Parser returns the same message or the same error as Parse;
//   - Next, on a Decoder in a state where the message's type is allowed, accepts exactly what
//     Parse accepts, reports the same routing fields, and leaves the state unchanged on error;
//     Decode in that state returns Parse's message;
//   - a message's Clone equals it and survives the input being overwritten.
func FuzzParse(f *testing.F) {
	seedCaptures(f)
	f.Fuzz(func(t *testing.T, data []byte, inStream bool, version, abortInfo uint8) {
		opts := decoding.Options{ProtoVersion: int(version % 6), AbortInfo: decoding.AbortInfo(abortInfo % 3)}
		input := bytes.Clone(data)
		h, herr := decoding.ParseHeader(data, inStream)
		m, err := decoding.Parse(data, inStream, opts)
		if !bytes.Equal(data, input) {
			t.Fatal("Parse modified its input")
		}
		var de *decoding.DecodeError
		if err != nil && !errors.As(err, &de) {
			t.Fatalf("Parse error %v is not a *DecodeError", err)
		}

		p := decoding.Parser{Options: opts}
		pm, perr := p.Parse(data, inStream)
		if (err == nil) != (perr == nil) || err != nil && err.Error() != perr.Error() {
			t.Fatalf("Parse err %v, Parser err %v", err, perr)
		}
		if err == nil && !reflect.DeepEqual(pm, m) {
			t.Fatalf("Parser = %#v, Parse = %#v", pm, m)
		}

		d := decoding.NewDecoder(opts)
		inBlock := placeFor(d, data, inStream)
		before := d.StateForTest()
		nh, nerr := d.Accept(data)
		if (nerr == nil) != (err == nil) {
			t.Fatalf("in a state that allows it, Next err = %v, Parse err = %v", nerr, err)
		}
		if nerr != nil {
			if !errors.As(nerr, &de) {
				t.Fatalf("Next error %v is not a *DecodeError", nerr)
			}
			if after := d.StateForTest(); after != before {
				t.Fatalf("Next failed (%v) and changed the state from %+v to %+v", nerr, before, after)
			}
			return
		}
		dd := decoding.NewDecoder(opts)
		placeFor(dd, data, inStream)
		if dm, derr := dd.Decode(data); derr != nil || !reflect.DeepEqual(dm, m) {
			t.Fatalf("Decode = %#v, %v; Parse = %#v", dm, derr, m)
		}

		want, hasXid := routing(m, inStream)
		if herr != nil {
			t.Fatalf("Parse accepted what ParseHeader rejects: %v", herr)
		}
		if h != want {
			t.Fatalf("ParseHeader = %+v, the message says %+v", h, want)
		}
		if !hasXid {
			nh.Xid = 0 // Next fills it in from the state
		}
		want.InStream = inBlock
		if nh != want {
			t.Fatalf("Next header = %+v, the message says %+v", nh, want)
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

		buf := bytes.Clone(data)
		pm, err = p.Parse(buf, inStream)
		if err != nil {
			t.Fatal(err)
		}
		c := decoding.CloneMessage(pm)
		if !reflect.DeepEqual(c, m) {
			t.Fatalf("CloneMessage = %#v, want %#v", c, m)
		}
		clear(buf)
		if _, err := p.Parse(out, inStream); err != nil { // overwrites what the Parser returned
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("the clone changed with its input: %#v, want %#v", c, again)
		}
	})
}

// FuzzDecoder feeds a sequence of messages (length-prefixed by one byte) to Decoders: never a
// panic; Next and Decode accept the same messages, return the same type and reach the same
// state; Decode returns what Parse returns for the message in its place in the stream; a failed
// message leaves the state unchanged.
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
			before := a.StateForTest()
			h, herr := a.Accept(msg)
			m, merr := b.Decode(msg)
			if (herr == nil) != (merr == nil) {
				t.Fatalf("Next err %v, Decode err %v", herr, merr)
			}
			if herr != nil {
				if a.StateForTest() != before || b.StateForTest() != before {
					t.Fatalf("state changed on error %v", herr)
				}
				continue
			}
			if a.StateForTest() != b.StateForTest() {
				t.Fatalf("after %v: Next state %+v, Decode state %+v", h.Type, a.StateForTest(), b.StateForTest())
			}
			if h.Type != m.Type() {
				t.Fatalf("Next type %v, Decode type %v", h.Type, m.Type())
			}
			if pm, err := decoding.Parse(msg, h.InStream, opts); err != nil || !reflect.DeepEqual(pm, m) {
				t.Fatalf("Decode = %#v; Parse = %#v, %v", m, pm, err)
			}
		}
	})
}
