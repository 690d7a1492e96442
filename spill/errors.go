package spill

import (
	"errors"
	"fmt"

	"github.com/pgreorder/pgreorder/vfs"
)

var (
	// ErrClosed is returned by calls on a closed Store or Reader, or on a removed Log.
	ErrClosed = errors.New("spill: closed")
	// ErrCorrupt is matched (errors.Is) by every *CorruptError.
	ErrCorrupt = errors.New("spill: corrupt log")
	// ErrRecordTooLarge is returned by Append for a record longer than MaxRecordSize.
	// It does not poison the log.
	ErrRecordTooLarge = errors.New("spill: record too large")
	// ErrInvalidOffset is returned by Truncate for an offset outside [0, Size()], or inside a
	// record of a written block. It does not poison the log.
	ErrInvalidOffset = errors.New("spill: invalid truncate offset")
	// ErrInvalidRecords is returned by AppendFramed for bytes that are not a sequence of framed
	// records. It does not poison the log.
	ErrInvalidRecords = errors.New("spill: invalid framed records")
	// ErrLocked is vfs.ErrLocked, matched by the error of vfs.Dir.Lock when another holder has
	// the lock.
	//
	// Deprecated: use vfs.ErrLocked.
	ErrLocked = vfs.ErrLocked
)

// Details carried in CorruptError.Err.
var (
	errChecksum   = errors.New("checksum mismatch")
	errBadMagic   = errors.New("bad file magic")
	errBadVersion = errors.New("unsupported format version")
)

// CorruptError reports a torn or damaged log. Offset is the file offset of the bad record (or 0 for
// a bad file header); Err says what was wrong (io.ErrUnexpectedEOF for a file shorter than the log
// says it is).
type CorruptError struct {
	Log    string // path of the log file
	Offset int64  // file offset
	Err    error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("spill: corrupt log %s at offset %d: %v", e.Log, e.Offset, e.Err)
}

// Unwrap returns the detail error.
func (e *CorruptError) Unwrap() error { return e.Err }

// Is reports whether target is ErrCorrupt.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// LogError is an I/O error of one log returned by a call on another log that ran into it: an
// Append that wrote the records another log had in the shared write buffer, or any call that
// closed another log's file to free a descriptor. The error sticks to the log at Path (its Err
// and its later calls return Err); the log the call was made on is unharmed, and the call had no
// effect on it.
type LogError struct {
	Path string // the file of the log that failed
	Err  error  // that log's sticky error
}

func (e *LogError) Error() string { return "spill: other log " + e.Path + ": " + e.Err.Error() }

// Unwrap returns the failed log's error.
func (e *LogError) Unwrap() error { return e.Err }

// otherLogError returns err, an error of log o met by a call on another log, as a *LogError for o,
// unless it already is one (for a third log).
func otherLogError(o *Log, err error) error {
	if _, ok := err.(*LogError); ok {
		return err
	}
	return &LogError{Path: o.Path(), Err: err}
}

// ioError wraps a failed file operation on a log; it is what a log's sticky error holds.
func ioError(op, path string, err error) error {
	return fmt.Errorf("spill: %s %s: %w", op, path, err)
}
