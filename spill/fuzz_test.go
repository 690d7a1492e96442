package spill

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// blockFor returns a block of recs stored as they are.
func blockFor(recs ...[]byte) []byte {
	var raw []byte
	for _, r := range recs {
		raw = append(binary.AppendUvarint(raw, uint64(len(r))), r...)
	}
	b := make([]byte, blockHeaderSize, blockHeaderSize+len(raw))
	putBlockHeader(b, raw, len(raw))
	return append(b, raw...)
}

// FuzzReader reads arbitrary bytes as the blocks of a log file of logical size size. It must
// never panic, the records it returns must fit in the log, and the data ends in io.EOF (after
// exactly size logical bytes) or a *CorruptError.
func FuzzReader(f *testing.F) {
	recs := [][]byte{{}, []byte("a"), []byte("hello"), bytes.Repeat([]byte{7}, 200)}
	valid := append(blockFor(recs[:2]...), blockFor(recs[2:]...)...)
	size := uint32(0)
	for _, r := range recs {
		size += uint32(frameSize(len(r)))
	}
	f.Add(valid, size, uint16(64))
	f.Add(valid[:len(valid)-1], size, uint16(100))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0}, uint32(1), uint16(64))
	f.Add(blockFor(bytes.Repeat([]byte{1}, 1000)), uint32(frameSize(1000)), uint16(64))
	f.Fuzz(func(t *testing.T, data []byte, size uint32, bufSize uint16) {
		mfs := newMemFS()
		s, err := Open(Options{Dir: "/fuzz", FS: mfs, BufferSize: int(bufSize), MaxOpenFiles: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l, _ := s.Create()
		file := make([]byte, headerSize, headerSize+len(data))
		s.putHeader(file)
		file = append(file, data...)
		mfs.put(l.Path(), file)
		l.created, l.headed, l.flushed, l.fileEnd = true, true, int64(size), int64(len(file))
		r := l.NewReader()
		defer r.Close()
		var consumed int64
		for {
			rec, err := r.Next()
			if err == io.EOF {
				if consumed != int64(size) {
					t.Fatalf("EOF after %d of %d bytes", consumed, size)
				}
				return
			}
			if err != nil {
				var ce *CorruptError
				if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
					t.Fatalf("not a CorruptError: %v", err)
				}
				if ce.Offset < 0 || ce.Offset > int64(len(file)) {
					t.Fatalf("CorruptError offset %d outside the file (%d bytes)", ce.Offset, len(file))
				}
				return
			}
			consumed += int64(frameSize(len(rec)))
			if consumed > int64(size) {
				t.Fatalf("records of %d bytes in a log of %d", consumed, size)
			}
		}
	})
}
