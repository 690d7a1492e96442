package changefeed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/vfs"
)

// FileStore keeps the position in a small file, replaced atomically on every commit with
// vfs.WriteFile: written to a temporary file next to it (its name plus ".tmp", mode 0600, created
// exclusively, never through a symbolic link), fsynced, renamed over the file, and the directory
// fsynced. The file carries a checksum: a torn or altered file is an error (ErrStore), never a
// position. A symbolic link at the file's path is refused, and so is a file that belongs to
// another user or has other hard links. A commit that fails leaves the previous position or, if
// only making the rename durable failed, the new one; Load reads whichever it is.
//
// A FileStore cannot commit the handler's writes together with the position: the handler makes
// its output durable before it returns, and records with Batch.SetState what it needs to cut
// that output back to the stored position on Resume (a file's length, for instance). Without
// that, a crash between the handler's write and the position's commit repeats that transaction
// (at least once).
type FileStore struct {
	path string
	dir  vfs.Dir
	name string // the file's name in dir
	mode fs.FileMode

	mu     sync.Mutex
	closed bool
}

// FileConfig describes a FileStore beyond its path. The zero value is the operating system's
// files.
type FileConfig struct {
	// FS is the file system the store works through; nil means the operating system's
	// (vfs.OS). Tests inject faults with package vfs/faultfs.
	FS vfs.FS
	// FileMode is the permissions the file is created with, less the umask; 0 means 0600.
	FileMode fs.FileMode
}

// The file's first line. Version 2 adds the known tables and the table whose copy began
// (Position.Tables, Position.Sync); a position with neither is written in version 1, which
// earlier releases read.
const (
	fileHeader   = "pgreorder changefeed position v1"
	fileHeaderV2 = "pgreorder changefeed position v2"
)

// OpenFile opens the position file at path (it need not exist; its directory must, and must be
// writable: OpenFile checks). Only one FileStore may commit to a path at a time; others may Load
// it meanwhile. It is OpenFileStore with the zero FileConfig.
func OpenFile(path string) (*FileStore, error) { return OpenFileStore(path, FileConfig{}) }

// OpenFileStore opens the position file at path, as OpenFile does, through cfg.FS.
func OpenFileStore(path string, cfg FileConfig) (*FileStore, error) {
	fsys := cfg.FS
	if fsys == nil {
		fsys = vfs.OS()
	}
	dir, err := fsys.OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("changefeed: position file %s: %w", path, err)
	}
	mode := cfg.FileMode.Perm()
	if mode == 0 {
		mode = 0o600
	}
	s := &FileStore{path: path, dir: dir, name: filepath.Base(path), mode: mode}
	if st, err := dir.Lstat(s.name); err == nil && !st.Mode.IsRegular() {
		dir.Close()
		return nil, fmt.Errorf("%w: %s is not a regular file (a symbolic link is never followed)", ErrStore, path)
	}
	// A probe of its own: the temporary file may be a running writer's (another process
	// reading the position), not to be touched.
	if err := probe(dir); err != nil {
		dir.Close()
		return nil, fmt.Errorf("changefeed: position file %s: its directory is not writable: %w", path, err)
	}
	return s, nil
}

// probe creates a file under a new name in dir and removes it again.
func probe(dir vfs.Dir) error {
	var rnd [8]byte
	rand.Read(rnd[:]) // never fails
	name := ".changefeed-probe-" + hex.EncodeToString(rnd[:])
	f, err := dir.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	return dir.Remove(name)
}

// Load reads the position.
func (s *FileStore) Load(_ context.Context, slot string) (Position, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Position{}, false, ErrClosed
	}
	b, err := vfs.ReadFile(s.dir, s.name, 4*MaxState)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Position{}, false, nil
	case errors.Is(err, vfs.ErrSymlink):
		return Position{}, false, fmt.Errorf("%w: %s is a symbolic link, which is never followed", ErrStore, s.path)
	case errors.Is(err, vfs.ErrNotRegular), errors.Is(err, vfs.ErrNotPrivate):
		return Position{}, false, fmt.Errorf("%w: %w", ErrStore, err)
	case err != nil:
		return Position{}, false, fmt.Errorf("changefeed: position file: %w", err)
	}
	p, err := parsePosition(b)
	if err != nil {
		return Position{}, false, fmt.Errorf("%w: %s: %s (remove it, and the consumer's output, to start again with a copy)", ErrStore, s.path, err)
	}
	return p, true, nil
}

func formatPosition(p Position) []byte {
	header := fileHeader
	if p.Tables != nil || p.Sync != nil {
		header = fileHeaderV2
	}
	body := fmt.Sprintf("%s\nslot %s\nsystem_id %s\ncopy_done %t\nend_lsn %s\nstate %s\n",
		header, p.Slot, p.SystemID, p.CopyDone, p.EndLSN, hex.EncodeToString(p.State))
	if header == fileHeaderV2 {
		body += "tables " + formatTables(p.Tables) + "\nsync " + formatSync(p.Sync) + "\n"
	}
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
	switch {
	case len(lines) == 6 && lines[0] == fileHeader:
	case len(lines) == 8 && lines[0] == fileHeaderV2:
	default:
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
	if len(lines) == 8 {
		tables, ok1 := strings.CutPrefix(lines[6], "tables ")
		sync, ok2 := strings.CutPrefix(lines[7], "sync ")
		if !ok1 || !ok2 {
			return Position{}, errors.New("malformed tables or sync")
		}
		if p.Tables, err = parseTables(tables); err != nil {
			return Position{}, err
		}
		if p.Sync, err = parseSync(sync); err != nil {
			return Position{}, err
		}
	}
	return p, nil
}

// formatTables writes a known set: "-" when unknown, the OIDs separated by commas otherwise.
func formatTables(t []uint32) string {
	if t == nil {
		return "-"
	}
	var b strings.Builder
	for i, oid := range t {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(oid), 10))
	}
	return b.String()
}

func parseTables(s string) ([]uint32, error) {
	if s == "-" {
		return nil, nil
	}
	out := []uint32{}
	if s == "" {
		return out, nil
	}
	for f := range strings.SplitSeq(s, ",") {
		oid, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, errors.New("malformed tables")
		}
		out = append(out, uint32(oid))
	}
	return out, nil
}

// formatSync writes a table in sync: "-" when none, "OID FROM SCHEMA NAME" otherwise, the names
// in hexadecimal.
func formatSync(s *TableSync) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%d %s %s %s", s.Table.OID, s.From, hex.EncodeToString([]byte(s.Table.Schema)), hex.EncodeToString([]byte(s.Table.Name)))
}

func parseSync(s string) (*TableSync, error) {
	if s == "-" {
		return nil, nil
	}
	f := strings.Split(s, " ")
	if len(f) != 4 {
		return nil, errors.New("malformed sync")
	}
	oid, err1 := strconv.ParseUint(f[0], 10, 32)
	from, err2 := decoding.ParseLSN(f[1])
	schema, err3 := hex.DecodeString(f[2])
	name, err4 := hex.DecodeString(f[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, errors.New("malformed sync")
	}
	return &TableSync{Table: TableRef{OID: uint32(oid), Schema: string(schema), Name: string(name)}, From: from}, nil
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
	if err := vfs.WriteFile(s.dir, s.name, formatPosition(p), s.mode); err != nil {
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
