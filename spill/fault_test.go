package spill_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spill/faultfs"
)

// TestFaults injects one kind of disk trouble per case and checks that it surfaces from the call
// that hit it (or the log's next call), sticks to that log, never yields a record that was not
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
			name: "write-through of a large record torn after its frame header",
			opts: spill.Options{BufferSize: 64},
			rule: func(v **spill.Log) faultfs.Rule {
				// writes: file header + frame header, payload
				return faultfs.Rule{Op: faultfs.OpWrite, Match: isLog(v), Skip: 1, Err: syscall.ENOSPC, Partial: true}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				return l.Append(rec(7, 1000))
			},
			wantErr: syscall.ENOSPC, sticky: true,
		},
		{
			name: "flush failure charged to the buffer's owner, reported by its next call",
			opts: spill.Options{BufferSize: 4096},
			rule: func(v **spill.Log) faultfs.Rule {
				return faultfs.Rule{Op: faultfs.OpWrite, Match: isLog(v), Err: syscall.ENOSPC}
			},
			act: func(t *testing.T, s *spill.Store, l *spill.Log) error {
				if err := l.Append(rec(1, 10)); err != nil {
					t.Fatalf("buffered Append failed: %v", err)
				}
				other := create(t, s)
				if err := other.Append(rec(2, 10)); err != nil { // flushes l: fails, but not other's fault
					t.Fatalf("other log's Append: %v", err)
				}
				return l.Append(rec(3, 10))
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
				if err := other.Append(rec(2, 100)); err != nil { // evicts l's file
					t.Fatalf("other log's Append: %v", err)
				}
				return l.Append(rec(3, 10))
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
			ffs := faultfs.New(spill.OSFS())
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
				if err2 := l.Append([]byte("more")); err2 != err {
					t.Errorf("Append after fault = %v, want %v", err2, err)
				}
				if err2 := l.Truncate(0); err2 != err {
					t.Errorf("Truncate after fault = %v, want %v", err2, err)
				}
				r := l.NewReader()
				if got, err2 := r.Next(); err2 != err {
					t.Errorf("Reader.Next after fault = %q, %v; want %v", got, err2, err)
				}
				r.Close()
				if l.Err() != err {
					t.Errorf("Err() = %v, want %v", l.Err(), err)
				}
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
		ffs := faultfs.New(spill.OSFS())
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
