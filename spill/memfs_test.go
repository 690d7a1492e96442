package spill

import (
	"io"
	"io/fs"
	"os"
	"sync"
)

// memFS is an in-memory FS for tests that must not touch the disk (fuzzing).
type memFS struct {
	mu    sync.Mutex
	files map[string]*[]byte
}

func newMemFS() *memFS { return &memFS{files: make(map[string]*[]byte)} }

func (m *memFS) OpenFile(name string, flag int, _ fs.FileMode) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[name]
	switch {
	case ok && flag&os.O_EXCL != 0:
		return nil, &os.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case !ok && flag&os.O_CREATE == 0:
		return nil, &os.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case !ok:
		b = new([]byte)
		m.files[name] = b
	}
	return &memFile{m: m, b: b}, nil
}

func (m *memFS) MkdirAll(string, fs.FileMode) error { return nil }
func (m *memFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.files, name)
	return nil
}
func (m *memFS) ReadDir(string) ([]fs.DirEntry, error) { return nil, nil }
func (m *memFS) Lock(string) (io.Closer, error)        { return io.NopCloser(nil), nil }

type memFile struct {
	m *memFS
	b *[]byte
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if off >= int64(len(*f.b)) {
		return 0, io.EOF
	}
	n := copy(p, (*f.b)[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if end := off + int64(len(p)); end > int64(len(*f.b)) {
		*f.b = append(*f.b, make([]byte, end-int64(len(*f.b)))...)
	}
	return copy((*f.b)[off:], p), nil
}

func (f *memFile) Truncate(size int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if size <= int64(len(*f.b)) {
		*f.b = (*f.b)[:size]
	} else {
		*f.b = append(*f.b, make([]byte, size-int64(len(*f.b)))...)
	}
	return nil
}

func (f *memFile) Sync() error  { return nil }
func (f *memFile) Close() error { return nil }
