package spill

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/pgreorder/pgreorder/internal/ilist"
	"github.com/pgreorder/pgreorder/vfs"
)

// The file format (see the package documentation). Spill files never outlive the process that
// writes them, so the format is not part of the API and changes need no migration; the magic and
// version only make a file that is not what the store wrote fail loudly.
const (
	magic                = "PGRS" // opens every log file
	formatVersion uint32 = 3      // follows magic, little-endian
	headerSize           = 8      // magic + formatVersion
)

// MaxRecordSize is the largest record Append accepts: 1 GiB - 1 bytes, PostgreSQL's MaxAllocSize,
// which no pgoutput message exceeds.
const MaxRecordSize = 1<<30 - 1

// Defaults for zero Options fields.
const (
	// DefaultMaxOpenFiles is the most log files a store keeps open when Options.MaxOpenFiles is 0.
	// The default budget is a quarter of the soft RLIMIT_NOFILE when Open runs (the rest is left to
	// the process), but not more than DefaultMaxOpenFiles and not less than MinDefaultOpenFiles.
	DefaultMaxOpenFiles = 256
	// MinDefaultOpenFiles is the least default budget, however low RLIMIT_NOFILE is.
	MinDefaultOpenFiles = 4
	DefaultBufferSize   = 256 << 10
)

const (
	storePrefix = "pgreorder-spill-"
	lockName    = "lock"
	newLockName = "lock.new" // the lock file until it is locked
	logPrefix   = "log-"
	logSuffix   = ".spill"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// Dir is where the store makes its private directory; "" means os.TempDir(). It is created
	// (mode 0700) if missing. Symbolic links in Dir are followed; nothing below it is. Dir may be
	// shared with other users (see the package documentation).
	Dir string
	// FS is the file system; nil means vfs.OS(). (A test's may inject faults: package
	// vfs/faultfs.)
	FS vfs.FS
	// MaxOpenFiles bounds the log files kept open at once; 0 means a default derived from
	// RLIMIT_NOFILE (see DefaultMaxOpenFiles). Whatever the budget, a store that runs out of
	// descriptors (EMFILE, ENFILE) closes its least recently used files and tries again; it fails
	// only when it has none left to close.
	MaxOpenFiles int
	// BufferSize is the size of the shared write buffer and of each Reader's read buffer;
	// 0 means DefaultBufferSize. Values below 64 are raised to 64.
	BufferSize int
	// Sync makes every flush of a log fsync it. Off by default: spill files do not outlive the
	// process, so durability is useless.
	Sync bool
	// Compressor, if set, compresses what the store writes, one block of records at a time (each
	// flush of the write buffer is a block; see "Compression" in the package documentation).
	// nil writes records as they are.
	Compressor Compressor
}

// Store is a set of logs in a private directory. It is not safe for concurrent use.
type Store struct {
	fs      vfs.FS
	parent  vfs.Dir      // Options.Dir
	dir     vfs.Dir      // the store's private directory, in parent
	name    string       // dir's name in parent
	path    string       // dir's path, for messages
	id      vfs.Info     // dir as made, to recognise it by name at Close
	lock    vfs.LockFile // on dir/lock; nil where the platform has no locks
	maxOpen int
	bufSize int
	sync    bool
	codec   Compressor // nil: blocks stored as they are
	front   int        // bytes kept in front of wbuf in wmem: file header and block header
	cmem    []byte     // with a codec: a flush's block, compressed, after front bytes
	written int64      // bytes written to log files

	seq  uint64
	logs ilist.List[Log] // live (not removed) logs

	// The logs with an open file, the most recently used first.
	lru   ilist.List[Log]
	nOpen int

	wbuf  []byte // shared write buffer; holds bytes of owner only
	wmem  []byte // wbuf's memory: front bytes in front of wbuf for the headers
	owner *Log

	spare  []byte // a read buffer returned by a closed Reader, for the next one
	cspare []byte // with a codec: a buffer for a block's stored bytes, likewise

	closed bool
}

// Open creates a store in opts.Dir and removes stale stores that earlier processes of the same
// user left there. Cleanup is best effort: what cannot be removed is left alone and does not fail
// Open.
func Open(opts Options) (*Store, error) {
	s := &Store{
		fs:      opts.FS,
		maxOpen: opts.MaxOpenFiles,
		bufSize: opts.BufferSize,
		sync:    opts.Sync,
		codec:   opts.Compressor,
		front:   headerSize + blockHeaderSize,
		logs:    ilist.New(liveLinks),
		lru:     ilist.New(lruLinks),
	}
	if s.fs == nil {
		s.fs = vfs.OS()
	}
	if s.maxOpen <= 0 {
		s.maxOpen = defaultMaxOpenFiles()
	}
	if s.bufSize <= 0 {
		s.bufSize = DefaultBufferSize
	}
	s.bufSize = max(s.bufSize, 64)
	path := opts.Dir
	if path == "" {
		path = os.TempDir()
	}
	if err := s.fs.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("spill: open: %w", err)
	}
	parent, err := s.fs.OpenDir(path)
	if err != nil {
		return nil, fmt.Errorf("spill: open: %w", err)
	}
	for attempt := 1; ; attempt++ {
		err := s.create(parent, path)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 { // ErrExist: a name collision, practically impossible
			parent.Close()
			return nil, fmt.Errorf("spill: open: %w", err)
		}
	}
	s.parent = parent
	removeStale(parent, s.name)
	return s, nil
}

// create makes the store's directory under a new name in parent, checks that the directory it
// opens is the one it made, and takes the lock in it. The lock file is made and locked under
// another name and then renamed into place: a cleanup, which opens only lockName, never finds the
// lock of a live store unlocked.
func (s *Store) create(parent vfs.Dir, path string) error {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	name := storePrefix + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:])
	if err := parent.Mkdir(name, 0o700); err != nil {
		return err
	}
	dir, err := parent.OpenDir(name)
	if err != nil {
		parent.RemoveDir(name) // only ever an empty directory
		return err
	}
	info, err := dir.Stat()
	if err == nil && !private(info) {
		err = fmt.Errorf("%s is not the directory just made: %v, owner %d", filepath.Join(path, name), info.Mode, info.UID)
	}
	if err != nil {
		dir.Close() // not known to be ours: left alone
		return err
	}
	lock, err := dir.Lock(newLockName, true)
	if err == nil {
		if err = dir.Rename(newLockName, lockName); err != nil {
			lock.Close()
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, errors.ErrUnsupported):
		lock = nil // no store is ever taken for stale on such a platform
	default:
		dir.Remove(newLockName)
		dir.Close()
		parent.RemoveDir(name)
		return err
	}
	s.dir, s.name, s.path, s.id, s.lock = dir, name, filepath.Join(path, name), info, lock
	return nil
}

// private reports whether info describes a directory of this user's that nobody else may enter,
// as the store's own directory must be.
func private(info vfs.Info) bool {
	if info.UID < 0 {
		return info.Mode.IsDir() // the platform has no owners
	}
	return info.Mode.IsDir() && info.UID == os.Geteuid() && info.Mode.Perm()&0o077 == 0
}

// Dir returns the path of the store's private directory.
func (s *Store) Dir() string { return s.path }

// isStoreName reports whether name is pgreorder-spill-<pid>-<16 hex digits>.
func isStoreName(name string) bool {
	rest, ok := strings.CutPrefix(name, storePrefix)
	if !ok {
		return false
	}
	pid, rnd, ok := strings.Cut(rest, "-")
	if !ok || !isDigits(pid) || len(rnd) != 16 {
		return false
	}
	_, err := hex.DecodeString(rnd)
	return err == nil && strings.ToLower(rnd) == rnd
}

// isLogName reports whether name is log-<decimal>.spill.
func isLogName(name string) bool {
	rest, ok := strings.CutPrefix(name, logPrefix)
	if !ok {
		return false
	}
	num, ok := strings.CutSuffix(rest, logSuffix)
	return ok && isDigits(num)
}

func isDigits(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// removeStale removes the stale stores in parent other than own. A stale store is a directory
// with a store's name that belongs to this user, is not writable by group or others, and whose
// lock nobody holds; from it only logs and the lock file are removed, and then the directory if
// that left it empty. Nothing is followed: a symbolic link, a FIFO, a file, or another user's
// directory with a store's name is left alone.
func removeStale(parent vfs.Dir, own string) {
	names, err := parent.ReadDir()
	if err != nil {
		return
	}
	euid := os.Geteuid()
	for _, name := range names {
		if name != own && isStoreName(name) {
			removeIfStale(parent, name, euid)
		}
	}
}

func removeIfStale(parent vfs.Dir, name string, euid int) {
	dir, err := parent.OpenDir(name) // fails unless a directory, and for other users' private ones
	if err != nil {
		return
	}
	defer dir.Close()
	if info, err := dir.Stat(); err != nil || !ownedBy(info, euid) || !info.Mode.IsDir() || info.Mode.Perm()&0o022 != 0 {
		return
	}
	// No lock file means a store that is being made right now (its lock file appears only once
	// locked) or one that died while being made, leaving at most an unlocked newLockName: left
	// alone, as it has no logs.
	lock, err := dir.Lock(lockName, false)
	if err != nil {
		return // no lock file, held by a live store, not a regular file, or no locks here
	}
	defer lock.Close()
	if li, err := lock.Stat(); err != nil || !li.Mode.IsRegular() || !ownedBy(li, euid) || li.Nlink == 0 {
		return // Nlink 0: another cleanup (or the store's Close) removed it before this lock
	}
	names, err := dir.ReadDir()
	if err != nil {
		return
	}
	for _, n := range names {
		if isLogName(n) {
			dir.Remove(n)
		}
	}
	dir.Remove(lockName)
	parent.RemoveDir(name) // fails, harmlessly, if foreign files remain
}

// ownedBy reports whether info's owner is the user euid.
func ownedBy(info vfs.Info, euid int) bool { return info.UID >= 0 && info.UID == euid }

// Create makes a new, empty log. No file is created until the log's first bytes are flushed.
func (s *Store) Create() (*Log, error) {
	if s.closed {
		return nil, ErrClosed
	}
	s.seq++
	l := &Log{s: s, seq: s.seq}
	s.logs.PushFront(l)
	return l, nil
}

func liveLinks(l *Log) *ilist.Links[Log] { return &l.live }
func lruLinks(l *Log) *ilist.Links[Log]  { return &l.lru }

// Close removes every file the store made: its logs, its lock file and its directory. Logs and
// Readers return ErrClosed afterwards. Close is safe to call twice; the second call returns nil.
func (s *Store) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	for l := s.logs.Front(); l != nil; l = s.logs.Next(l) {
		if err := l.release(); err != nil {
			errs = append(errs, err)
		}
	}
	s.logs = ilist.New(liveLinks)
	s.wbuf, s.wmem, s.owner, s.spare, s.cmem, s.cspare = nil, nil, nil, nil, nil, nil
	if err := s.dir.Remove(lockName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := s.dir.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.removeDir(); err != nil {
		errs = append(errs, err)
	}
	if s.lock != nil {
		if err := s.lock.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.parent.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("spill: close: %w", err)
	}
	return nil
}

// removeDir removes the store's directory from its parent, if the name still is that directory:
// in a parent where others may rename entries, it could now be something of theirs.
func (s *Store) removeDir() error {
	d, err := s.parent.OpenDir(s.name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	info, err := d.Stat()
	d.Close()
	if err != nil {
		return err
	}
	if info.Dev != s.id.Dev || info.Ino != s.id.Ino {
		return fmt.Errorf("%s is no longer the store's directory; left in place", s.path)
	}
	if err := s.parent.RemoveDir(s.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// file returns l's open file, opening (and on first use creating) it, closing the least recently
// used file if the budget is spent or the process is out of descriptors, and marks l most recently
// used. The caller checks l.err first.
// An error opening l's file is made sticky on l; an error closing another log's file sticks to that
// log and is returned as a *LogError, leaving l as it was.
func (s *Store) file(l *Log) (vfs.File, error) {
	if l.f != nil {
		if l.lent { // out of the LRU while a reader of OpenReader holds it
			return l.f, nil
		}
		if s.lru.Front() != l {
			s.lru.Remove(l)
			s.lru.PushFront(l)
		}
		return l.f, nil
	}
	for s.nOpen >= s.maxOpen && s.lru.Back() != nil {
		victim := s.lru.Back()
		if err := victim.closeFile(); err != nil {
			return nil, otherLogError(victim, err)
		}
	}
	op, flag := "open", os.O_RDWR
	if !l.created {
		op, flag = "create", os.O_RDWR|os.O_CREATE|os.O_EXCL
	}
	f, err := s.dir.OpenFile(l.name(), flag, 0o600)
	for err != nil && tooManyFiles(err) && s.lru.Back() != nil {
		// The process is out of descriptors: give one of ours back and try again.
		victim := s.lru.Back()
		if err := victim.closeFile(); err != nil {
			return nil, otherLogError(victim, err)
		}
		f, err = s.dir.OpenFile(l.name(), flag, 0o600)
	}
	if err != nil {
		return nil, l.fail(op, err)
	}
	l.created = true // the header is written with the first bytes
	l.f = f
	s.nOpen++
	s.lru.PushFront(l)
	return f, nil
}

// putHeader writes the file header into b.
func (s *Store) putHeader(b []byte) {
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[4:headerSize], s.version())
}

// version is the format version of the store's files.
func (s *Store) version() uint32 { return formatVersion }

// WrittenBytes returns the bytes written to the store's files so far: file and block headers
// included, after compression with Options.Compressor, and counting again what a Truncate rewrote.
func (s *Store) WrittenBytes() int64 { return s.written }

// writeFull writes p at off, turning a short write without error into io.ErrShortWrite, and
// counts what it wrote.
func (s *Store) writeFull(f vfs.File, p []byte, off int64) error {
	n, err := f.WriteAt(p, off)
	s.written += int64(max(n, 0))
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return err
}

// DefaultOpenFiles returns the descriptor budget a store takes for Options.MaxOpenFiles 0 (see
// DefaultMaxOpenFiles), for a program with several stores to share it among them.
func DefaultOpenFiles() int { return defaultMaxOpenFiles() }

// defaultMaxOpenFiles is the descriptor budget for Options.MaxOpenFiles 0.
func defaultMaxOpenFiles() int {
	n := DefaultMaxOpenFiles
	if soft, ok := fileLimit(); ok {
		n = int(min(soft/4, DefaultMaxOpenFiles))
	}
	return max(n, MinDefaultOpenFiles)
}

// tooManyFiles reports whether err says that the process or the system has no descriptor left.
func tooManyFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
