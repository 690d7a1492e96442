package changefeed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/vfs"
)

// DefaultFileMode is the permissions a JSONLines output and its position file are created with
// when JSONLinesConfig.FileMode is 0: the user's alone (the output holds the source's data).
const DefaultFileMode fs.FileMode = 0o600

// PositionSuffix is appended to a JSONLines output's path to name its position file.
const PositionSuffix = ".pos"

// JSONLinesConfig describes a JSONLines output beyond its path. The zero value writes the txn
// format to a file of mode 0600 through the operating system's files.
type JSONLinesConfig struct {
	// Format is the output format and its options (Kind: format.KindTxn or format.KindDebezium;
	// the values' handling; StageBytes and TempDir, where a large transaction is staged).
	Format format.Config
	// FileMode is the permissions the output and its position file are created with, less the
	// umask; 0 means 0600.
	FileMode fs.FileMode
	// FS is the file system the output is written through; nil means the operating system's.
	FS vfs.FS
}

// JSONLines is a consumer's output in one JSON-lines file, exactly once: a Store and its Handler
// together. Handle writes each batch in the format of JSONLinesConfig.Format (format.Writer: a
// copied chunk with WriteRows, a streamed transaction with WriteTxn); each unit's Commit flushes
// the output, fsyncs it, and only then stores the position with the output's length in a
// FileStore next to it (the path plus PositionSuffix). A Resume batch cuts the output back to the
// length stored with the position, which removes whatever a crash left after it (a torn line, a
// transaction written but not stored, which the stream hands out again); a Reset cuts it to
// nothing (a copy starts over), and a TableReset to the length stored when the copy of a table
// added to the publications began (which removes that copy's rows). So the file holds every
// change exactly once, whatever crashes, and resuming reads two small files whatever the
// output's size.
//
//	out, err := changefeed.OpenJSONLines("changes.jsonl", changefeed.JSONLinesConfig{})
//	...
//	err = changefeed.Run(ctx, cfg, out, out.Handle)
//
// Chunks of the initial copy are written as their workers finish them, each chunk whole
// (staged first), in no particular order between tables; the copy counts once Run stored its end.
//
// An output with data but no position file was not written by JSONLines: OpenJSONLines refuses
// it rather than append to it. The position file of an earlier release's durable output (its
// length and end LSN) is read as a position of a stream without a copy, and replaced in the
// new form at the first commit.
//
// The files are opened by name in their directory: a symbolic link under either name is
// refused, never followed, and so is a file of another user or with other hard links, so that
// the output is safe in a directory others may write to. Only one process may write a path.
type JSONLines struct {
	pos    *FileStore
	dir    vfs.Dir
	name   string
	path   string
	format format.Config

	mu      sync.Mutex // everything below: the stream and the copy's workers write at once
	f       vfs.File
	fw      *io.OffsetWriter // writes f at the end of what bw flushed
	bw      *bufio.Writer
	end     int64 // the output's length, with what bw holds
	durable int64 // the length stored with the last position
	failed  error // storing a position failed: whether it is there is unknown
	writers map[int]*jsonWorker
	closed  bool
}

// jsonWorker is one worker's writer; appends are taken by its appender.
type jsonWorker struct {
	w *format.Writer
	a *jsonAppender
}

// OpenJSONLines opens (creating it if needed) the output file at path and its position file.
func OpenJSONLines(path string, cfg JSONLinesConfig) (*JSONLines, error) {
	if _, err := format.ParseKind(string(cfg.Format.Kind)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	mode := cfg.FileMode.Perm()
	if mode == 0 {
		mode = DefaultFileMode
	}
	fsys := cfg.FS
	if fsys == nil {
		fsys = vfs.OS()
	}
	pos, err := OpenFileStore(path+PositionSuffix, FileConfig{FS: fsys, FileMode: mode})
	if err != nil {
		return nil, err
	}
	dir, err := fsys.OpenDir(filepath.Dir(path))
	if err != nil {
		pos.Close()
		return nil, fmt.Errorf("changefeed: output %s: %w", path, err)
	}
	j := &JSONLines{pos: pos, dir: dir, name: filepath.Base(path), path: path, format: cfg.Format, writers: map[int]*jsonWorker{}}
	if j.f, err = vfs.OpenPrivate(dir, j.name, os.O_RDWR|os.O_CREATE, mode); err != nil {
		j.Close()
		return nil, fmt.Errorf("changefeed: output: %w", err)
	}
	st, err := j.f.Stat()
	if err != nil {
		j.Close()
		return nil, err
	}
	j.end, j.durable = st.Size, st.Size
	j.fw = io.NewOffsetWriter(j.f, 0)
	j.fw.Seek(j.end, io.SeekStart) // cannot fail: end is not negative
	j.bw = bufio.NewWriterSize(j.fw, 64<<10)
	return j, nil
}

// Load returns the stored position, after checking that the output agrees with it.
func (j *JSONLines) Load(ctx context.Context, slot string) (Position, bool, error) {
	p, ok, err := j.pos.Load(ctx, slot)
	if errors.Is(err, ErrStore) {
		if lp, lerr := j.legacyPosition(slot); lerr == nil {
			p, ok, err = lp, true, nil
		}
	}
	if err != nil {
		return Position{}, false, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return Position{}, false, ErrClosed
	}
	if !ok {
		if j.end > 0 {
			return Position{}, false, fmt.Errorf("%w: %s has %d bytes but no %s: it was not written by this program (or its position was lost); "+
				"move it away or remove it", ErrStore, j.path, j.end, j.name+PositionSuffix)
		}
		return Position{}, false, nil
	}
	n, err := outputLength(p.State)
	if err != nil {
		return Position{}, false, fmt.Errorf("%w: %s: %s", ErrStore, j.path+PositionSuffix, err)
	}
	if j.end < n {
		return Position{}, false, fmt.Errorf("%w: %s has %d bytes, its position file records %d: the output was cut or replaced; "+
			"remove both to start again", ErrStore, j.path, j.end, n)
	}
	return p, true, nil
}

// legacyHeader starts the position file of an earlier release's durable output.
const legacyHeader = "pgreorder output position v1"

// legacyPosition reads an earlier release's position file: its output's length and the end LSN
// of its last transaction, of a stream with no copy.
func (j *JSONLines) legacyPosition(slot string) (Position, error) {
	b, err := vfs.ReadFile(j.dir, j.name+PositionSuffix, 4<<10)
	if err != nil {
		return Position{}, err
	}
	var off int64
	var lsn decoding.LSN
	lines := strings.Split(string(b), "\n")
	if len(lines) != 4 || lines[0] != legacyHeader || lines[3] != "" {
		return Position{}, errors.New("not a position file")
	}
	offText, ok1 := strings.CutPrefix(lines[1], "offset ")
	lsnText, ok2 := strings.CutPrefix(lines[2], "end_lsn ")
	off, err = strconv.ParseInt(offText, 10, 64)
	if !ok1 || !ok2 || err != nil || off < 0 {
		return Position{}, errors.New("malformed")
	}
	if lsn, err = decoding.ParseLSN(lsnText); err != nil {
		return Position{}, errors.New("malformed")
	}
	return Position{Slot: slot, CopyDone: true, EndLSN: lsn, State: strconv.AppendInt(nil, off, 10)}, nil
}

// outputLength reads the output's length from a position's State.
func outputLength(state []byte) (int64, error) {
	n, err := strconv.ParseInt(string(state), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("the output's length %q is malformed", state)
	}
	return n, nil
}

// Begin starts a unit of work; the handler's writes since are undone by its Rollback.
func (j *JSONLines) Begin(ctx context.Context, worker int) (Unit, error) {
	u, err := j.pos.Begin(ctx, worker)
	if err != nil {
		return nil, err
	}
	return &jsonUnit{j: j, u: u}, nil
}

// Handle is the Handler that writes each batch to the output. It must be the handler of the Run
// that j is the store of.
func (j *JSONLines) Handle(ctx context.Context, b *Batch) error {
	if b == nil {
		return fmt.Errorf("%w: a nil Batch", ErrInvalidConfig)
	}
	switch b.Kind {
	case Reset:
		return j.cut(0)
	case Resume, TableReset:
		// A TableReset's State is the one stored when the table's copy began: what the output
		// held then.
		n, err := outputLength(b.State)
		if err != nil {
			return fmt.Errorf("%w: %s", ErrStore, err)
		}
		return j.cut(n)
	}
	w, err := j.worker(b.Worker)
	if err != nil {
		return err
	}
	if b.Kind == Snapshot {
		err = w.w.WriteRows(b)
	} else {
		err = w.w.WriteTxn(b.Txn)
	}
	w.a.release()
	return err
}

// worker returns the writer of a worker, made on first use.
func (j *JSONLines) worker(n int) (*jsonWorker, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.usable(); err != nil {
		return nil, err
	}
	w := j.writers[n]
	if w == nil {
		a := &jsonAppender{j: j}
		w = &jsonWorker{w: format.NewWriter(a, j.format), a: a}
		j.writers[n] = w
	}
	return w, nil
}

// usable reports why j may not be written, with j.mu held.
func (j *JSONLines) usable() error {
	switch {
	case j.closed:
		return ErrClosed
	case j.failed != nil:
		return fmt.Errorf("changefeed: %s: refusing to write after storing a position failed: %w", j.path, j.failed)
	}
	return nil
}

// cut cuts the output back to n bytes (not yet durably: the next position's commit fsyncs it).
func (j *JSONLines) cut(n int64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.usable(); err != nil {
		return err
	}
	return j.cutLocked(n)
}

func (j *JSONLines) cutLocked(n int64) error {
	j.bw.Reset(j.fw)
	if err := j.f.Truncate(n); err != nil {
		return fmt.Errorf("changefeed: cutting %s back to %d bytes: %w", j.path, n, err)
	}
	j.fw.Seek(n, io.SeekStart) // cannot fail: n is not negative
	j.end = n
	if j.durable > n {
		j.durable = n
	}
	return nil
}

// jsonAppender appends a worker's staged batch to the output, holding the output for the whole
// batch (from its first Write until release), so that batches of several workers never mix.
type jsonAppender struct {
	j    *JSONLines
	held bool
}

func (a *jsonAppender) Write(p []byte) (int, error) {
	j := a.j
	if !a.held {
		j.mu.Lock()
		a.held = true
		if err := j.usable(); err != nil {
			return 0, err
		}
	}
	n, err := j.bw.Write(p)
	j.end += int64(n)
	return n, err
}

func (a *jsonAppender) release() {
	if a.held {
		a.held = false
		a.j.mu.Unlock()
	}
}

// jsonUnit is a unit of a JSONLines: its Commit makes the output durable before the position.
type jsonUnit struct {
	j *JSONLines
	u Unit
}

func (u *jsonUnit) Commit(ctx context.Context, pos *Position) error {
	j := u.j
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.usable(); err != nil {
		return err
	}
	if err := j.bw.Flush(); err != nil {
		return fmt.Errorf("changefeed: writing %s: %w", j.path, err)
	}
	if pos == nil {
		return nil // a copied chunk: made durable with the copy's end
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("changefeed: syncing %s: %w", j.path, err)
	}
	pos.State = strconv.AppendInt(nil, j.end, 10)
	if err := u.u.Commit(ctx, pos); err != nil {
		// The position file holds the new position or the old one, both consistent with the
		// output; which one is known again only by loading it: write nothing more.
		j.failed = err
		return err
	}
	j.durable = j.end
	return nil
}

// Rollback cuts the output back to the last stored length: the unit's batch is gone.
func (u *jsonUnit) Rollback(context.Context) error {
	j := u.j
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed || j.failed != nil {
		return nil
	}
	return j.cutLocked(j.durable)
}

// Close closes the output and its position file. It is safe to call twice.
func (j *JSONLines) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closed = true
	var errs []error
	for _, w := range j.writers {
		errs = append(errs, w.w.Close())
	}
	if j.f != nil {
		errs = append(errs, j.f.Close())
	}
	errs = append(errs, j.dir.Close(), j.pos.Close())
	return errors.Join(errs...)
}
