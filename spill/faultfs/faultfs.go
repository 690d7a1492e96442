// Package faultfs wraps a spill.FS and injects errors into chosen operations, for tests of code
// that must survive disk trouble: disk full, short writes, failing fsync or close, read errors,
// running out of descriptors.
//
// Rules are checked in the order they were added; the first rule that matches an operation decides
// its fate. A FS is safe for concurrent use.
package faultfs

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/pgreorder/pgreorder/spill"
)

// Op names an operation that can fail.
type Op int

// Operations.
const (
	OpOpen     Op = iota + 1 // Dir.OpenFile
	OpMkdir                  // Dir.Mkdir
	OpRemove                 // Dir.Remove, Dir.RemoveDir
	OpReadDir                // Dir.ReadDir
	OpLock                   // Dir.Lock
	OpRead                   // File.ReadAt
	OpWrite                  // File.WriteAt
	OpTruncate               // File.Truncate
	OpSync                   // File.Sync
	OpClose                  // File.Close (the file is closed anyway)
	OpOpenDir                // FS.OpenDir, Dir.OpenDir
	OpStat                   // Dir.Stat, LockFile.Stat
	OpRename                 // Dir.Rename (the path is oldname's)
)

var opNames = [...]string{"", "open", "mkdir", "remove", "readdir", "lock", "read", "write", "truncate", "sync", "close", "opendir", "stat", "rename"}

func (o Op) String() string {
	if o > 0 && int(o) < len(opNames) {
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
	base  spill.FS
	mu    sync.Mutex
	rules []*rule
	fired int
}

// New returns a FS passing everything to base until rules are added.
func New(base spill.FS) *FS { return &FS{base: base} }

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
		if r.Op != op || (r.Match != nil && !r.Match(path)) {
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

// OpenDir opens a directory of the base FS, whose operations then go through f's rules.
func (f *FS) OpenDir(path string) (spill.Dir, error) {
	if r := f.fault(OpOpenDir, path); r != nil {
		return nil, r.err()
	}
	d, err := f.base.OpenDir(path)
	if err != nil {
		return nil, err
	}
	return &dir{fs: f, path: path, d: d}, nil
}

// dir is a directory opened through a FS.
type dir struct {
	fs   *FS
	path string
	d    spill.Dir
}

func (d *dir) OpenFile(name string, flag int, perm fs.FileMode) (spill.File, error) {
	p := filepath.Join(d.path, name)
	if r := d.fs.fault(OpOpen, p); r != nil {
		return nil, r.err()
	}
	f, err := d.d.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &file{fs: d.fs, path: p, f: f}, nil
}

func (d *dir) Lock(name string, create bool) (spill.LockFile, error) {
	p := filepath.Join(d.path, name)
	if r := d.fs.fault(OpLock, p); r != nil {
		return nil, r.err()
	}
	l, err := d.d.Lock(name, create)
	if err != nil {
		return nil, err
	}
	return &lockFile{fs: d.fs, path: p, l: l}, nil
}

func (d *dir) Mkdir(name string, perm fs.FileMode) error {
	if r := d.fs.fault(OpMkdir, filepath.Join(d.path, name)); r != nil {
		return r.err()
	}
	return d.d.Mkdir(name, perm)
}

func (d *dir) OpenDir(name string) (spill.Dir, error) {
	p := filepath.Join(d.path, name)
	if r := d.fs.fault(OpOpenDir, p); r != nil {
		return nil, r.err()
	}
	sub, err := d.d.OpenDir(name)
	if err != nil {
		return nil, err
	}
	return &dir{fs: d.fs, path: p, d: sub}, nil
}

func (d *dir) Remove(name string) error {
	if r := d.fs.fault(OpRemove, filepath.Join(d.path, name)); r != nil {
		return r.err()
	}
	return d.d.Remove(name)
}

func (d *dir) RemoveDir(name string) error {
	if r := d.fs.fault(OpRemove, filepath.Join(d.path, name)); r != nil {
		return r.err()
	}
	return d.d.RemoveDir(name)
}

func (d *dir) Rename(oldname, newname string) error {
	if r := d.fs.fault(OpRename, filepath.Join(d.path, oldname)); r != nil {
		return r.err()
	}
	return d.d.Rename(oldname, newname)
}

func (d *dir) ReadDir() ([]string, error) {
	if r := d.fs.fault(OpReadDir, d.path); r != nil {
		return nil, r.err()
	}
	return d.d.ReadDir()
}

func (d *dir) Stat() (spill.Info, error) {
	if r := d.fs.fault(OpStat, d.path); r != nil {
		return spill.Info{}, r.err()
	}
	return d.d.Stat()
}

func (d *dir) Close() error { return d.d.Close() }

// lockFile is a lock taken through a FS.
type lockFile struct {
	fs   *FS
	path string
	l    spill.LockFile
}

func (l *lockFile) Stat() (spill.Info, error) {
	if r := l.fs.fault(OpStat, l.path); r != nil {
		return spill.Info{}, r.err()
	}
	return l.l.Stat()
}

func (l *lockFile) Close() error { return l.l.Close() }

// file is a file opened through a FS.
type file struct {
	fs   *FS
	path string
	f    spill.File
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	if r := f.fs.fault(OpRead, f.path); r != nil {
		if !r.Partial {
			return 0, r.err()
		}
		n, _ := f.f.ReadAt(p[:len(p)/2], off)
		return n, r.Err
	}
	return f.f.ReadAt(p, off)
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	if r := f.fs.fault(OpWrite, f.path); r != nil {
		if !r.Partial {
			return 0, r.err()
		}
		n, err := f.f.WriteAt(p[:len(p)/2], off)
		if err != nil {
			return n, err
		}
		return n, r.Err
	}
	return f.f.WriteAt(p, off)
}

func (f *file) Truncate(size int64) error {
	if r := f.fs.fault(OpTruncate, f.path); r != nil {
		return r.err()
	}
	return f.f.Truncate(size)
}

func (f *file) Sync() error {
	if r := f.fs.fault(OpSync, f.path); r != nil {
		return r.err()
	}
	return f.f.Sync()
}

func (f *file) Close() error {
	err := f.f.Close()
	if r := f.fs.fault(OpClose, f.path); r != nil {
		return r.err()
	}
	return err
}
