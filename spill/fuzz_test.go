package spill

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"testing"
)

func frameFor(rec []byte) []byte {
	var h [frameHeaderSize]byte
	binary.LittleEndian.PutUint32(h[4:], uint32(len(rec)))
	binary.LittleEndian.PutUint32(h[:4], crc32.Update(crc32.Checksum(h[4:], castagnoli), castagnoli, rec))
	return append(h[:], rec...)
}

// FuzzReader reads arbitrary bytes as the records of a log file. It must never panic, and every
// record it returns must carry a valid checksum and lie inside the log; the data ends in io.EOF or
// a *CorruptError.
func FuzzReader(f *testing.F) {
	var valid []byte
	for _, r := range []string{"", "a", "hello", string(bytes.Repeat([]byte{7}, 200))} {
		valid = append(valid, frameFor([]byte(r))...)
	}
	f.Add(valid, uint16(64))
	f.Add(valid[:len(valid)-1], uint16(100))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint16(64))
	f.Add(frameFor(bytes.Repeat([]byte{1}, 1000)), uint16(64))
	f.Fuzz(func(t *testing.T, data []byte, bufSize uint16) {
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
		l.created, l.headed, l.flushed = true, true, int64(len(data))
		r := l.NewReader()
		defer r.Close()
		var consumed int
		for {
			rec, err := r.Next()
			if err == io.EOF {
				if consumed != len(data) {
					t.Fatalf("EOF after %d of %d bytes", consumed, len(data))
				}
				return
			}
			if err != nil {
				var ce *CorruptError
				if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
					t.Fatalf("not a CorruptError: %v", err)
				}
				if ce.Offset != int64(headerSize+consumed) {
					t.Fatalf("CorruptError offset %d, want %d", ce.Offset, headerSize+consumed)
				}
				return
			}
			want := frameFor(rec)
			if !bytes.Equal(data[consumed:consumed+len(want)], want) {
				t.Fatalf("record at %d does not match the file", consumed)
			}
			consumed += len(want)
		}
	})
}
