package changefeed

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/pgreorder/pgreorder/decoding"
)

// FileStore keeps the position in a small file, replaced atomically on every commit: written
// to a temporary file next to it (its name plus ".tmp", mode 0600, created exclusively, never
// through a symbolic link), fsynced, renamed over the file, and the directory fsynced. The file
// carries a checksum: a torn or altered file is an error (ErrStore), never a position. A
// symbolic link at the file's path is refused.
//
// A FileStore cannot commit the handler's writes together with the position: the handler makes
// its output durable before it returns, and records with Batch.SetState what it needs to cut
// that output back to the stored position on Resume (a file's length, for instance). Without
// that, a crash between the handler's write and the position's commit repeats that transaction
// (at least once).
type FileStore struct {
	path string
	dir  *os.File

	mu     sync.Mutex
	closed bool
}

const fileHeader = "pgreorder changefeed position v1"

// OpenFile opens the position file at path (it need not exist; its directory must, and must be
// writable: OpenFile checks). Only one FileStore may commit to a path at a time; others may Load
// it meanwhile.
func OpenFile(path string) (*FileStore, error) {
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("changefeed: position file %s: %w", path, err)
	}
	s := &FileStore{path: path, dir: dir}
	if st, err := os.Lstat(path); err == nil && !st.Mode().IsRegular() {
		dir.Close()
		return nil, fmt.Errorf("%w: %s is not a regular file (a symbolic link is never followed)", ErrStore, path)
	}
	// A probe of its own: the temporary file may be a running writer's (another process
	// reading the position), not to be touched.
	probe, err := os.CreateTemp(filepath.Dir(path), ".changefeed-probe-*")
	if err == nil {
		probe.Close()
		err = os.Remove(probe.Name())
	}
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("changefeed: position file %s: its directory is not writable: %w", path, err)
	}
	return s, nil
}

// createTemp creates the temporary file, exclusively, after removing one a crash left.
func (s *FileStore) createTemp() (*os.File, error) {
	tmp := s.path + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
}

// Load reads the position.
func (s *FileStore) Load(_ context.Context, slot string) (Position, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Position{}, false, ErrClosed
	}
	f, err := os.OpenFile(s.path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return Position{}, false, nil
	}
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return Position{}, false, fmt.Errorf("%w: %s is a symbolic link, which is never followed", ErrStore, s.path)
		}
		return Position{}, false, fmt.Errorf("changefeed: position file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4*MaxState))
	if err != nil {
		return Position{}, false, fmt.Errorf("changefeed: position file: %w", err)
	}
	p, err := parsePosition(b)
	if err != nil {
		return Position{}, false, fmt.Errorf("%w: %s: %s (remove it, and the consumer's output, to start again with a copy)", ErrStore, s.path, err)
	}
	return p, true, nil
}

func formatPosition(p Position) []byte {
	body := fmt.Sprintf("%s\nslot %s\nsystem_id %s\ncopy_done %t\nend_lsn %s\nstate %s\n",
		fileHeader, p.Slot, p.SystemID, p.CopyDone, p.EndLSN, hex.EncodeToString(p.State))
	return fmt.Appendf(nil, "%scrc32c %08x\n", body, crc32.Checksum([]byte(body), crcTable))
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func parsePosition(b []byte) (Position, error) {
	text := string(b)
	i := strings.LastIndex(strings.TrimSuffix(text, "\n"), "\n")
	if i < 0 || !strings.HasSuffix(text, "\n") {
		return Position{}, errors.New("not a position file, or torn")
	}
	body, sum := text[:i+1], strings.TrimSuffix(text[i+1:], "\n")
	if sum != fmt.Sprintf("crc32c %08x", crc32.Checksum([]byte(body), crcTable)) {
		return Position{}, errors.New("checksum mismatch: torn or altered")
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if len(lines) != 6 || lines[0] != fileHeader {
		return Position{}, errors.New("not a position file")
	}
	var p Position
	var f [5]string
	for k, name := range []string{"slot", "system_id", "copy_done", "end_lsn", "state"} {
		v, ok := strings.CutPrefix(lines[k+1], name+" ")
		if !ok {
			return Position{}, fmt.Errorf("malformed %s", name)
		}
		f[k] = v
	}
	p.Slot, p.SystemID = f[0], f[1]
	switch f[2] {
	case "true":
		p.CopyDone = true
	case "false":
	default:
		return Position{}, errors.New("malformed copy_done")
	}
	var err error
	if p.EndLSN, err = decoding.ParseLSN(f[3]); err != nil {
		return Position{}, errors.New("malformed end_lsn")
	}
	if p.State, err = hex.DecodeString(f[4]); err != nil {
		return Position{}, errors.New("malformed state")
	}
	if len(p.State) == 0 {
		p.State = nil
	}
	return p, nil
}

// Begin returns a unit whose Commit writes the position, if given one.
func (s *FileStore) Begin(context.Context, int) (Unit, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	return fileUnit{s}, nil
}

type fileUnit struct{ s *FileStore }

func (u fileUnit) Commit(_ context.Context, p *Position) error {
	if p == nil {
		return nil
	}
	return u.s.write(*p)
}

func (fileUnit) Rollback(context.Context) error { return nil }

// write replaces the position file atomically and durably.
func (s *FileStore) write(p Position) error {
	if len(p.State) > MaxState || strings.ContainsAny(p.Slot+p.SystemID, " \n") {
		return fmt.Errorf("%w: position not storable", ErrInvalidConfig)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	f, err := s.createTemp()
	if err != nil {
		return fmt.Errorf("changefeed: position file: %w", err)
	}
	_, err = f.Write(formatPosition(p))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), s.path)
	}
	if err == nil {
		err = s.dir.Sync()
	}
	if err != nil {
		return fmt.Errorf("changefeed: writing the position file %s: %w", s.path, err)
	}
	return nil
}

// Close closes the store. It is safe to call twice.
func (s *FileStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.dir.Close()
}
