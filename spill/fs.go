package spill

import (
	"io"
	"io/fs"
	"os"
)

// FS is the file system a Store works through. OSFS is the real one; package faultfs wraps any FS
// to inject errors in tests.
//
// A Store reaches everything through directory handles: it opens [Options].Dir once and from then
// on names only single path elements, relative to an open [Dir], so a symbolic link or a renamed
// directory between the path and the file cannot redirect it.
type FS interface {
	// OpenDir opens the directory at path, creating it (mode 0700, with missing parents) if it does
	// not exist. Symbolic links in path are followed: path is the caller's choice, not a name found
	// in a shared directory.
	OpenDir(path string) (Dir, error)
}

// Dir is an open directory. Every name given to its methods is a single path element (no
// separator, not "." or ".."), resolved in this directory alone, and never through a symbolic
// link: a method that opens name fails if it is a symbolic link, and one that removes name removes
// the link itself.
type Dir interface {
	// OpenFile opens the regular file name like os.OpenFile (flag: os.O_RDWR, os.O_CREATE,
	// os.O_EXCL).
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Lock opens the file name, creating it exclusively (with mode 0600) if create is set, and
	// takes an exclusive, non-blocking lock on it that other processes' Lock calls see, as
	// flock(2) does. The lock is held until the LockFile is closed. Lock returns an error matching
	// ErrLocked if somebody else holds the lock, and one matching errors.ErrUnsupported if the
	// platform has no such lock.
	Lock(name string, create bool) (LockFile, error)
	// Mkdir creates the directory name.
	Mkdir(name string, perm fs.FileMode) error
	// OpenDir opens the directory name; it fails if name is anything else.
	OpenDir(name string) (Dir, error)
	// Remove removes name, which is not a directory.
	Remove(name string) error
	// RemoveDir removes name, which is an empty directory.
	RemoveDir(name string) error
	// Rename renames oldname to newname, both in this directory, replacing a file newname.
	Rename(oldname, newname string) error
	// ReadDir returns the names in the directory, in no particular order.
	ReadDir() ([]string, error)
	// Stat describes the open directory itself (not whatever its path names now).
	Stat() (Info, error)
	// Close releases the directory.
	Close() error
}

// LockFile is a locked file; closing it releases the lock.
type LockFile interface {
	// Stat describes the open file (not whatever its path names now).
	Stat() (Info, error)
	io.Closer
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

// Info describes an open file or directory: what a Store checks before it trusts one that it did
// not just create.
type Info struct {
	Mode  fs.FileMode // type and permission bits, as fs.FileInfo reports them
	UID   int         // the owner's user id; -1 where the platform has none
	Nlink uint64      // the number of names of the file: 0 once it has been removed
	Dev   uint64      // Dev and Ino identify the file: equal for the same file
	Ino   uint64
}

// OSFS returns the FS of the operating system. On Linux it works with openat(2) and its
// relatives on directory descriptors; elsewhere it uses os.Root, which may follow a symbolic link
// that stays inside the directory between a check and an open.
func OSFS() FS { return osFS{} }

// validName reports whether name is a single path element.
func validName(name string) bool {
	if name == "" || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] == 0 || os.IsPathSeparator(name[i]) {
			return false
		}
	}
	return true
}
