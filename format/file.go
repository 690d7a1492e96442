package format

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/vfs"
)

// PositionSuffix is appended to a File's path to name its position file.
const PositionSuffix = ".pos"

// ErrPosition is wrapped by the errors of OpenFile for an output file and position file that do
// not belong together: a position file that cannot be read, an output shorter than the position
// it records, or an output that has data but no position file.
var ErrPosition = errors.New("format: output file and position file disagree")

// File is a durable, resumable output file. WriteTxn writes a transaction, fsyncs the file, and
// records in a small position file next to it (the path plus PositionSuffix) the file's length and
// the transaction's end LSN, replacing it atomically (vfs.WriteFile: write, fsync, rename, fsync
// the directory). When WriteTxn returns, the transaction is durable: acknowledge it then. When it
// fails, the position file holds the previous position or, if only making the rename durable
// failed, the new one; either agrees with the output, and the next OpenFile cuts the output back
// to it.
//
// OpenFile reads the position file and cuts the output back to the length it records. That
// removes a torn last line (the process died while writing) and a transaction written but not yet
// recorded, which the server sends again because it was not acknowledged; Resume is the end LSN
// to skip through (reorderbuffer.Config.SkipThrough). Resuming reads two small files, whatever
// the size of the output.
//
// The output and position files are opened by name in their directory, opened once: a symbolic
// link under either name is refused, never followed (the position file's temporary name is removed
// and created anew, exclusively), and an existing file that belongs to another user or has other
// hard links is refused, so that OpenFile is safe in a directory other users may write to.
// The files are created with Config.FileMode (0600 by default, less the umask), through
// Config.FS (the operating system's by default).
//
// A File is not safe for concurrent use, and only one process may write a given path.
type File struct {
	w      *Writer
	f      vfs.File
	fw     *io.OffsetWriter // writes f at the end of what bw flushed
	dir    vfs.Dir
	name   string // the output's name in dir
	mode   fs.FileMode
	bw     *bufio.Writer
	path   string
	off    int64        // length of the durable output
	resume decoding.LSN // end LSN of the last transaction in it
	failed error        // recording a position failed: where the output ends is uncertain
	closed bool
}

// OpenFile opens (creating it if needed) an output file written by File, in the format cfg
// names, and cuts it back to its last durable transaction. cfg.StageBytes and cfg.TempDir are
// not used: a File writes transactions in place and cuts a failed one off again.
func OpenFile(path string, cfg Config) (*File, error) {
	if _, err := ParseKind(string(cfg.Kind)); err != nil {
		return nil, err
	}
	mode := cfg.FileMode.Perm()
	if mode == 0 {
		mode = DefaultFileMode
	}
	fsys := cfg.FS
	if fsys == nil {
		fsys = vfs.OS()
	}
	dir, err := fsys.OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	out := &File{dir: dir, name: filepath.Base(path), mode: mode, path: path}
	if err := out.recover(); err != nil {
		out.Close()
		return nil, err
	}
	out.fw = io.NewOffsetWriter(out.f, 0)
	out.fw.Seek(out.off, io.SeekStart) // cannot fail: off is not negative
	out.bw = bufio.NewWriterSize(out.fw, flushAt)
	out.w = newWriter(&fileSink{out}, cfg)
	return out, nil
}

// recover reads the position file, opens the output and cuts it back to the position.
func (o *File) recover() error {
	off, lsn, err := o.readPosition()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	noPosition := err != nil
	if o.f, err = vfs.OpenPrivate(o.dir, o.name, os.O_RDWR|os.O_CREATE, o.mode); err != nil {
		return err
	}
	st, err := o.f.Stat()
	if err != nil {
		return err
	}
	switch {
	case noPosition && st.Size == 0:
		// A new output: record its empty state first, so that data without a position file
		// always means someone else's file.
		if err := o.writePosition(0, 0); err != nil {
			return err
		}
	case noPosition:
		return fmt.Errorf("%w: %s has %d bytes but no %s: it was not written by this program (or its position was lost); "+
			"move it away or remove it", ErrPosition, o.path, st.Size, o.name+PositionSuffix)
	case st.Size < off:
		return fmt.Errorf("%w: %s has %d bytes, its position file records %d", ErrPosition, o.path, st.Size, off)
	}
	if st.Size > off {
		if err := o.f.Truncate(off); err != nil {
			return err
		}
		if err := o.f.Sync(); err != nil {
			return err
		}
	}
	o.off, o.resume = off, lsn
	return nil
}

// The position file: a versioned header and two fields, one per line.
const positionHeader = "pgreorder output position v1"

// maxPosition bounds what is read of a position file.
const maxPosition = 4 << 10

// readPosition reads the position file; its error wraps fs.ErrNotExist when there is none.
func (o *File) readPosition() (int64, decoding.LSN, error) {
	path := o.path + PositionSuffix
	b, err := vfs.ReadFile(o.dir, o.name+PositionSuffix, maxPosition)
	if err != nil {
		return 0, 0, err
	}
	bad := func(why string) (int64, decoding.LSN, error) {
		return 0, 0, fmt.Errorf("%w: %s: %s", ErrPosition, path, why)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) != 4 || lines[0] != positionHeader || lines[3] != "" {
		return bad("not a position file")
	}
	offText, ok1 := strings.CutPrefix(lines[1], "offset ")
	lsnText, ok2 := strings.CutPrefix(lines[2], "end_lsn ")
	off, err := strconv.ParseInt(offText, 10, 64)
	if !ok1 || !ok2 || err != nil || off < 0 {
		return bad("malformed")
	}
	lsn, err := decoding.ParseLSN(lsnText)
	if err != nil {
		return bad("malformed end_lsn")
	}
	return off, lsn, nil
}

// writePosition replaces the position file atomically and durably (vfs.WriteFile: a temporary
// file, created exclusively after whatever had its name before is removed, a link itself; synced,
// renamed over the position file, and the directory synced).
func (o *File) writePosition(off int64, lsn decoding.LSN) error {
	b := fmt.Appendf(nil, "%s\noffset %d\nend_lsn %s\n", positionHeader, off, lsn)
	return vfs.WriteFile(o.dir, o.name+PositionSuffix, b, o.mode)
}

// Resume returns the end LSN of the last transaction in the file (0 for a new file): pass it as
// reorderbuffer.Config.SkipThrough (replication.Config.Buffer.SkipThrough).
func (o *File) Resume() decoding.LSN { return o.resume }

// Offset returns the length of the durable output.
func (o *File) Offset() int64 { return o.off }

// Changes returns the number of changes written since OpenFile.
func (o *File) Changes() int64 { return o.w.Changes() }

// WriteTxn writes x, whole or not at all, and makes it durable: when it returns nil, x may be
// acknowledged. After an error the file holds what it held before the call.
func (o *File) WriteTxn(x *reorderbuffer.Txn) error {
	if o.closed {
		return ErrClosed
	}
	if o.failed != nil {
		return fmt.Errorf("format: %s: refusing to write after an earlier error: %w", o.path, o.failed)
	}
	return o.w.WriteTxn(x)
}

// Close closes the file. It is safe to call twice.
func (o *File) Close() error {
	if o.closed {
		return nil
	}
	o.closed = true
	var ferr error
	if o.f != nil {
		ferr = o.f.Close()
	}
	return errors.Join(ferr, o.dir.Close())
}

// fileSink writes a transaction in place and cuts it off again if it fails.
type fileSink struct{ o *File }

func (s *fileSink) Write(p []byte) (int, error) { return s.o.bw.Write(p) }

func (s *fileSink) commit(x *reorderbuffer.Txn) error {
	o := s.o
	err := o.bw.Flush()
	if err == nil {
		err = o.f.Sync()
	}
	var end int64
	if err == nil {
		end, err = o.fw.Seek(0, io.SeekCurrent)
	}
	if err != nil {
		return errors.Join(err, s.abort())
	}
	if err := o.writePosition(end, x.EndLSN); err != nil {
		// The transaction is in the file; the position file holds its old or its new content.
		// Either is consistent with the file, but this File no longer knows which: stop here,
		// and let OpenFile sort it out.
		o.failed = err
		return err
	}
	o.off, o.resume = end, x.EndLSN
	return nil
}

func (s *fileSink) abort() error {
	o := s.o
	o.bw.Reset(o.fw)
	if err := o.f.Truncate(o.off); err != nil {
		return err
	}
	_, err := o.fw.Seek(o.off, io.SeekStart)
	return err
}

func (s *fileSink) close() error { return nil }
