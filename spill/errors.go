package spill

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by calls on a closed Store or Reader, or on a removed Log.
	ErrClosed = errors.New("spill: closed")
	// ErrCorrupt is matched (errors.Is) by every *CorruptError.
	ErrCorrupt = errors.New("spill: corrupt log")
	// ErrRecordTooLarge is returned by Append for a record longer than MaxRecordSize.
	// It does not poison the log.
	ErrRecordTooLarge = errors.New("spill: record too large")
	// ErrInvalidOffset is returned by Truncate for an offset outside [0, Size()].
	// It does not poison the log.
	ErrInvalidOffset = errors.New("spill: invalid truncate offset")
	// ErrLocked is returned by FS.Lock when another holder has the lock.
	ErrLocked = errors.New("spill: locked")
)

// Details carried in CorruptError.Err.
var (
	errChecksum   = errors.New("checksum mismatch")
	errLength     = errors.New("record length beyond end of log")
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

// ioError wraps a failed file operation on a log; it is what a log's sticky error holds.
func ioError(op, path string, err error) error {
	return fmt.Errorf("spill: %s %s: %w", op, path, err)
}
