package spill_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/spill"
)

func openStore(t testing.TB, opts spill.Options) *spill.Store {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	s, err := spill.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func create(t testing.TB, s *spill.Store) *spill.Log {
	t.Helper()
	l, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// readAll returns copies of every record of l, and the error that ended the reading (nil at EOF).
func readAll(l *spill.Log) ([][]byte, error) {
	r := l.NewReader()
	defer r.Close()
	var out [][]byte
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, bytes.Clone(rec))
	}
}

func record(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func equalRecords(t *testing.T, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d: got %d bytes %.16x..., want %d bytes %.16x...", i, len(got[i]), got[i], len(want[i]), want[i])
		}
	}
}

func TestRoundTrip(t *testing.T) {
	const buf = 256
	tests := []struct {
		name  string
		sizes []int
	}{
		{"empty log", nil},
		{"one empty record", []int{0}},
		{"small records", []int{1, 2, 3, 63, 64, 65}},
		{"exactly buffer", []int{buf - 2, buf - 2}},
		{"one over buffer", []int{buf - 1, 1}},
		{"large between small", []int{10, 3 * buf, 10, 5 * buf, 0, 7 * buf}},
		{"many small", func() []int {
			s := make([]int, 1000)
			for i := range s {
				s[i] = i % 97
			}
			return s
		}()},
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t, spill.Options{BufferSize: buf, MaxOpenFiles: 1})
			l := create(t, s)
			other := create(t, s) // competes for the buffer and the single fd
			var want [][]byte
			var size int64
			for i, n := range tt.sizes {
				rec := record(rng, n)
				want = append(want, rec)
				if err := l.Append(rec); err != nil {
					t.Fatal(err)
				}
				size += int64(spill.FrameSize(n))
				if l.Size() != size {
					t.Fatalf("Size %d, want %d", l.Size(), size)
				}
				if i%3 == 0 {
					if err := other.Append(rec); err != nil {
						t.Fatal(err)
					}
				}
			}
			got, err := readAll(l)
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, got, want)
		})
	}
}

// TestModel runs random operations on many logs against an in-memory model.
func TestModel(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	for _, cfg := range []spill.Options{
		{BufferSize: 64, MaxOpenFiles: 1},
		{BufferSize: 200, MaxOpenFiles: 3},
		{},
	} {
		t.Run(fmt.Sprintf("buf=%d,fds=%d", cfg.BufferSize, cfg.MaxOpenFiles), func(t *testing.T) {
			runModel(t, openStore(t, cfg), rng, false)
		})
	}
}

// runModel runs 3000 random operations on logs of s against an in-memory model: appends (when
// compressible, two records in three made to compress well), truncations to any Size noted
// before, reads, removals, in many logs sharing the write buffer.
func runModel(t *testing.T, s *spill.Store, rng *rand.Rand, compressible bool) {
	t.Helper()
	type model struct {
		l     *spill.Log
		recs  [][]byte
		marks []int // record counts at which Size was noted
		sizes []int64
	}
	var logs []*model
	for range 3000 {
		if len(logs) == 0 || rng.IntN(20) == 0 {
			logs = append(logs, &model{l: create(t, s)})
		}
		m := logs[rng.IntN(len(logs))]
		switch op := rng.IntN(100); {
		case op < 70:
			n := rng.IntN(100)
			if rng.IntN(20) == 0 {
				n = rng.IntN(1000)
			}
			if rng.IntN(4) == 0 {
				m.marks = append(m.marks, len(m.recs))
				m.sizes = append(m.sizes, m.l.Size())
			}
			rec := record(rng, n)
			if err := m.l.Append(rec); err != nil {
				t.Fatal(err)
			}
			m.recs = append(m.recs, rec)
		case op < 85:
			if len(m.marks) == 0 {
				continue
			}
			k := rng.IntN(len(m.marks))
			if err := m.l.Truncate(m.sizes[k]); err != nil {
				t.Fatal(err)
			}
			m.recs = m.recs[:m.marks[k]]
			m.marks, m.sizes = m.marks[:k], m.sizes[:k]
		case op < 97:
			got, err := readAll(m.l)
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, got, m.recs)
		default:
			if err := m.l.Remove(); err != nil {
				t.Fatal(err)
			}
			if err := m.l.Append(nil); !errors.Is(err, spill.ErrClosed) {
				t.Fatalf("Append after Remove: %v", err)
			}
			for i := range logs {
				if logs[i] == m {
					logs = append(logs[:i], logs[i+1:]...)
					break
				}
			}
		}
	}
	for _, m := range logs {
		got, err := readAll(m.l)
		if err != nil {
			t.Fatal(err)
		}
		equalRecords(t, got, m.recs)
	}
}

func TestTruncateInvalidOffset(t *testing.T) {
	s := openStore(t, spill.Options{})
	l := create(t, s)
	if err := l.Append([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{-1, l.Size() + 1} {
		if err := l.Truncate(off); !errors.Is(err, spill.ErrInvalidOffset) {
			t.Errorf("Truncate(%d) = %v, want ErrInvalidOffset", off, err)
		}
	}
	// Not sticky.
	if err := l.Append([]byte("d")); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(l)
	if err != nil {
		t.Fatal(err)
	}
	equalRecords(t, got, [][]byte{[]byte("abc"), []byte("d")})
}

func TestTruncateFlushed(t *testing.T) {
	// Truncate to offsets noted while the bytes were buffered, after they reached the file.
	s := openStore(t, spill.Options{BufferSize: 64})
	l := create(t, s)
	var sizes []int64
	var want [][]byte
	for i := range 20 {
		sizes = append(sizes, l.Size())
		rec := bytes.Repeat([]byte{byte(i)}, i*3)
		want = append(want, rec)
		if err := l.Append(rec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := readAll(l); err != nil { // flushes everything
		t.Fatal(err)
	}
	for _, k := range []int{15, 7, 7, 1, 0} {
		if err := l.Truncate(sizes[k]); err != nil {
			t.Fatal(err)
		}
		if l.Size() != sizes[k] {
			t.Fatalf("Size after Truncate(%d) = %d", sizes[k], l.Size())
		}
		got, err := readAll(l)
		if err != nil {
			t.Fatal(err)
		}
		equalRecords(t, got, want[:k])
	}
	fi, err := os.Stat(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != spill.HeaderSize {
		t.Fatalf("file size after Truncate(0) = %d, want %d", fi.Size(), spill.HeaderSize)
	}
}

func TestRecordTooLarge(t *testing.T) {
	s := openStore(t, spill.Options{})
	l := create(t, s)
	// A slice header claiming MaxRecordSize+1 bytes without allocating them is not possible in
	// safe Go, so allocate: 1 GiB of zero pages is cheap until touched.
	if testing.Short() {
		t.Skip("allocates 1 GiB of address space")
	}
	big := make([]byte, spill.MaxRecordSize+1)
	if err := l.Append(big); !errors.Is(err, spill.ErrRecordTooLarge) {
		t.Fatalf("Append: %v", err)
	}
	if err := l.Append([]byte("x")); err != nil {
		t.Fatalf("Append after refused record: %v", err)
	}
}

func TestCorrupt(t *testing.T) {
	recs := [][]byte{[]byte("first record"), []byte("second"), bytes.Repeat([]byte("x"), 300)}
	// With a 128-byte buffer the first two records are one block, the third a block of its own:
	// the file offsets of the blocks, and of the file's end.
	blk0 := int64(spill.HeaderSize)
	blk1 := blk0 + spill.BlockHeaderSize + int64(spill.FrameSize(len(recs[0]))+spill.FrameSize(len(recs[1])))
	end := blk1 + spill.BlockHeaderSize + int64(spill.FrameSize(len(recs[2])))
	tests := []struct {
		name       string
		damage     func(b []byte) []byte
		wantOK     int // records returned before the error
		wantOffset int64
		wantErr    error // matched with errors.Is, besides ErrCorrupt
	}{
		{"payload bit flip", func(b []byte) []byte { b[blk0+spill.BlockHeaderSize+15] ^= 1; return b }, 0, blk0, nil},
		{"crc bit flip", func(b []byte) []byte { b[blk1+1] ^= 0x80; return b }, 2, blk1, nil},
		{"stored length grown", func(b []byte) []byte { b[blk0+4]++; return b }, 0, blk0, nil},
		{"raw length beyond end", func(b []byte) []byte { b[blk1+11] = 0x7f; return b }, 2, blk1, nil},
		{"torn last record", func(b []byte) []byte { return b[:len(b)-10] }, 2, end - 10, io.ErrUnexpectedEOF},
		{"torn block header", func(b []byte) []byte { return b[:blk1+3] }, 2, blk1 + 3, io.ErrUnexpectedEOF},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, 0, 0, nil},
		{"bad version", func(b []byte) []byte { b[4] = 9; return b }, 0, 4, nil},
		{"file header torn", func(b []byte) []byte { return b[:5] }, 0, 5, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t, spill.Options{BufferSize: 128})
			l := create(t, s)
			for _, r := range recs {
				if err := l.Append(r); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := readAll(l); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(l.Path())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(l.Path(), tt.damage(b), 0o600); err != nil {
				t.Fatal(err)
			}
			r := l.NewReader()
			defer r.Close()
			for i := range tt.wantOK {
				rec, err := r.Next()
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if !bytes.Equal(rec, recs[i]) {
					t.Fatalf("record %d differs", i)
				}
			}
			rec, err := r.Next()
			var ce *spill.CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, spill.ErrCorrupt) {
				t.Fatalf("Next = %q, %v; want *CorruptError", rec, err)
			}
			if ce.Log != l.Path() || ce.Offset != tt.wantOffset {
				t.Errorf("CorruptError at %s:%d, want %s:%d", ce.Log, ce.Offset, l.Path(), tt.wantOffset)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v does not match %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), l.Path()) {
				t.Errorf("error %q does not name the file", err)
			}
			if _, err2 := r.Next(); err2 != err {
				t.Errorf("second Next = %v, want the same error", err2)
			}
		})
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "not-ours.spill")
	if err := os.WriteFile(foreign, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := spill.Open(spill.Options{Dir: dir, BufferSize: 64, MaxOpenFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	var logs []*spill.Log
	for i := range 10 {
		l, err := s.Create()
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Append(bytes.Repeat([]byte{1}, i*20)); err != nil {
			t.Fatal(err)
		}
		logs = append(logs, l)
	}
	r := logs[3].NewReader()
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if err := logs[4].Remove(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "not-ours.spill" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("after Close the directory holds %v", names)
	}
	if _, err := r.Next(); !errors.Is(err, spill.ErrClosed) {
		t.Errorf("Reader.Next after Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	if err := logs[0].Append(nil); !errors.Is(err, spill.ErrClosed) {
		t.Errorf("Append after Close: %v", err)
	}
	if err := logs[0].Truncate(0); !errors.Is(err, spill.ErrClosed) {
		t.Errorf("Truncate after Close: %v", err)
	}
	if _, err := readAll(logs[1]); !errors.Is(err, spill.ErrClosed) {
		t.Errorf("NewReader after Close: %v", err)
	}
	if err := logs[0].Remove(); err != nil {
		t.Errorf("Remove after Close: %v", err)
	}
	if _, err := s.Create(); !errors.Is(err, spill.ErrClosed) {
		t.Errorf("Create after Close: %v", err)
	}
}

func TestStaleCleanup(t *testing.T) {
	dir := t.TempDir()
	write := func(rel string) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	exists := func(p string) bool {
		_, err := os.Stat(p)
		return err == nil
	}
	// A live store in the same directory, with a flushed log.
	live, err := spill.Open(spill.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	ll, err := live.Create()
	if err != nil {
		t.Fatal(err)
	}
	if err := ll.Append([]byte("live")); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(ll); err != nil { // flush it to the file
		t.Fatal(err)
	}

	const (
		dead1    = "pgreorder-spill-4242-0123456789abcdef" // lock and logs only
		dead2    = "pgreorder-spill-77-fedcba9876543210"   // lock, logs and foreign files
		starting = "pgreorder-spill-78-00000000000000aa"   // empty, no lock: a store starting up
		old      = "pgreorder-spill-79-00000000000000bb"   // a log but no lock inside: not this layout
		shared   = "pgreorder-spill-80-00000000000000cc"   // group-writable: not private to us
		linked   = "pgreorder-spill-81-00000000000000dd"   // a symlink to a stale-looking store
		lockLink = "pgreorder-spill-82-00000000000000ee"   // its lock file is a symlink
	)
	elsewhere := t.TempDir() // outside dir: nothing in it may be touched
	mkdir := func(rel string, perm os.FileMode) string {
		p := filepath.Join(dir, rel)
		if err := os.Mkdir(p, perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, perm); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	link := func(target, rel string) string {
		p := filepath.Join(dir, rel)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mkdir(shared, 0o770)
	for _, f := range []string{"lock", "log-1.spill"} {
		if err := os.WriteFile(filepath.Join(elsewhere, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	gone := []string{
		write(dead1 + "/lock"),
		write(dead1 + "/log-1.spill"),
		write(dead1 + "/log-22.spill"),
		filepath.Join(dir, dead1),
		write(dead2 + "/lock"),
		write(dead2 + "/log-3.spill"),
	}
	kept := []string{
		write(dead2 + "/notes.txt"),                              // foreign file inside a stale store
		write(dead2 + "/log-x.spill"),                            // not our naming
		mkdir(starting, 0o700),                                   // no lock yet
		write(old + "/log-1.spill"),                              // no lock to take
		write(shared + "/lock"),                                  // in a group-writable directory
		write(shared + "/log-1.spill"),                           //
		link(elsewhere, linked),                                  // the link itself
		filepath.Join(elsewhere, "lock"),                         // and what it points to
		filepath.Join(elsewhere, "log-1.spill"),                  //
		write(lockLink + "/log-1.spill"),                         // in a store whose lock
		link(filepath.Join(elsewhere, "lock"), lockLink+"/lock"), // is a symlink
		write("pgreorder-spill-1-XYZ/log-1.spill"),               // directory name not ours
		write("pgreorder-spill-1-0123456789ABCDEF/log-1.spill"),  // upper-case hex is not ours
		write("pgreorder-spill-5-0123456789abcdef.lock"),         // earlier versions' lock file beside the store
		write("log-5.spill"),                                     // our log naming, but not in a store dir
		write("other.lock"),
	}
	s, err := spill.Open(spill.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, p := range gone {
		if exists(p) {
			t.Errorf("stale %s was not removed", p)
		}
	}
	for _, p := range kept {
		if !exists(p) {
			t.Errorf("foreign %s was removed", p)
		}
	}
	if !exists(ll.Path()) {
		t.Fatalf("the live store's log %s was removed", ll.Path())
	}
	got, err := readAll(ll)
	if err != nil || len(got) != 1 || string(got[0]) != "live" {
		t.Fatalf("live log after cleanup: %q, %v", got, err)
	}
	// The new store must not be removed by a third Open either.
	l, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append([]byte("s")); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(l); err != nil {
		t.Fatal(err)
	}
	s3, err := spill.Open(spill.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Close(); err != nil {
		t.Fatal(err)
	}
	if !exists(l.Path()) || !exists(ll.Path()) {
		t.Fatal("a third store removed a live store's logs")
	}
}

func TestZeroOptions(t *testing.T) {
	s, err := spill.Open(spill.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Dir(), os.TempDir()) {
		t.Errorf("store dir %s not under %s", s.Dir(), os.TempDir())
	}
	l, _ := s.Create()
	if err := l.Append([]byte("zero")); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(l)
	if err != nil || len(got) != 1 {
		t.Fatalf("%q %v", got, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Dir()); !os.IsNotExist(err) {
		t.Fatalf("store dir still there: %v", err)
	}
}

// TestReaderStopsMidBlock: a reader whose log is removed, or whose store is closed, while the
// block it reads still holds records, returns ErrClosed for the rest instead of those records.
func TestReaderStopsMidBlock(t *testing.T) {
	for _, end := range []string{"remove", "close"} {
		t.Run(end, func(t *testing.T) {
			s := openStore(t, spill.Options{})
			l := create(t, s)
			for range 3 {
				if err := l.Append([]byte("abc")); err != nil {
					t.Fatal(err)
				}
			}
			r := l.NewReader()
			if rec, err := r.Next(); err != nil || string(rec) != "abc" {
				t.Fatalf("first Next: %q, %v", rec, err)
			}
			var err error
			if end == "remove" {
				err = l.Remove()
			} else {
				err = s.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec, err := r.Next(); !errors.Is(err, spill.ErrClosed) {
				t.Errorf("Next after %s: %q, %v; want ErrClosed", end, rec, err)
			}
		})
	}
}
