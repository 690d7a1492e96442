package spill

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/pgreorder/pgreorder/vfs"
)

// memFS is an in-memory vfs.FS for tests that must not touch the disk (fuzzing). Directories are
// named by path; a handle keeps the node it opened.
type memFS struct {
	mu    sync.Mutex
	nodes map[string]*memNode // by clean path
	ino   uint64
}

type memNode struct {
	ino    uint64
	dir    bool
	data   []byte
	locked bool
	nlink  uint64
}

func newMemFS() *memFS { return &memFS{nodes: make(map[string]*memNode)} }

func (m *memFS) newNode(dir bool) *memNode {
	m.ino++
	return &memNode{ino: m.ino, dir: dir, nlink: 1}
}

// MkdirAll makes path a directory (its parents are not nodes of their own).
func (m *memFS) MkdirAll(path string, _ fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	path = filepath.Clean(path)
	n := m.nodes[path]
	if n == nil {
		m.nodes[path] = m.newNode(true)
	} else if !n.dir {
		return &fs.PathError{Op: "mkdir", Path: path, Err: fs.ErrExist}
	}
	return nil
}

func (m *memFS) OpenDir(path string) (vfs.Dir, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	path = filepath.Clean(path)
	n := m.nodes[path]
	switch {
	case n == nil:
		return nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrNotExist}
	case !n.dir:
		return nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrInvalid}
	}
	return &memDir{m: m, path: path, n: n}, nil
}

// put makes path a file holding data, for tests that write a log file directly.
func (m *memFS) put(path string, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.newNode(false)
	n.data = data
	m.nodes[filepath.Clean(path)] = n
}

type memDir struct {
	m    *memFS
	path string
	n    *memNode
}

// lookup returns name's path and node (nil if none); the caller holds m.mu.
func (d *memDir) lookup(name string) (string, *memNode, error) {
	p := filepath.Join(d.path, name)
	if !vfs.ValidName(name) {
		return p, nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrInvalid}
	}
	return p, d.m.nodes[p], nil
}

func (d *memDir) OpenFile(name string, flag int, _ fs.FileMode) (vfs.File, error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	p, n, err := d.lookup(name)
	switch {
	case err != nil:
		return nil, err
	case n != nil && flag&os.O_EXCL != 0:
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrExist}
	case n == nil && flag&os.O_CREATE == 0:
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	case n == nil:
		n = d.m.newNode(false)
		d.m.nodes[p] = n
	case n.dir:
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrInvalid}
	}
	return &memFile{m: d.m, n: n, path: p}, nil
}

func (d *memDir) Lock(name string, create bool) (vfs.LockFile, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	}
	f, err := d.OpenFile(name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	n := f.(*memFile).n
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if n.locked {
		return nil, fmt.Errorf("%w: %s", vfs.ErrLocked, filepath.Join(d.path, name))
	}
	n.locked = true
	return &memLock{m: d.m, n: n}, nil
}

func (d *memDir) Mkdir(name string, _ fs.FileMode) error {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	p, n, err := d.lookup(name)
	if err != nil {
		return err
	}
	if n != nil {
		return &fs.PathError{Op: "mkdir", Path: p, Err: fs.ErrExist}
	}
	d.m.nodes[p] = d.m.newNode(true)
	return nil
}

func (d *memDir) OpenDir(name string) (vfs.Dir, error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	p, n, err := d.lookup(name)
	switch {
	case err != nil:
		return nil, err
	case n == nil:
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	case !n.dir:
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrInvalid}
	}
	return &memDir{m: d.m, path: p, n: n}, nil
}

func (d *memDir) Remove(name string) error    { return d.remove(name, false) }
func (d *memDir) RemoveDir(name string) error { return d.remove(name, true) }

func (d *memDir) remove(name string, dir bool) error {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	p, n, err := d.lookup(name)
	switch {
	case err != nil:
		return err
	case n == nil:
		return &fs.PathError{Op: "remove", Path: p, Err: fs.ErrNotExist}
	case n.dir != dir:
		return &fs.PathError{Op: "remove", Path: p, Err: fs.ErrInvalid}
	}
	if dir {
		for q := range d.m.nodes {
			if filepath.Dir(q) == p {
				return &fs.PathError{Op: "remove", Path: p, Err: errors.New("directory not empty")}
			}
		}
	}
	n.nlink = 0
	delete(d.m.nodes, p)
	return nil
}

func (d *memDir) Rename(oldname, newname string) error {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	op, n, err := d.lookup(oldname)
	if err != nil {
		return err
	}
	np, old, err := d.lookup(newname)
	switch {
	case err != nil:
		return err
	case n == nil:
		return &fs.PathError{Op: "rename", Path: op, Err: fs.ErrNotExist}
	case n.dir || (old != nil && old.dir):
		return &fs.PathError{Op: "rename", Path: op, Err: fs.ErrInvalid}
	}
	if old != nil {
		old.nlink = 0
	}
	delete(d.m.nodes, op)
	d.m.nodes[np] = n
	return nil
}

func (d *memDir) ReadDir() ([]string, error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	var names []string
	for q := range d.m.nodes {
		if q != d.path && filepath.Dir(q) == d.path {
			names = append(names, filepath.Base(q))
		}
	}
	return names, nil
}

func (d *memDir) Lstat(name string) (vfs.Info, error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	p, n, err := d.lookup(name)
	switch {
	case err != nil:
		return vfs.Info{}, err
	case n == nil:
		return vfs.Info{}, &fs.PathError{Op: "lstat", Path: p, Err: fs.ErrNotExist}
	}
	return n.info(), nil
}

func (d *memDir) Stat() (vfs.Info, error) {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.n.info(), nil
}

func (d *memDir) Sync() error  { return nil }
func (d *memDir) Close() error { return nil }

// info describes n; the caller holds the FS's lock.
func (n *memNode) info() vfs.Info {
	if n.dir {
		return vfs.Info{Mode: fs.ModeDir | 0o700, UID: os.Geteuid(), Nlink: n.nlink, Ino: n.ino}
	}
	return vfs.Info{Mode: 0o600, UID: os.Geteuid(), Nlink: n.nlink, Ino: n.ino, Size: int64(len(n.data))}
}

type memLock struct {
	m *memFS
	n *memNode
}

func (l *memLock) Stat() (vfs.Info, error) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return l.n.info(), nil
}

func (l *memLock) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	l.n.locked = false
	return nil
}

type memFile struct {
	m    *memFS
	n    *memNode
	path string
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	b := f.n.data
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if end := off + int64(len(p)); end > int64(len(f.n.data)) {
		f.n.data = append(f.n.data, make([]byte, end-int64(len(f.n.data)))...)
	}
	return copy(f.n.data[off:], p), nil
}

func (f *memFile) Truncate(size int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if size <= int64(len(f.n.data)) {
		f.n.data = f.n.data[:size]
	} else {
		f.n.data = append(f.n.data, make([]byte, size-int64(len(f.n.data)))...)
	}
	return nil
}

func (f *memFile) Stat() (vfs.Info, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	return f.n.info(), nil
}

func (f *memFile) Name() string { return f.path }
func (f *memFile) Sync() error  { return nil }
func (f *memFile) Close() error { return nil }
