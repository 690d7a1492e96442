package spill

import (
	"io"
	"io/fs"
	"os"
)

// FS is the file system a Store works through. OSFS is the real one; package faultfs wraps any FS
// to inject errors in tests.
type FS interface {
	// OpenFile opens a file like os.OpenFile.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// MkdirAll creates a directory and its parents like os.MkdirAll.
	MkdirAll(name string, perm fs.FileMode) error
	// Remove removes a file or an empty directory like os.Remove.
	Remove(name string) error
	// ReadDir lists a directory like os.ReadDir.
	ReadDir(name string) ([]fs.DirEntry, error)
	// Lock takes an exclusive, non-blocking, process-independent lock on the file name, creating it
	// if needed, and returns the handle that releases it. It returns an error matching ErrLocked if
	// somebody else holds the lock. The lock must be on the file that name refers to when Lock
	// returns (a file removed and re-created concurrently must not be mistaken for a held lock).
	Lock(name string) (io.Closer, error)
}

// File is an open log file. Reads and writes are positional, so a file closed by the descriptor
// budget and opened again needs no seek.
type File interface {
	io.ReaderAt
	io.WriterAt
	Truncate(size int64) error
	Sync() error
	Close() error
}

// OSFS returns the FS of the operating system.
func OSFS() FS { return osFS{} }

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	return openFile(name, flag, perm)
}

func (osFS) MkdirAll(name string, perm fs.FileMode) error { return os.MkdirAll(name, perm) }
func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error)   { return os.ReadDir(name) }
func (osFS) Lock(name string) (io.Closer, error)          { return lockFile(name) }
