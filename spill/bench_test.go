package spill_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgreorder/pgreorder/spill"
)

// BenchmarkAppendRead appends 4 MiB of records to a log and reads them back, beside a plain
// os.File doing the same sequential write and read of the same payload bytes through bufio with the
// same buffer size (plain-bufio), and one writing and reading each record with its own system call
// (plain-file). All reuse one file, truncated to empty before each round, so file creation and
// removal do not blur the figures. Compare the MB/s of spill and plain for each record size.
func BenchmarkAppendRead(b *testing.B) {
	const total = 4 << 20
	for _, size := range []int{64, 8 << 10} {
		n := total / size
		rec := make([]byte, size)
		for i := range rec {
			rec[i] = byte(i * 7)
		}
		b.Run(fmt.Sprintf("size=%d/spill", size), func(b *testing.B) {
			s, err := spill.Open(spill.Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			l, err := s.Create()
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n * size))
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Truncate(0); err != nil {
					b.Fatal(err)
				}
				for range n {
					if err := l.Append(rec); err != nil {
						b.Fatal(err)
					}
				}
				r := l.NewReader()
				got := 0
				for {
					rec, err := r.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					got += len(rec)
				}
				r.Close()
				if got != n*size {
					b.Fatalf("read %d bytes, want %d", got, n*size)
				}
			}
		})
		b.Run(fmt.Sprintf("size=%d/plain-bufio", size), func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "plain"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			w := bufio.NewWriterSize(f, spill.DefaultBufferSize)
			rd := bufio.NewReaderSize(f, spill.DefaultBufferSize)
			buf := make([]byte, size)
			b.SetBytes(int64(n * size))
			b.ReportAllocs()
			for b.Loop() {
				if err := f.Truncate(0); err != nil {
					b.Fatal(err)
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					b.Fatal(err)
				}
				w.Reset(f)
				for range n {
					if _, err := w.Write(rec); err != nil {
						b.Fatal(err)
					}
				}
				if err := w.Flush(); err != nil {
					b.Fatal(err)
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					b.Fatal(err)
				}
				rd.Reset(f)
				for range n {
					if _, err := io.ReadFull(rd, buf); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("size=%d/plain-file", size), func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "plain"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, size)
			b.SetBytes(int64(n * size))
			b.ReportAllocs()
			for b.Loop() {
				if err := f.Truncate(0); err != nil {
					b.Fatal(err)
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					b.Fatal(err)
				}
				for range n {
					if _, err := f.Write(rec); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					b.Fatal(err)
				}
				for range n {
					if _, err := io.ReadFull(f, buf); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkInterleaved appends 64-byte records round-robin to many logs, the worst case for the
// shared write buffer and the descriptor budget.
func BenchmarkInterleaved(b *testing.B) {
	for _, logs := range []int{16, 1024} {
		b.Run(fmt.Sprintf("logs=%d", logs), func(b *testing.B) {
			s, err := spill.Open(spill.Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ls := make([]*spill.Log, logs)
			for i := range ls {
				if ls[i], err = s.Create(); err != nil {
					b.Fatal(err)
				}
			}
			rec := make([]byte, 64)
			b.SetBytes(int64(len(rec)))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := ls[i%logs].Append(rec); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
