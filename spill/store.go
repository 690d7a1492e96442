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
)

// The file format (see the package documentation). Spill files never outlive the process that
// writes them, so the format is not part of the API and changes need no migration; the magic and
// version only make a file that is not what the store wrote fail loudly.
const (
	magic                  = "PGRS" // opens every log file
	formatVersion   uint32 = 1      // follows magic, little-endian
	headerSize             = 8      // magic + formatVersion
	frameHeaderSize        = 8      // a record's CRC-32C + length prefix
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
	lockSuffix  = ".lock"
	logPrefix   = "log-"
	logSuffix   = ".spill"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// Dir is where the store makes its private directory; "" means os.TempDir(). It is created if
	// missing.
	Dir string
	// FS is the file system; nil means OSFS().
	FS FS
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
}

// Store is a set of logs in a private directory. It is not safe for concurrent use.
type Store struct {
	fs       FS
	dir      string // the store's private directory
	lockPath string
	lock     io.Closer
	maxOpen  int
	bufSize  int
	sync     bool

	seq  uint64
	logs map[*Log]struct{} // live (not removed) logs

	// LRU of logs with an open file: head is the most recently used.
	head, tail *Log
	nOpen      int

	wbuf  []byte // shared write buffer; holds bytes of owner only
	wmem  []byte // wbuf's memory: headerSize bytes in front of wbuf for a file header
	owner *Log

	spare []byte // a read buffer returned by a closed Reader, for the next one

	closed bool
}

// Open creates a store in opts.Dir and removes stale stores that earlier processes left there.
// Cleanup is best effort: what cannot be removed is left alone and does not fail Open.
func Open(opts Options) (*Store, error) {
	s := &Store{
		fs:      opts.FS,
		maxOpen: opts.MaxOpenFiles,
		bufSize: opts.BufferSize,
		sync:    opts.Sync,
		logs:    make(map[*Log]struct{}),
	}
	if s.fs == nil {
		s.fs = OSFS()
	}
	if s.maxOpen <= 0 {
		s.maxOpen = defaultMaxOpenFiles()
	}
	if s.bufSize <= 0 {
		s.bufSize = DefaultBufferSize
	}
	s.bufSize = max(s.bufSize, 64)
	dir := opts.Dir
	if dir == "" {
		dir = os.TempDir()
	}
	if err := s.fs.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spill: open: %w", err)
	}
	var name string
	for attempt := 0; ; attempt++ {
		var rnd [8]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, fmt.Errorf("spill: open: %w", err)
		}
		name = storePrefix + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:])
		lock, err := s.fs.Lock(filepath.Join(dir, name+lockSuffix))
		if errors.Is(err, ErrLocked) && attempt < 3 {
			continue // a name collision; practically impossible
		}
		if err != nil {
			return nil, fmt.Errorf("spill: open: %w", err)
		}
		s.lock = lock
		break
	}
	s.lockPath = filepath.Join(dir, name+lockSuffix)
	s.dir = filepath.Join(dir, name)
	if err := s.fs.MkdirAll(s.dir, 0o700); err != nil {
		s.fs.Remove(s.lockPath)
		s.lock.Close()
		return nil, fmt.Errorf("spill: open: %w", err)
	}
	removeStale(s.fs, dir, name)
	return s, nil
}

// Dir returns the store's private directory.
func (s *Store) Dir() string { return s.dir }

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

// removeStale removes the stores in dir whose lock nobody holds, except own. Only files named by
// this package are removed; a store directory that also holds foreign files is left in place.
func removeStale(fsys FS, dir, own string) {
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		return
	}
	seen := make(map[string]bool)
	for _, e := range entries {
		base := e.Name()
		if b, ok := strings.CutSuffix(base, lockSuffix); ok {
			if e.IsDir() {
				continue
			}
			base = b
		} else if !e.IsDir() {
			continue
		}
		if base == own || seen[base] || !isStoreName(base) {
			continue
		}
		seen[base] = true
		lockPath := filepath.Join(dir, base+lockSuffix)
		lock, err := fsys.Lock(lockPath)
		if err != nil {
			continue // held by a live store, or not ours to take
		}
		sub := filepath.Join(dir, base)
		if files, err := fsys.ReadDir(sub); err == nil {
			for _, f := range files {
				if !f.IsDir() && isLogName(f.Name()) {
					fsys.Remove(filepath.Join(sub, f.Name()))
				}
			}
			fsys.Remove(sub) // fails, harmlessly, if foreign files remain
		}
		fsys.Remove(lockPath)
		lock.Close()
	}
}

// Create makes a new, empty log. No file is created until the log's first bytes are flushed.
func (s *Store) Create() (*Log, error) {
	if s.closed {
		return nil, ErrClosed
	}
	s.seq++
	l := &Log{s: s, path: filepath.Join(s.dir, logPrefix+strconv.FormatUint(s.seq, 10)+logSuffix)}
	s.logs[l] = struct{}{}
	return l, nil
}

// Close removes every file the store made: its logs, its directory and its lock file. Logs and
// Readers return ErrClosed afterwards. Close is safe to call twice; the second call returns nil.
func (s *Store) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	for l := range s.logs {
		if err := l.release(); err != nil {
			errs = append(errs, err)
		}
	}
	s.logs = nil
	s.wbuf, s.wmem, s.owner, s.spare = nil, nil, nil, nil
	if err := s.fs.Remove(s.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := s.fs.Remove(s.lockPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := s.lock.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("spill: close: %w", err)
	}
	return nil
}

// file returns l's open file, opening (and on first use creating) it, closing the least recently
// used file if the budget is spent or the process is out of descriptors, and marks l most recently
// used. The caller checks l.err first.
// An error opening l's file is made sticky on l; an error closing another log's file sticks to that
// log and is returned as a *LogError, leaving l as it was.
func (s *Store) file(l *Log) (File, error) {
	if l.f != nil {
		if s.head != l {
			s.unlink(l)
			s.pushFront(l)
		}
		return l.f, nil
	}
	for s.nOpen >= s.maxOpen && s.tail != nil {
		victim := s.tail
		if err := victim.closeFile(); err != nil {
			return nil, otherLogError(victim, err)
		}
	}
	op, flag := "open", os.O_RDWR
	if !l.created {
		op, flag = "create", os.O_RDWR|os.O_CREATE|os.O_EXCL
	}
	f, err := s.fs.OpenFile(l.path, flag, 0o600)
	for err != nil && tooManyFiles(err) && s.tail != nil {
		// The process is out of descriptors: give one of ours back and try again.
		victim := s.tail
		if err := victim.closeFile(); err != nil {
			return nil, otherLogError(victim, err)
		}
		f, err = s.fs.OpenFile(l.path, flag, 0o600)
	}
	if err != nil {
		return nil, l.fail(op, err)
	}
	l.created = true // the header is written with the first bytes
	l.f = f
	s.nOpen++
	s.pushFront(l)
	return f, nil
}

func (s *Store) pushFront(l *Log) {
	l.prev, l.next = nil, s.head
	if s.head != nil {
		s.head.prev = l
	} else {
		s.tail = l
	}
	s.head = l
}

func (s *Store) unlink(l *Log) {
	if l.prev != nil {
		l.prev.next = l.next
	} else {
		s.head = l.next
	}
	if l.next != nil {
		l.next.prev = l.prev
	} else {
		s.tail = l.prev
	}
	l.prev, l.next = nil, nil
}

// putHeader writes the file header into b.
func putHeader(b []byte) {
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[4:headerSize], formatVersion)
}

// writeFull writes p at off, turning a short write without error into io.ErrShortWrite.
func writeFull(f File, p []byte, off int64) error {
	n, err := f.WriteAt(p, off)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return err
}

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
