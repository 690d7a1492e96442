package decoding_test

import (
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/pgreorder/pgreorder/decoding"
)

// realInserts returns the Insert messages of a real capture (read outside streams), ~40–60 bytes.
func realInserts(b *testing.B) [][]byte {
	var out [][]byte
	for _, rec := range readCapture(b, "pg15-proto1-nostream.txt") {
		if rec.data[0] == 'I' && len(rec.data) < 100 {
			out = append(out, rec.data)
		}
	}
	if len(out) == 0 {
		b.Fatal("no inserts")
	}
	return out
}

func avgLen(msgs [][]byte) float64 {
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	return float64(n) / float64(len(msgs))
}

// BenchmarkInsert compares decoding the same real Insert messages: our header path, our full
// decode, and pglogrepl's ParseV2.
func BenchmarkInsert(b *testing.B) {
	msgs := realInserts(b)
	b.Run("ParseHeader", func(b *testing.B) {
		b.ReportAllocs()
		b.ReportMetric(avgLen(msgs), "bytes/msg")
		i := 0
		for b.Loop() {
			if _, err := decoding.ParseHeader(msgs[i%len(msgs)], false); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("Next", func(b *testing.B) {
		b.ReportAllocs()
		d := decoding.NewDecoder(decoding.Options{})
		if _, err := d.Accept(enc(b, begin, false, decoding.Options{})); err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			if _, err := d.Accept(msgs[i%len(msgs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("Parse", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := decoding.Parse(msgs[i%len(msgs)], false, decoding.Options{}); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("Parser", func(b *testing.B) { // reusing its messages: what the reorder buffer hands out
		b.ReportAllocs()
		var p decoding.Parser
		i := 0
		for b.Loop() {
			if _, err := p.Parse(msgs[i%len(msgs)], false); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("pglogrepl.ParseV2", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := pglogrepl.ParseV2(msgs[i%len(msgs)], false); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkCapture runs a whole real streamed capture (every message type of protocol 2) through
// the header path and the full decoder; ns/op is per message.
func BenchmarkCapture(b *testing.B) {
	const name = "pg15-proto2-stream.txt"
	recs := readCapture(b, name)
	opts := captureOpts[name]
	b.Run("Next", func(b *testing.B) {
		b.ReportAllocs()
		d := decoding.NewDecoder(opts)
		i := 0
		for b.Loop() {
			if _, err := d.Accept(recs[i].data); err != nil {
				b.Fatal(err)
			}
			if i++; i == len(recs) {
				i = 0
			}
		}
	})
	b.Run("Decode", func(b *testing.B) {
		b.ReportAllocs()
		d := decoding.NewDecoder(opts)
		i := 0
		for b.Loop() {
			if _, err := d.Decode(recs[i].data); err != nil {
				b.Fatal(err)
			}
			if i++; i == len(recs) {
				i = 0
			}
		}
	})
}
