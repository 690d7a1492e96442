// Package vfs is the one file system interface of pgreorder: everything that writes files (spill
// logs, changefeed's JSON-lines output and its position files) works
// through an [FS], so that a test can put a fault-injecting one ([github.com/pgreorder/pgreorder/vfs/faultfs])
// in the place of [OS]. It depends on the standard library only.
//
// # Contract
//
//   - An [FS] names directories by path: [FS.OpenDir] opens one, following symbolic links in the
//     path, which is the caller's choice (a flag, a configuration), not a name found in a shared
//     directory. [FS.MkdirAll] creates one.
//   - Below that, everything is reached through an open [Dir] by single path elements
//     ([ValidName]: not empty, not "." or "..", no separator, no NUL), resolved in that directory
//     alone and never through a symbolic link: a method that opens a name fails, wrapping
//     [ErrSymlink], if it is a symbolic link, and one that removes or renames over a name removes
//     or replaces the link itself. [Dir.OpenFile] opens regular files only ([ErrNotRegular]
//     otherwise; a FIFO planted under the name is never waited on), and Files are positional
//     (ReadAt, WriteAt), so a file closed and opened again needs no seek.
//   - Files in directories that other users may write to (a shared /tmp): [OpenPrivate] and
//     [ReadFile] refuse, wrapping [ErrNotPrivate], a file that belongs to another user or has other
//     names (hard links) another user could read it through, and [WriteFile] creates what it
//     writes exclusively, with the mode it is given (0600 for what pgreorder writes unless
//     configured otherwise).
//   - [WriteFile] is the one way a small file is replaced atomically and durably: it writes a
//     temporary file next to it (the name plus [TempSuffix]), fsyncs it, renames it over the name
//     and fsyncs the directory. A reader ([ReadFile]) sees the old content or the new one, never a
//     mix, whatever fails or crashes in between; when WriteFile returns nil the new content
//     survives a crash, and when it returns an error the caller must take either to be there.
//   - Errors name the path the operating system reported them for ([*fs.PathError], or
//     [*os.LinkError] for a rename), and wrap what it reported (errors.Is(err, syscall.ENOSPC)).
//
// [OS] works, on Linux, with openat(2) and its relatives on directory descriptors. Elsewhere (and
// on Linux when built with the tag vfs_osroot, so that its tests run there too) it uses os.Root,
// which keeps every name inside its directory but follows a symbolic link that stays inside it:
// each method first refuses a name that is a link, a check a co-tenant could race only towards
// another entry of the same directory, which the ownership checks still refuse unless it is the
// user's own.
package vfs

import (
	"errors"
	"io"
	"io/fs"
	"os"
)

// FS is a file system: the operating system's ([OS]), or one that wraps it (a fault injector).
type FS interface {
	// OpenDir opens the existing directory at path. Symbolic links in path are followed: path is
	// the caller's choice, not a name found in a shared directory.
	OpenDir(path string) (Dir, error)
	// MkdirAll creates the directory at path with mode perm (less the umask), and any missing
	// parents, like os.MkdirAll; it does nothing if the directory exists.
	MkdirAll(path string, perm fs.FileMode) error
}

// Dir is an open directory. Every name given to its methods is a single path element (see
// [ValidName]), resolved in this directory alone, and never through a symbolic link: a method
// that opens name fails, wrapping [ErrSymlink], if it is a symbolic link, and one that removes or
// renames over name removes or replaces the link itself. A Dir may be used from several
// goroutines at once, except for Close.
type Dir interface {
	// OpenFile opens the regular file name like os.OpenFile (flag: os.O_RDONLY, os.O_WRONLY or
	// os.O_RDWR, with os.O_CREATE, os.O_EXCL, os.O_TRUNC; perm applies to a file it creates, less
	// the umask). It fails, wrapping ErrNotRegular, if name is not a regular file; opening a FIFO
	// does not wait for a writer.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Lock opens the file name, creating it exclusively (with mode 0600) if create is set, and
	// takes an exclusive, non-blocking lock on it that other processes' Lock calls see, as
	// flock(2) does. The lock is held until the LockFile is closed. Lock returns an error
	// matching ErrLocked if somebody else holds the lock, and one matching errors.ErrUnsupported
	// if the platform has no such lock.
	Lock(name string, create bool) (LockFile, error)
	// Mkdir creates the directory name.
	Mkdir(name string, perm fs.FileMode) error
	// OpenDir opens the directory name; it fails if name is anything else.
	OpenDir(name string) (Dir, error)
	// Remove removes name, which is not a directory (a symbolic link is removed itself).
	Remove(name string) error
	// RemoveDir removes name, which is an empty directory.
	RemoveDir(name string) error
	// Rename renames oldname to newname, both in this directory, replacing whatever newname is
	// (a file, or a symbolic link itself) but a directory.
	Rename(oldname, newname string) error
	// ReadDir returns the names in the directory, in no particular order.
	ReadDir() ([]string, error)
	// Lstat describes name itself: a symbolic link is described, not followed.
	Lstat(name string) (Info, error)
	// Stat describes the open directory itself (not whatever its path names now).
	Stat() (Info, error)
	// Sync flushes the directory's entries to stable storage, so that a file created, renamed or
	// removed in it stays so after a crash.
	Sync() error
	// Close releases the directory.
	Close() error
}

// File is an open regular file. Reads and writes are positional: there is no file offset.
type File interface {
	io.ReaderAt
	io.WriterAt
	// Truncate changes the file's size.
	Truncate(size int64) error
	// Sync flushes the file's content to stable storage.
	Sync() error
	// Stat describes the open file (not whatever its name names now).
	Stat() (Info, error)
	// Name returns the file's path, for messages.
	Name() string
	// Close closes the file; a second Close returns an error matching os.ErrClosed.
	Close() error
}

// LockFile is a locked file; closing it releases the lock.
type LockFile interface {
	// Stat describes the open file (not whatever its name names now).
	Stat() (Info, error)
	io.Closer
}

// Info describes an open file or directory, or a name (Dir.Lstat): what is checked before one
// that was not just created is trusted.
type Info struct {
	Mode  fs.FileMode // type and permission bits, as fs.FileInfo reports them
	UID   int         // the owner's user id; -1 where the platform has none
	Nlink uint64      // the number of names of the file: 0 once it has been removed
	Dev   uint64      // Dev and Ino identify the file: equal for the same file
	Ino   uint64
	Size  int64 // in bytes, for a regular file
}

var (
	// ErrLocked is matched by the error of Dir.Lock when another holder has the lock.
	ErrLocked = errors.New("vfs: locked")
	// ErrSymlink is wrapped by the error of a Dir method that opens a name that is a symbolic
	// link, which is never followed.
	ErrSymlink = errors.New("is a symbolic link, which is never followed")
	// ErrNotRegular is wrapped by the error of Dir.OpenFile for a name that is not a regular file.
	ErrNotRegular = errors.New("is not a regular file")
	// ErrNotPrivate is wrapped by the errors of CheckPrivate, OpenPrivate and ReadFile for a file
	// that is not this user's own.
	ErrNotPrivate = errors.New("is not this user's own file")
)

// OS returns the file system of the operating system. On Linux it works with openat(2) and its
// relatives on directory descriptors; elsewhere it uses os.Root (see the package documentation).
func OS() FS { return osFS{} }

// ValidName reports whether name is a single path element: not empty, not "." or "..", without a
// path separator or a NUL byte. Dir methods refuse every other name (fs.ErrInvalid).
func ValidName(name string) bool {
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
