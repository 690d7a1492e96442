// Package faultfs wraps a spill.FS and injects errors into chosen operations, for tests of code
// that must survive disk trouble: disk full, short writes, failing fsync or close, read errors.
//
// Rules are checked in the order they were added; the first rule that matches an operation decides
// its fate. A FS is safe for concurrent use.
package faultfs

import (
	"io"
	"io/fs"
	"sync"

	"github.com/pgreorder/pgreorder/spill"
)

// Op names an operation that can fail.
type Op int

// Operations.
const (
	OpOpen     Op = iota + 1 // FS.OpenFile
	OpMkdir                  // FS.MkdirAll
	OpRemove                 // FS.Remove
	OpReadDir                // FS.ReadDir
	OpLock                   // FS.Lock
	OpRead                   // File.ReadAt
	OpWrite                  // File.WriteAt
	OpTruncate               // File.Truncate
	OpSync                   // File.Sync
	OpClose                  // File.Close (the file is closed anyway)
)

var opNames = [...]string{"", "open", "mkdir", "remove", "readdir", "lock", "read", "write", "truncate", "sync", "close"}

func (o Op) String() string {
	if o > 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return "op?"
}

// Rule describes a fault.
type Rule struct {
	Op    Op
	Match func(path string) bool // nil matches every path
	Skip  int                    // let this many matching operations succeed first
	Count int                    // fail this many times, then stop; 0 = forever
	Err   error                  // the error returned; must not be nil
	// Partial, for OpWrite and OpRead, transfers the first half of the bytes before failing with
	// Err, as a disk filling up mid-write does. With a nil Err a partial write returns no error at
	// all (a short write that breaks the io.WriterAt contract).
	Partial bool
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

func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (spill.File, error) {
	if r := f.fault(OpOpen, name); r != nil {
		return nil, r.Err
	}
	file, err := f.base.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &File{fs: f, name: name, f: file}, nil
}

func (f *FS) MkdirAll(name string, perm fs.FileMode) error {
	if r := f.fault(OpMkdir, name); r != nil {
		return r.Err
	}
	return f.base.MkdirAll(name, perm)
}

func (f *FS) Remove(name string) error {
	if r := f.fault(OpRemove, name); r != nil {
		return r.Err
	}
	return f.base.Remove(name)
}

func (f *FS) ReadDir(name string) ([]fs.DirEntry, error) {
	if r := f.fault(OpReadDir, name); r != nil {
		return nil, r.Err
	}
	return f.base.ReadDir(name)
}

func (f *FS) Lock(name string) (io.Closer, error) {
	if r := f.fault(OpLock, name); r != nil {
		return nil, r.Err
	}
	return f.base.Lock(name)
}

// File is a file opened through a FS.
type File struct {
	fs   *FS
	name string
	f    spill.File
}

func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if r := f.fs.fault(OpRead, f.name); r != nil {
		if !r.Partial {
			return 0, r.Err
		}
		n, _ := f.f.ReadAt(p[:len(p)/2], off)
		return n, r.Err
	}
	return f.f.ReadAt(p, off)
}

func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if r := f.fs.fault(OpWrite, f.name); r != nil {
		if !r.Partial {
			return 0, r.Err
		}
		n, err := f.f.WriteAt(p[:len(p)/2], off)
		if err != nil {
			return n, err
		}
		return n, r.Err
	}
	return f.f.WriteAt(p, off)
}

func (f *File) Truncate(size int64) error {
	if r := f.fs.fault(OpTruncate, f.name); r != nil {
		return r.Err
	}
	return f.f.Truncate(size)
}

func (f *File) Sync() error {
	if r := f.fs.fault(OpSync, f.name); r != nil {
		return r.Err
	}
	return f.f.Sync()
}

func (f *File) Close() error {
	err := f.f.Close()
	if r := f.fs.fault(OpClose, f.name); r != nil {
		return r.Err
	}
	return err
}
