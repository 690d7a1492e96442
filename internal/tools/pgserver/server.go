package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ServerUser is the unprivileged account that runs the servers when the caller is root
// (PostgreSQL refuses to run as root). Start creates it with useradd only when
// Options.CreateUser is set.
const ServerUser = "pgreorder"

// SuperUser is the database superuser of every server Start makes (trust authentication).
const SuperUser = "postgres"

// tempPrefix names the folders Start creates; the creating process id follows it, so that
// folders left by a process that died (SIGKILL, panic) are removed by the next Start.
const tempPrefix = "pgreorder-pg-"

// ErrNotInstalled is wrapped by the error Start returns for an Install without the postgres and
// initdb programs.
var ErrNotInstalled = errors.New("pgserver: PostgreSQL version not installed")

// ErrNoServerUser is wrapped by the error Start returns when it runs as root, ServerUser does not
// exist and Options.CreateUser is not set.
var ErrNoServerUser = errors.New("pgserver: running as root and the server user does not exist")

// StartError reports a server that did not come up; Log holds the end of its log.
type StartError struct {
	Install Install
	Err     error
	Log     string
}

func (e *StartError) Error() string {
	msg := fmt.Sprintf("pgserver: starting %s: %v", e.Install, e.Err)
	if e.Log != "" {
		msg += "\nserver log:\n" + e.Log
	}
	return msg
}

func (e *StartError) Unwrap() error { return e.Err }

// Options configures Start. The zero value starts a server with DefaultSettings and changes
// nothing outside the server's own folder: as root without ServerUser it fails.
type Options struct {
	// Settings are extra server settings (GUCs), applied after DefaultSettings and so
	// overriding them, e.g. {"logical_decoding_work_mem": "1MB"}.
	Settings map[string]string
	// CreateUser lets Start, when it runs as root, create ServerUser (a system account without
	// home directory or login shell, made with useradd) if it does not exist yet.
	CreateUser bool
	// Log, when not nil, receives one line before each change Start makes to the system: the
	// user it creates, the folder it makes under the temporary directory, the library links it
	// restores in an npm install, and the folders of dead processes it removes.
	Log io.Writer
	// Durable keeps PostgreSQL's own durability settings (fsync and full_page_writes on)
	// instead of DefaultSettings' throwaway ones, for tests of what survives a crash of the
	// server (Crash, Restart). It makes every commit that waits for its WAL flush slower.
	Durable bool
}

// DefaultSettings returns the settings every server starts with, besides port, listen_addresses
// and unix_socket_directories. They differ from PostgreSQL's defaults only where logical decoding
// or the tests need it, or where the difference changes nothing a replication consumer meets;
// everything else, wal_sender_timeout (60s) included, keeps the production default.
func DefaultSettings() map[string]string {
	return map[string]string{
		// Logical decoding needs it (default: replica).
		"wal_level": "logical",
		// Prepared transactions, and so two-phase decoding, are off by default (0).
		"max_prepared_transactions": "10",
		// The smallest value the server accepts (default 64MB): a transaction of a few hundred
		// rows is streamed, or spilled by the server when streaming is off, so that small
		// workloads exercise both paths. A consumer meets both with larger transactions.
		"logical_decoding_work_mem": "64kB",
		// Capacity (defaults 10, 10, 100 and 128MB): room for the slots and connections of
		// tests that run in parallel, and less shared memory per server.
		"max_replication_slots": "32",
		"max_wal_senders":       "32",
		"max_connections":       "60",
		"shared_buffers":        "32MB",
		// Durability across an operating-system crash, which a throwaway server never needs to
		// survive. The server writes and reads its WAL as it would with them on, so decoding,
		// the walsender and everything a consumer sees are unchanged. synchronous_commit stays
		// on: the SQL decoding functions and the walsender only read WAL that has been flushed,
		// and a test that commits and then reads must not race the WAL writer.
		"fsync":            "off",
		"full_page_writes": "off",
		// Presentation: a quiet log, messages in English (errors are matched on their text)
		// and timestamps printed in UTC, so captures do not depend on the machine's time zone.
		// pgreorder passes column text through untouched, so none of these changes what it does.
		"log_min_messages": "warning",
		"log_destination":  "stderr",
		"lc_messages":      "C",
		"timezone":         "UTC",
	}
}

// Server is a running throwaway PostgreSQL server. Its data directory and sockets live in a
// temporary folder that Stop removes.
type Server struct {
	install Install
	dir     string // temporary folder: data/, server.log, the unix socket
	port    int
	cred    *syscall.Credential
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the postmaster has been waited for
	waitErr error

	stopOnce sync.Once
	stopErr  error
}

// Major returns the server's major version.
func (s *Server) Major() int { return s.install.Major }

// Install returns the installation the server runs from.
func (s *Server) Install() Install { return s.install }

// Port returns the TCP port the server listens on at 127.0.0.1 (and the number of its socket).
func (s *Server) Port() int { return s.port }

// SocketDir returns the folder holding the server's unix socket.
func (s *Server) SocketDir() string { return s.dir }

// ConnString returns a keyword/value connection string for dbname over the unix socket, as
// the superuser.
func (s *Server) ConnString(dbname string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", s.dir, s.port, SuperUser, quoteConnValue(dbname))
}

// ReplicationConnString is ConnString plus replication=database: a walsender connection.
func (s *Server) ReplicationConnString(dbname string) string {
	return s.ConnString(dbname) + " replication=database"
}

// TCPConnString is ConnString over TCP to 127.0.0.1.
func (s *Server) TCPConnString(dbname string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", s.port, SuperUser, quoteConnValue(dbname))
}

func quoteConnValue(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`) {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// Start initializes a data directory in a new folder under the temporary directory and starts
// a server from in, listening on a free TCP port at 127.0.0.1 and on a unix socket in that
// folder. As root it runs initdb and the server as ServerUser (see Options.CreateUser) in a
// folder under /tmp that ServerUser owns. The server is a child of this process that receives
// SIGQUIT (immediate shutdown) if this process dies; call Stop to stop it and remove its folder.
// Start first removes the folders of earlier processes that died without stopping theirs.
func Start(ctx context.Context, in Install, opts Options) (*Server, error) {
	// Check the install before changing anything on the system for it.
	for _, name := range []string{"postgres", "initdb"} {
		if !isExecutable(filepath.Join(in.BinDir, name)) {
			return nil, &StartError{Install: in, Err: fmt.Errorf("%s: %w", filepath.Join(in.BinDir, name), ErrNotInstalled)}
		}
	}
	sweepStale(opts.Log)
	if err := hydrateSymlinks(in, opts.Log); err != nil {
		return nil, err
	}
	cred, err := serverCredential(ServerUser, opts)
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // another process may take the port we picked
		s, err := start(ctx, in, opts, cred)
		if err == nil {
			return s, nil
		}
		lastErr = err
		var se *StartError
		if ctx.Err() != nil || !errors.As(err, &se) || !strings.Contains(se.Log, "could not bind") {
			break
		}
	}
	return nil, lastErr
}

// folderSeq numbers the folders this process makes.
var folderSeq atomic.Int64

// newFolder makes the folder of a new server under the temporary directory (under /tmp when the
// server runs as cred, which TMPDIR may not let through), owned by cred's user.
func newFolder(in Install, log io.Writer, cred *syscall.Credential) (string, error) {
	base := os.TempDir()
	if cred != nil {
		base = "/tmp" // TMPDIR may be under /root, which the server user cannot traverse
	}
	owner := ""
	if cred != nil {
		owner = "; owned by user " + ServerUser
	}
	var dir string
	for {
		dir = filepath.Join(base, tempPrefix+strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(folderSeq.Add(1), 10))
		if _, err := os.Lstat(dir); err == nil {
			continue // left by an earlier process with the same id
		}
		logf(log, "creating folder %s for a throwaway PostgreSQL %s (data directory, log, socket%s; removed when it stops)",
			dir, in.Version, owner)
		err := os.Mkdir(dir, 0o700)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("pgserver: %w", err)
		}
	}
	err := os.Chmod(dir, 0o755)
	if err == nil && cred != nil {
		err = os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("pgserver: %w", err)
	}
	return dir, nil
}

func start(ctx context.Context, in Install, opts Options, cred *syscall.Credential) (_ *Server, err error) {
	dir, err := newFolder(in, opts.Log, cred)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	s := &Server{install: in, dir: dir, cred: cred}
	data := filepath.Join(dir, "data")

	if cred != nil {
		// Fail clearly when the binaries sit where the server user cannot reach them (e.g. /root).
		if out, err := s.command(ctx, cred, "postgres", "--version").CombinedOutput(); err != nil {
			return nil, &StartError{Install: in, Err: fmt.Errorf("user %s cannot run %s (%w); install PostgreSQL in a folder others can read, such as /opt/pgreorder/pg", ServerUser, in.BinDir, err), Log: tail(out)}
		}
	}
	initdb := s.command(ctx, cred, "initdb", "-D", data, "-U", SuperUser, "-A", "trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, &StartError{Install: in, Err: fmt.Errorf("initdb: %w", err), Log: tail(out)}
	}

	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	s.port = port
	settings := DefaultSettings()
	if opts.Durable {
		delete(settings, "fsync")
		delete(settings, "full_page_writes")
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	settings["port"] = strconv.Itoa(port)
	settings["listen_addresses"] = "127.0.0.1"
	settings["unix_socket_directories"] = dir
	if err := appendSettings(filepath.Join(data, "postgresql.conf"), "pgserver", settings); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}

	if err := s.run(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// run starts the postmaster on the server's data directory and waits until it accepts
// connections.
func (s *Server) run(ctx context.Context) error {
	logPath := filepath.Join(s.dir, "server.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	defer logFile.Close() // the child holds its own descriptor
	// Not exec.CommandContext: the server outlives ctx, which only bounds start-up.
	s.cmd = s.command(context.Background(), s.cred, "postgres", "-D", filepath.Join(s.dir, "data"))
	s.cmd.Stdout = logFile
	s.cmd.Stderr = logFile
	s.cmd.SysProcAttr.Setpgid = true // a ^C in the terminal reaches us, not the server
	// Immediate shutdown if we die. The kernel sends it when the forking thread exits; Go's
	// runtime keeps its threads unless a goroutine exits while locked to one, which Start
	// never does.
	s.cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	exited := make(chan struct{})
	s.exited = exited
	if err := s.cmd.Start(); err != nil {
		return &StartError{Install: s.install, Err: err}
	}
	cmd := s.cmd
	go func() {
		s.waitErr = cmd.Wait()
		close(exited)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.kill()
		b, _ := os.ReadFile(logPath)
		return &StartError{Install: s.install, Err: err, Log: tail(b)}
	}
	return nil
}

// Crash stops the server at once, as pg_ctl stop -m immediate does (SIGQUIT to the postmaster:
// no checkpoint, WAL not yet written is lost, what was written stays), and keeps its folder for
// Restart. Connections get an error.
func (s *Server) Crash() {
	s.kill()
}

// Restart starts the server again on its data directory and port after Crash, and waits until
// it accepts connections (after crash recovery).
func (s *Server) Restart(ctx context.Context) error {
	s.kill()
	return s.run(ctx)
}

// command returns an exec.Cmd for one of the install's binaries, run as cred when not nil.
func (s *Server) command(ctx context.Context, cred *syscall.Credential, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.install.BinDir, name), args...)
	cmd.Dir = s.dir
	env := []string{"LC_ALL=C", "TZ=UTC", "PATH=/usr/bin:/bin"}
	if s.install.LibDir != "" {
		env = append(env, "LD_LIBRARY_PATH="+s.install.LibDir)
	}
	if cred != nil {
		env = append(env, "HOME="+s.dir, "USER="+ServerUser)
	} else if h, err := os.UserHomeDir(); err == nil {
		env = append(env, "HOME="+h)
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd
}

// waitReady polls until the server accepts a connection, the postmaster exits or ctx ends
// (at most a minute).
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(cctx, s.ConnString("postgres"))
		ccancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("server exited: %v", s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Stop stops the server at once (immediate shutdown, as pg_ctl stop -m immediate: nothing is
// kept) and removes its folder. It is safe to call more than once and from several goroutines.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.kill()
		if err := os.RemoveAll(s.dir); err != nil {
			s.stopErr = fmt.Errorf("pgserver: %w", err)
		}
	})
	return s.stopErr
}

// kill sends SIGQUIT (immediate shutdown) and waits for the postmaster, then SIGKILLs its process
// group if it has not exited after 30 seconds.
func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte) string {
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

// logf writes one line to w, if not nil.
func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

var userMu sync.Mutex

// serverCredential returns nil when not root, else the ids of the user called name (ServerUser),
// creating that user if it does not exist and opts allow it.
func serverCredential(name string, opts Options) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	userMu.Lock()
	defer userMu.Unlock()
	u, err := user.Lookup(name)
	if err != nil {
		if !opts.CreateUser {
			return nil, fmt.Errorf("%w: PostgreSQL refuses to run as root, and user %q, which would run it, does not exist "+
				"(create it, e.g. `useradd --system --user-group --no-create-home --shell /usr/sbin/nologin %s`, or run as another user)",
				ErrNoServerUser, name, name)
		}
		args := []string{"--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name}
		logf(opts.Log, "creating system user %s (useradd %s): PostgreSQL refuses to run as root", name, strings.Join(args, " "))
		out, uerr := exec.Command("useradd", args...).CombinedOutput()
		// Another process may have created it meanwhile: look again before failing.
		if u, err = user.Lookup(name); err != nil {
			return nil, fmt.Errorf("pgserver: running as root and cannot create user %q: %v: %s", name, uerr, out)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgserver: user %q has non-numeric ids", name)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

var sweepOnce sync.Once

// sweepStale removes folders left in the temporary directories by processes that no longer
// exist (their servers died with them through Pdeathsig). It runs once per process.
func sweepStale(log io.Writer) {
	sweepOnce.Do(func() {
		seen := map[string]bool{}
		for _, base := range []string{os.TempDir(), "/tmp"} {
			matches, _ := filepath.Glob(filepath.Join(base, tempPrefix+"*"))
			for _, m := range matches {
				if seen[m] {
					continue
				}
				seen[m] = true
				rest := strings.TrimPrefix(filepath.Base(m), tempPrefix)
				pidText, _, _ := strings.Cut(rest, "-")
				pid, err := strconv.Atoi(pidText)
				if err != nil || pid == os.Getpid() || processAlive(pid) {
					continue
				}
				if postmasterAlive(m) {
					continue
				}
				logf(log, "removing %s, left by process %d, which no longer runs", m, pid)
				os.RemoveAll(m)
			}
		}
	})
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// postmasterAlive reports whether the postmaster.pid in dir/data names a live process.
func postmasterAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	return err == nil && pid > 0 && processAlive(pid)
}

// appendSettings appends settings to the configuration file path (created if missing, 0600),
// sorted by name, after a comment line "# header".
func appendSettings(path, header string, settings map[string]string) error {
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var conf strings.Builder
	conf.WriteString("\n# " + header + "\n")
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(conf.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
