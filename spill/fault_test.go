package spill_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
)

// TestFaults injects one kind of disk trouble per case and checks that it surfaces from the call
// that hit it (or the log's next call, for buffered records), sticks to that log, never yields a record that was not
// completely written, and leaves the other logs of the store alone.
func TestFaults(t *testing.T) {
	isLog := func(l **spill.Log) func(string) bool {
		return func(p string) bool { return *l != nil && p == (*l).Path() }
	}
	tests := []struct {
		name string
		opts spill.Options
		rule func(victim **spill.Log) faultfs.Rule
		// act drives the victim after the rule is armed and returns the first error it saw.
		act     func(t *testing.T, s *spill.Store, l *spill.Log) error
		wantErr error
		sticky  bool // false: a transient read error that must not poison the log
	}{
		{
			name: "ENOSPC on flush of full buffer",
			opts: spill.Options{BufferSize: 100},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpWrite, Match: isLog(v), Err: syscall.ENOSPC}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := appendN(l, 100, 30); err != nil {
					return err
				}
				t.Fatal("no error from 100 appends")
				return nil
			},
			wantErr: syscall.ENOSPC, sticky: true,
		},
		{
			name: "ENOSPC after half a write, at NewReader",
			opts: spill.Options{BufferSize: 4096},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpWrite, Match: isLog(v), Err: syscall.ENOSPC, Partial: true}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := appendN(l, 10, 50); err != nil {
					return err
				}
				_, err := l.NewReader().Next()
				return err
			},
			wantErr: syscall.ENOSPC, sticky: true,
		},
		{
			name: "short write without error",
			opts: spill.Options{BufferSize: 4096},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpWrite, Match: isLog(v), Partial: true}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := l.Append(rec(1, 500)); err != nil {
					return err
				}
				_, err := l.NewReader().Next()
				return err
			},
			wantErr: io.ErrShortWrite, sticky: true,
		},
		{
			name: "write-through of a large record torn after its block header",
			opts: spill.Options{BufferSize: 64},
			rule: func(v **spill.Log) faultfs.Rule {
				// writes: file header + block header, payload
				return faultfs.Rule{Op: faultfs.OpWrite, Match: isLog(v), Skip: 1, Err: syscall.ENOSPC, Partial: true}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				return l.Append(rec(7, 1000))
			},
			wantErr: syscall.ENOSPC, sticky: true,
		},
		{
			name: "flush failure of the buffer's owner, returned by the Append that flushed",
			opts: spill.Options{BufferSize: 4096},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpWrite, Match: isLog(v), Err: syscall.ENOSPC}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := l.Append(rec(1, 10)); err != nil {
					t.Fatalf("buffered Append failed: %v", err)
				}
				other := create(t, s)
				err := other.Append(rec(2, 10)) // flushes l: fails
				if other.Err() != nil || other.Size() != 0 {
					t.Errorf("other log after its Append met l's error: Err %v, Size %d", other.Err(), other.Size())
				}
				return err
			},
			wantErr: syscall.ENOSPC, sticky: true,
		},
		{
			name: "file creation fails",
			opts: spill.Options{BufferSize: 64},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpOpen, Match: isLog(v), Err: syscall.EMFILE}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := appendN(l, 10, 30); err != nil {
					return err
				}
				t.Fatal("no error")
				return nil
			},
			wantErr: syscall.EMFILE, sticky: true,
		},
		{
			name: "fsync fails",
			opts: spill.Options{BufferSize: 64, Sync: true},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpSync, Match: isLog(v), Err: syscall.EIO}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := appendN(l, 10, 30); err != nil {
					return err
				}
				t.Fatal("no error")
				return nil
			},
			wantErr: syscall.EIO, sticky: true,
		},
		{
			name: "close by the fd budget fails",
			opts: spill.Options{BufferSize: 64, MaxOpenFiles: 1},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpClose, Match: isLog(v), Err: syscall.EIO}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := l.Append(rec(1, 100)); err != nil { // written through: file open
					return err
				}
				other := create(t, s)
				err := other.Append(rec(2, 100)) // evicts l's file: the close fails
				if other.Err() != nil || other.Size() != 0 {
					t.Errorf("other log after its Append met l's error: Err %v, Size %d", other.Err(), other.Size())
				}
				return err
			},
			wantErr: syscall.EIO, sticky: true,
		},
		{
			name: "truncate fails",
			opts: spill.Options{BufferSize: 64},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpTruncate, Match: isLog(v), Err: syscall.EIO}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				mark := l.Size()
				if err := appendN(l, 5, 30); err != nil {
					return err
				}
				return l.Truncate(mark)
			},
			wantErr: syscall.EIO, sticky: true,
		},
		{
			name: "read fails once",
			opts: spill.Options{BufferSize: 64},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpRead, Match: isLog(v), Skip: 3, Count: 1, Err: syscall.EIO, Partial: true}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := appendN(l, 10, 30); err != nil {
					return err
				}
				r := l.NewReader()
				defer r.Close()
				for i := 0; ; i++ {
					got, err := r.Next()
					if err != nil {
						if _, err2 := r.Next(); err2 != err {
							t.Errorf("reader error not sticky: %v then %v", err, err2)
						}
						return err
					}
					if !bytes.Equal(got, rec(i, 30)) {
						t.Fatalf("record %d damaged", i)
					}
				}
			},
			wantErr: syscall.EIO, sticky: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ffs := faultfs.New(vfs.OS())
			tt.opts.FS = ffs
			s := openStore(t, tt.opts)
			bystander := create(t, s)
			var victim *spill.Log
			ffs.Add(tt.rule(&victim))
			l := create(t, s)
			victim = l
			// Before, between and after the victim's calls the bystander keeps working.
			var want [][]byte
			appendBystander := func() {
				r := bytes.Repeat([]byte("b"), len(want)+1)
				want = append(want, r)
				if err := bystander.Append(r); err != nil {
					t.Fatalf("bystander Append: %v", err)
				}
			}
			appendBystander()
			err := tt.act(t, s, l)
			if ffs.Fired() == 0 {
				t.Fatal("the fault was never injected")
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("first error %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), l.Path()) {
				t.Errorf("error %q does not name the log", err)
			}
			appendBystander()
			if tt.sticky {
				// The first error is l's own, or a *LogError for l returned by another log's call.
				sticky := l.Err()
				var le *spill.LogError
				if err != sticky && !(errors.As(err, &le) && le.Path == l.Path() && le.Err == sticky) {
					t.Errorf("first error %v is neither l's sticky error %v nor a *LogError for it", err, sticky)
				}
				if err2 := l.Append([]byte("more")); err2 != sticky {
					t.Errorf("Append after fault = %v, want %v", err2, sticky)
				}
				if err2 := l.Truncate(0); err2 != sticky {
					t.Errorf("Truncate after fault = %v, want %v", err2, sticky)
				}
				r := l.NewReader()
				if got, err2 := r.Next(); err2 != sticky {
					t.Errorf("Reader.Next after fault = %q, %v; want %v", got, err2, sticky)
				}
				r.Close()
			} else {
				ffs.Reset()
				if _, err := readAll(l); err != nil {
					t.Errorf("log unusable after a transient read error: %v", err)
				}
			}
			ffs.Reset()
			got, err := readAll(bystander)
			if err != nil {
				t.Fatalf("bystander: %v", err)
			}
			equalRecords(t, got, want)
			if err := l.Remove(); err != nil {
				t.Errorf("Remove after fault: %v", err)
			}
		})
	}
}

// TestFaultNeverYieldsTornRecord fails every write at a random point and checks that a reader
// returns only records whose Append (and flush) succeeded.
func TestFaultNeverYieldsTornRecord(t *testing.T) {
	for skip := range 12 {
		ffs := faultfs.New(vfs.OS())
		s := openStore(t, spill.Options{FS: ffs, BufferSize: 100})
		l := create(t, s)
		ffs.Add(faultfs.Rule{Op: faultfs.OpWrite, Skip: skip, Err: syscall.ENOSPC, Partial: true})
		for i := range 40 {
			if err := l.Append(bytes.Repeat([]byte{byte(i)}, 10+i*7)); err != nil {
				break
			}
		}
		if ffs.Fired() == 0 {
			// Every Append fit in the buffer; the fault hits the flush in NewReader.
			t.Logf("skip %d: fault not yet injected before NewReader", skip)
		}
		r := l.NewReader()
		rec, err := r.Next()
		switch {
		case err == nil:
			t.Fatalf("skip %d: reader returned a record (%d bytes) from a failed log", skip, len(rec))
		case err == io.EOF:
			t.Fatalf("skip %d: reader reached EOF after a failed write", skip)
		case !errors.Is(err, syscall.ENOSPC):
			t.Fatalf("skip %d: %v", skip, err)
		}
		r.Close()
	}
}

// rec is record i of n bytes.
func rec(i, n int) []byte { return bytes.Repeat([]byte{byte(i)}, n) }

// appendN appends n records of the given size to l, stopping at the first error.
func appendN(l *spill.Log, n, size int) error {
	for i := range n {
		if err := l.Append(rec(i, size)); err != nil {
			return err
		}
	}
	return nil
}

// TestFlushErrorOfAnotherLog: when one log's Append flushes the shared write buffer holding
// another log's records and that write fails, the Append returns the error, naming the other log.
// The error sticks to the other log; the caller's log is unharmed and its record not appended.
func TestFlushErrorOfAnotherLog(t *testing.T) {
	for _, size := range []int{10, 5000} { // buffered, written through
		t.Run(fmt.Sprintf("record=%d", size), func(t *testing.T) {
			ffs := faultfs.New(vfs.OS())
			s := openStore(t, spill.Options{FS: ffs, BufferSize: 4096})
			a, b := create(t, s), create(t, s)
			if err := b.Append(rec(0, 10)); err != nil {
				t.Fatal(err)
			}
			ffs.Add(faultfs.Rule{Op: faultfs.OpWrite, Match: func(p string) bool { return p == a.Path() }, Err: syscall.ENOSPC})
			if err := a.Append(rec(1, 10)); err != nil { // takes the buffer, flushing b's record
				t.Fatal(err)
			}
			size0 := b.Size()
			err := b.Append(rec(2, size)) // flushes a's record: fails
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Append that flushed the other log's failing write = %v, want ENOSPC", err)
			}
			if !strings.Contains(err.Error(), a.Path()) {
				t.Errorf("error %q does not name the log that failed", err)
			}
			var le *spill.LogError
			if !errors.As(err, &le) || le.Path != a.Path() {
				t.Errorf("error %v is not a *LogError for %s", err, a.Path())
			}
			if !errors.Is(a.Err(), syscall.ENOSPC) {
				t.Errorf("the failed log's Err() = %v", a.Err())
			}
			if err := a.Append(rec(3, 10)); err != a.Err() {
				t.Errorf("the failed log's next Append = %v, want its sticky error", err)
			}
			if b.Err() != nil || b.Size() != size0 {
				t.Errorf("the caller's log: Err %v, Size %d (was %d)", b.Err(), b.Size(), size0)
			}
			if err := b.Append(rec(4, size)); err != nil {
				t.Fatalf("the caller's log after the other's failure: %v", err)
			}
			got, err := readAll(b)
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, got, [][]byte{rec(0, 10), rec(4, size)})
		})
	}
}

// TestTruncateMeetsOtherLogError: a Truncate that must close another log's file to open its own,
// and fails doing so, leaves its log exactly as it was, buffered records included.
func TestTruncateMeetsOtherLogError(t *testing.T) {
	ffs := faultfs.New(vfs.OS())
	s := openStore(t, spill.Options{FS: ffs, BufferSize: 4096, MaxOpenFiles: 1})
	l, other := create(t, s), create(t, s)
	var want [][]byte
	for i := range 3 {
		want = append(want, rec(i, 10))
		if err := l.Append(want[i]); err != nil {
			t.Fatal(err)
		}
	}
	mark := l.Size() / 3 // after the first record
	if _, err := readAll(l); err != nil {
		t.Fatal(err)
	}
	want = append(want, rec(3, 10))
	if err := l.Append(want[3]); err != nil { // buffered
		t.Fatal(err)
	}
	if err := other.Append(rec(9, 5000)); err != nil { // flushes l, then takes the one descriptor
		t.Fatal(err)
	}
	if err := l.Append(rec(4, 10)); err != nil { // buffered again, l's file closed
		t.Fatal(err)
	}
	want = append(want, rec(4, 10))
	size := l.Size()
	ffs.Add(faultfs.Rule{Op: faultfs.OpClose, Match: func(p string) bool { return p == other.Path() }, Err: syscall.EIO})
	err := l.Truncate(mark)
	var le *spill.LogError
	if !errors.As(err, &le) || le.Path != other.Path() || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Truncate = %v, want a *LogError for %s", err, other.Path())
	}
	if l.Err() != nil || l.Size() != size {
		t.Fatalf("after the failed Truncate: Err %v, Size %d, want nil, %d", l.Err(), l.Size(), size)
	}
	ffs.Reset()
	got, err := readAll(l)
	if err != nil {
		t.Fatal(err)
	}
	equalRecords(t, got, want)
}

// TestOutOfDescriptors: when opening a log's file fails with EMFILE or ENFILE, the store closes
// other logs' files, least recently used first, and tries again; it fails only when it has no file
// left to close, and then the error sticks to the log whose records could not be written.
func TestOutOfDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		errno   syscall.Errno
		count   int // failed opens before one succeeds; 0: every open fails
		others  int // other logs with an open file
		wantErr bool
	}{
		{"EMFILE once", syscall.EMFILE, 1, 3, false},
		{"ENFILE until all others are closed", syscall.ENFILE, 3, 3, false},
		{"EMFILE with nothing to close", syscall.EMFILE, 1, 0, true},
		{"EMFILE for good", syscall.EMFILE, 0, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ffs := faultfs.New(vfs.OS())
			s := openStore(t, spill.Options{FS: ffs, BufferSize: 64, MaxOpenFiles: 100})
			var others []*spill.Log
			for i := range tc.others {
				o := create(t, s)
				if err := o.Append(rec(i, 100)); err != nil { // written through: its file stays open
					t.Fatal(err)
				}
				others = append(others, o)
			}
			l := create(t, s)
			ffs.Add(faultfs.Rule{Op: faultfs.OpOpen, Match: func(p string) bool { return p == l.Path() }, Count: tc.count, Err: tc.errno})
			err := l.Append(rec(7, 100))
			if tc.wantErr {
				if !errors.Is(err, tc.errno) || l.Err() != err {
					t.Fatalf("Append = %v (Err %v), want sticky %v", err, l.Err(), tc.errno)
				}
			} else if err != nil {
				t.Fatalf("Append = %v, want recovery", err)
			}
			if fired := ffs.Fired(); tc.count > 0 && fired != tc.count {
				t.Errorf("%d opens failed, want %d", fired, tc.count)
			}
			ffs.Reset()
			for i, o := range others {
				got, err := readAll(o)
				if err != nil {
					t.Fatalf("other log %d: %v", i, err)
				}
				equalRecords(t, got, [][]byte{rec(i, 100)})
			}
			if !tc.wantErr {
				got, err := readAll(l)
				if err != nil {
					t.Fatal(err)
				}
				equalRecords(t, got, [][]byte{rec(7, 100)})
			}
		})
	}
}
