package faultfs_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
)

// setup returns a directory holding the file "f" (10 bytes) and the directory "sub", opened
// through ffs, and its path.
func setup(t *testing.T, ffs *faultfs.FS) (vfs.Dir, string) {
	t.Helper()
	path := t.TempDir()
	if err := os.WriteFile(filepath.Join(path, "f"), []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(path, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := ffs.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

func openF(d vfs.Dir) (vfs.File, error) { return d.OpenFile("f", os.O_RDWR, 0) }

// withFile runs op on the file "f" of d.
func withFile(op func(vfs.File) error) func(vfs.Dir) error {
	return func(d vfs.Dir) error {
		f, err := openF(d)
		if err != nil {
			return err
		}
		defer f.Close()
		return op(f)
	}
}

// TestEachOp: a rule for an operation (with no Err: ErrInjected) makes exactly that operation
// fail, with the path it names, and no other.
func TestEachOp(t *testing.T) {
	open, cl, lock := faultfs.OpOpen, faultfs.OpClose, faultfs.OpLock
	ops := []struct {
		op    faultfs.Op
		name  string // relative to the directory; "" for the directory itself
		do    func(d vfs.Dir) error
		needs []faultfs.Op // other operations do performs
	}{
		{faultfs.OpOpen, "f", func(d vfs.Dir) error { _, err := openF(d); return err }, nil},
		{faultfs.OpMkdir, "m", func(d vfs.Dir) error { return d.Mkdir("m", 0o700) }, nil},
		{faultfs.OpRemove, "f", func(d vfs.Dir) error { return d.Remove("f") }, nil},
		{faultfs.OpRemove, "sub", func(d vfs.Dir) error { return d.RemoveDir("sub") }, nil},
		{faultfs.OpReadDir, "", func(d vfs.Dir) error { _, err := d.ReadDir(); return err }, nil},
		{faultfs.OpLock, "f", func(d vfs.Dir) error {
			l, err := d.Lock("f", false)
			if err == nil {
				l.Close()
			}
			return err
		}, nil},
		{faultfs.OpRead, "f", withFile(func(f vfs.File) error { _, err := f.ReadAt(make([]byte, 4), 0); return err }), []faultfs.Op{open, cl}},
		{faultfs.OpWrite, "f", withFile(func(f vfs.File) error { _, err := f.WriteAt([]byte("ab"), 0); return err }), []faultfs.Op{open, cl}},
		{faultfs.OpTruncate, "f", withFile(func(f vfs.File) error { return f.Truncate(3) }), []faultfs.Op{open, cl}},
		{faultfs.OpSync, "f", withFile(func(f vfs.File) error { return f.Sync() }), []faultfs.Op{open, cl}},
		{faultfs.OpClose, "f", func(d vfs.Dir) error {
			f, err := openF(d)
			if err != nil {
				return err
			}
			return f.Close()
		}, []faultfs.Op{open}},
		{faultfs.OpOpenDir, "sub", func(d vfs.Dir) error {
			sub, err := d.OpenDir("sub")
			if err == nil {
				sub.Close()
			}
			return err
		}, nil},
		{faultfs.OpStat, "", func(d vfs.Dir) error { _, err := d.Stat(); return err }, nil},
		{faultfs.OpStat, "f", func(d vfs.Dir) error {
			l, err := d.Lock("f", false)
			if err != nil {
				return err
			}
			defer l.Close()
			_, err = l.Stat()
			return err
		}, []faultfs.Op{lock}},
		{faultfs.OpRename, "f", func(d vfs.Dir) error { return d.Rename("f", "g") }, nil},
		{faultfs.OpStat, "f", func(d vfs.Dir) error { _, err := d.Lstat("f"); return err }, nil},
		{faultfs.OpStat, "f", withFile(func(f vfs.File) error { _, err := f.Stat(); return err }), []faultfs.Op{open, cl}},
		{faultfs.OpSync, "", func(d vfs.Dir) error { return d.Sync() }, nil},
	}
	for _, tc := range ops {
		t.Run(tc.op.String()+"/"+tc.name, func(t *testing.T) {
			ffs := faultfs.New(vfs.OS())
			d, path := setup(t, ffs)
			var matched []string
			ffs.Add(faultfs.Rule{Op: tc.op, Match: func(p string) bool { matched = append(matched, p); return true }})
			if err := tc.do(d); !errors.Is(err, faultfs.ErrInjected) {
				t.Fatalf("%v with a rule for it: %v, want ErrInjected", tc.op, err)
			}
			if ffs.Fired() != 1 {
				t.Errorf("Fired() = %d, want 1", ffs.Fired())
			}
			if want := filepath.Join(path, tc.name); len(matched) != 1 || matched[0] != want {
				t.Errorf("Match saw %q, want [%s]", matched, want)
			}
			// Rules for every operation it does not perform do not touch it.
			ffs.Reset()
			for op := faultfs.OpOpen; op <= faultfs.OpRename; op++ {
				if op != tc.op && !slices.Contains(tc.needs, op) {
					ffs.Add(faultfs.Rule{Op: op})
				}
			}
			if err := tc.do(d); err != nil || ffs.Fired() != 1 {
				t.Fatalf("%v with rules for other operations: %v (%d fired)", tc.op, err, ffs.Fired()-1)
			}
		})
	}
}

// TestRuleOrder: Skip lets matching operations through first, Count ends a rule, Match narrows
// it, and the first rule that matches (and has not ended) decides.
func TestRuleOrder(t *testing.T) {
	errA, errB := errors.New("A"), errors.New("B")
	isB := func(p string) bool { return filepath.Base(p) == "b" }
	for _, tc := range []struct {
		name  string
		rules []faultfs.Rule
		opens []string
		want  []error
	}{
		{"forever", []faultfs.Rule{{Op: faultfs.OpOpen}}, []string{"a", "a", "a"}, []error{faultfs.ErrInjected, faultfs.ErrInjected, faultfs.ErrInjected}},
		{"skip and count", []faultfs.Rule{{Op: faultfs.OpOpen, Skip: 1, Count: 2, Err: errA}}, []string{"a", "a", "a", "a"}, []error{nil, errA, errA, nil}},
		{"match", []faultfs.Rule{{Op: faultfs.OpOpen, Match: isB, Err: errA}}, []string{"a", "b", "a", "b"}, []error{nil, errA, nil, errA}},
		{"first rule decides", []faultfs.Rule{{Op: faultfs.OpOpen, Match: isB, Err: errA}, {Op: faultfs.OpOpen, Err: errB}}, []string{"a", "b"}, []error{errB, errA}},
		{"an ended rule gives way", []faultfs.Rule{{Op: faultfs.OpOpen, Count: 1, Err: errA}, {Op: faultfs.OpOpen, Err: errB}}, []string{"a", "a", "a"}, []error{errA, errB, errB}},
		{"other ops do not count", []faultfs.Rule{{Op: faultfs.OpMkdir, Err: errA}}, []string{"a"}, []error{nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ffs := faultfs.New(vfs.OS())
			d, _ := setup(t, ffs)
			for _, r := range tc.rules {
				ffs.Add(r)
			}
			fired := 0
			for i, name := range tc.opens {
				f, err := d.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
				if err == nil {
					f.Close()
				} else {
					fired++
				}
				if !errors.Is(err, tc.want[i]) || (err == nil) != (tc.want[i] == nil) {
					t.Fatalf("open %d (%s): %v, want %v", i, name, err, tc.want[i])
				}
			}
			if ffs.Fired() != fired {
				t.Errorf("Fired() = %d, want %d", ffs.Fired(), fired)
			}
		})
	}
}

// TestPartial: a partial write or read transfers half the bytes, then returns Err, or no error
// at all when Err is nil.
func TestPartial(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   faultfs.Op
		err  error
	}{
		{"write ENOSPC", faultfs.OpWrite, syscall.ENOSPC},
		{"write short, no error", faultfs.OpWrite, nil},
		{"read EIO", faultfs.OpRead, syscall.EIO},
		{"read short, no error", faultfs.OpRead, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ffs := faultfs.New(vfs.OS())
			d, path := setup(t, ffs)
			f, err := openF(d)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			ffs.Add(faultfs.Rule{Op: tc.op, Err: tc.err, Partial: true})
			buf := []byte("abcdefgh")
			var n int
			if tc.op == faultfs.OpWrite {
				n, err = f.WriteAt(buf, 0)
			} else {
				n, err = f.ReadAt(buf, 0)
			}
			if n != 4 || err != tc.err {
				t.Fatalf("transferred %d bytes, %v; want 4, %v", n, err, tc.err)
			}
			got, err := os.ReadFile(filepath.Join(path, "f"))
			if err != nil {
				t.Fatal(err)
			}
			want := []byte("0123456789")
			if tc.op == faultfs.OpWrite {
				want = []byte("abcd456789")
			} else if !bytes.Equal(buf, []byte("0123efgh")) {
				t.Errorf("read into the buffer: %q", buf)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("file holds %q, want %q", got, want)
			}
		})
	}
}

// TestCloseClosesAnyway: a failed Close still closes the file.
func TestCloseClosesAnyway(t *testing.T) {
	ffs := faultfs.New(vfs.OS())
	d, _ := setup(t, ffs)
	f, err := openF(d)
	if err != nil {
		t.Fatal(err)
	}
	ffs.Add(faultfs.Rule{Op: faultfs.OpClose, Count: 1, Err: syscall.EIO})
	if err := f.Close(); err != syscall.EIO {
		t.Fatalf("Close = %v, want EIO", err)
	}
	if _, err := f.ReadAt(make([]byte, 1), 0); err == nil || err == io.EOF {
		t.Fatalf("ReadAt after the failed Close: %v, want an error", err)
	}
}

// TestMkdirAll: FS.MkdirAll goes through OpMkdir rules with its path, and creates nothing when one
// fires.
func TestMkdirAll(t *testing.T) {
	ffs := faultfs.New(vfs.OS())
	path := filepath.Join(t.TempDir(), "a", "b")
	var matched []string
	ffs.Add(faultfs.Rule{Op: faultfs.OpMkdir, Count: 1, Match: func(p string) bool { matched = append(matched, p); return true }})
	if err := ffs.MkdirAll(path, 0o700); !errors.Is(err, faultfs.ErrInjected) {
		t.Fatalf("MkdirAll with a rule for it: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("created after all: %v", err)
	}
	if len(matched) != 1 || matched[0] != path {
		t.Errorf("Match saw %q, want [%s]", matched, path)
	}
	if err := ffs.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		t.Fatalf("after the rule ended: %v, %v", fi, err)
	}
}

// TestCrash: a rule for OpAny that lets n operations through fails every later one, of every
// kind, without passing it on: what is on disk is what the first n did.
func TestCrash(t *testing.T) {
	ffs := faultfs.New(vfs.OS())
	d, path := setup(t, ffs)
	seen := 0
	ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Match: func(string) bool { seen++; return false }})
	ffs.Add(faultfs.Rule{Op: faultfs.OpAny, Skip: 2, Err: syscall.EIO})
	f, err := d.OpenFile("g", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600) // 1
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("written"), 0); err != nil { // 2
		t.Fatal(err)
	}
	if err := f.Sync(); err != syscall.EIO {
		t.Fatalf("Sync after the crash: %v", err)
	}
	if err := d.Rename("g", "f"); err != syscall.EIO {
		t.Fatalf("Rename after the crash: %v", err)
	}
	if _, err := d.ReadDir(); err != syscall.EIO {
		t.Fatalf("ReadDir after the crash: %v", err)
	}
	if err := f.Close(); err != syscall.EIO {
		t.Fatalf("Close after the crash: %v", err)
	}
	if seen != 6 || ffs.Fired() != 4 {
		t.Errorf("%d operations seen, %d fired; want 6, 4", seen, ffs.Fired())
	}
	for name, want := range map[string]string{"f": "0123456789", "g": "written"} {
		if b, err := os.ReadFile(filepath.Join(path, name)); err != nil || string(b) != want {
			t.Errorf("%s holds %q, %v; want %q", name, b, err, want)
		}
	}
	if faultfs.OpAny.String() != "any" || faultfs.OpRename.String() != "rename" || faultfs.Op(99).String() != "op?" {
		t.Error("Op.String")
	}
}
