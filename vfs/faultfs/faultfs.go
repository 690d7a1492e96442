// Package faultfs wraps a vfs.FS and injects errors into chosen operations, for tests of code
// that must survive disk trouble: disk full, short writes, failing fsync or close, read errors,
// running out of descriptors, a rename that fails, a crash. Everything pgreorder writes goes
// through a vfs.FS (spill logs, format's durable output, changefeed's position file), so the same
// rules test each of them.
//
// Rules are checked in the order they were added; the first rule that matches an operation decides
// its fate. An operation that fails is not passed on to the wrapped FS at all (but for Close,
// which closes anyway, and a partial transfer, which transfers half first), so a rule for OpAny
// that lets the first n operations through and fails every later one is a crash after those n:
// nothing after them reaches the disk. A FS is safe for concurrent use.
package faultfs

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/pgreorder/pgreorder/vfs"
)

// Op names an operation that can fail.
type Op int

// Operations.
const (
	OpOpen     Op = iota + 1 // Dir.OpenFile
	OpMkdir                  // Dir.Mkdir, FS.MkdirAll
	OpRemove                 // Dir.Remove, Dir.RemoveDir
	OpReadDir                // Dir.ReadDir
	OpLock                   // Dir.Lock
	OpRead                   // File.ReadAt
	OpWrite                  // File.WriteAt
	OpTruncate               // File.Truncate
	OpSync                   // File.Sync, Dir.Sync (the path is the directory's)
	OpClose                  // File.Close (the file is closed anyway)
	OpOpenDir                // FS.OpenDir, Dir.OpenDir
	OpStat                   // Dir.Stat, Dir.Lstat, File.Stat, LockFile.Stat
	OpRename                 // Dir.Rename (the path is oldname's)

	// OpAny matches every operation above.
	OpAny Op = -1
)

var opNames = [...]string{"", "open", "mkdir", "remove", "readdir", "lock", "read", "write", "truncate", "sync", "close", "opendir", "stat", "rename"}

func (o Op) String() string {
	switch {
	case o == OpAny:
		return "any"
	case o > 0 && int(o) < len(opNames):
		return opNames[o]
	}
	return "op?"
}

// Rule describes a fault.
type Rule struct {
	Op    Op
	Match func(path string) bool // nil matches every path; for Dir methods, the directory's path joined with the name
	Skip  int                    // let this many matching operations succeed first
	Count int                    // fail this many times, then stop; 0 = forever
	// Err is the error the operation returns; nil means ErrInjected, except with Partial.
	Err error
	// Partial, for OpWrite and OpRead, transfers the first half of the bytes before failing with
	// Err, as a disk filling up mid-write does. With a nil Err the partial transfer returns no
	// error at all: a short write or read that breaks the io.WriterAt or io.ReaderAt contract, as
	// a faulty file system might.
	Partial bool
}

// ErrInjected is the error of a fault whose Rule has no Err.
var ErrInjected = errors.New("faultfs: injected fault")

// err is the error r injects into an operation that is not a partial transfer.
func (r *Rule) err() error {
	if r.Err == nil {
		return ErrInjected
	}
	return r.Err
}

type rule struct {
	Rule
	seen, fired int
}

// FS injects faults into the operations of a base FS.
type FS struct {
	base  vfs.FS
	mu    sync.Mutex
	rules []*rule
	fired int
}

// New returns a FS passing everything to base until rules are added.
func New(base vfs.FS) *FS { return &FS{base: base} }

// Add adds a rule.
func (f *FS) Add(r Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &rule{Rule: r})
}

// Reset removes all rules.
func (f *FS) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

// Fired returns how many faults have been injected so far.
func (f *FS) Fired() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// fault returns the rule that makes this operation fail, or nil.
func (f *FS) fault(op Op, path string) *Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if (r.Op != op && r.Op != OpAny) || (r.Match != nil && !r.Match(path)) {
			continue
		}
		if r.Count > 0 && r.fired >= r.Count {
			continue
		}
		r.seen++
		if r.seen <= r.Skip {
			return nil
		}
		r.fired++
		f.fired++
		return &r.Rule
	}
	return nil
}

// check returns the error of the rule that makes the operation op on path fail, or else what do,
// the wrapped operation, returns.
func (f *FS) check(op Op, path string, do func() error) error {
	if r := f.fault(op, path); r != nil {
		return r.err()
	}
	return do()
}

// get is check for an operation that returns a value: its zero value when a rule fails it.
func get[T any](f *FS, op Op, path string, do func() (T, error)) (T, error) {
	if r := f.fault(op, path); r != nil {
		var zero T
		return zero, r.err()
	}
	return do()
}

// MkdirAll creates a directory of the base FS.
func (f *FS) MkdirAll(path string, perm fs.FileMode) error {
	return f.check(OpMkdir, path, func() error { return f.base.MkdirAll(path, perm) })
}

// OpenDir opens a directory of the base FS, whose operations then go through f's rules.
func (f *FS) OpenDir(path string) (vfs.Dir, error) {
	d, err := get(f, OpOpenDir, path, func() (vfs.Dir, error) { return f.base.OpenDir(path) })
	if err != nil {
		return nil, err
	}
	return &dir{fs: f, path: path, d: d}, nil
}

// dir is a directory opened through a FS.
type dir struct {
	fs   *FS
	path string
	d    vfs.Dir
}

func (d *dir) join(name string) string { return filepath.Join(d.path, name) }

func (d *dir) OpenFile(name string, flag int, perm fs.FileMode) (vfs.File, error) {
	f, err := get(d.fs, OpOpen, d.join(name), func() (vfs.File, error) { return d.d.OpenFile(name, flag, perm) })
	if err != nil {
		return nil, err
	}
	return &file{fs: d.fs, path: d.join(name), f: f}, nil
}

func (d *dir) Lock(name string, create bool) (vfs.LockFile, error) {
	l, err := get(d.fs, OpLock, d.join(name), func() (vfs.LockFile, error) { return d.d.Lock(name, create) })
	if err != nil {
		return nil, err
	}
	return &lockFile{fs: d.fs, path: d.join(name), l: l}, nil
}

func (d *dir) OpenDir(name string) (vfs.Dir, error) {
	sub, err := get(d.fs, OpOpenDir, d.join(name), func() (vfs.Dir, error) { return d.d.OpenDir(name) })
	if err != nil {
		return nil, err
	}
	return &dir{fs: d.fs, path: d.join(name), d: sub}, nil
}

func (d *dir) Mkdir(name string, perm fs.FileMode) error {
	return d.fs.check(OpMkdir, d.join(name), func() error { return d.d.Mkdir(name, perm) })
}

func (d *dir) Remove(name string) error {
	return d.fs.check(OpRemove, d.join(name), func() error { return d.d.Remove(name) })
}

func (d *dir) RemoveDir(name string) error {
	return d.fs.check(OpRemove, d.join(name), func() error { return d.d.RemoveDir(name) })
}

func (d *dir) Rename(oldname, newname string) error {
	return d.fs.check(OpRename, d.join(oldname), func() error { return d.d.Rename(oldname, newname) })
}

func (d *dir) ReadDir() ([]string, error) { return get(d.fs, OpReadDir, d.path, d.d.ReadDir) }

func (d *dir) Lstat(name string) (vfs.Info, error) {
	return get(d.fs, OpStat, d.join(name), func() (vfs.Info, error) { return d.d.Lstat(name) })
}

func (d *dir) Stat() (vfs.Info, error) { return get(d.fs, OpStat, d.path, d.d.Stat) }
func (d *dir) Sync() error             { return d.fs.check(OpSync, d.path, d.d.Sync) }
func (d *dir) Close() error            { return d.d.Close() }

// lockFile is a lock taken through a FS.
type lockFile struct {
	fs   *FS
	path string
	l    vfs.LockFile
}

func (l *lockFile) Stat() (vfs.Info, error) { return get(l.fs, OpStat, l.path, l.l.Stat) }
func (l *lockFile) Close() error            { return l.l.Close() }

// file is a file opened through a FS.
type file struct {
	fs   *FS
	path string
	f    vfs.File
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	return f.transfer(OpRead, p, off, f.f.ReadAt)
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	return f.transfer(OpWrite, p, off, f.f.WriteAt)
}

// transfer runs do, the wrapped file's ReadAt or WriteAt, on p at off, unless a rule for op fails
// it: then it returns the rule's error, after transferring the first half of p for a Partial
// rule (an error of a half write is returned instead; a half read may meet the end of the file,
// and returns the rule's).
func (f *file) transfer(op Op, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
	r := f.fs.fault(op, f.path)
	switch {
	case r == nil:
		return do(p, off)
	case !r.Partial:
		return 0, r.err()
	}
	n, err := do(p[:len(p)/2], off)
	if err != nil && op == OpWrite {
		return n, err
	}
	return n, r.Err
}

func (f *file) Truncate(size int64) error {
	return f.fs.check(OpTruncate, f.path, func() error { return f.f.Truncate(size) })
}

func (f *file) Sync() error             { return f.fs.check(OpSync, f.path, f.f.Sync) }
func (f *file) Stat() (vfs.Info, error) { return get(f.fs, OpStat, f.path, f.f.Stat) }
func (f *file) Name() string            { return f.f.Name() }

func (f *file) Close() error {
	err := f.f.Close()
	if r := f.fs.fault(OpClose, f.path); r != nil {
		return r.err()
	}
	return err
}
