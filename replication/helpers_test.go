package replication_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// logRecorder is a slog.Handler that keeps every record, for tests that check what was logged.
type logRecorder struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newLogRecorder() logRecorder { return logRecorder{mu: new(sync.Mutex), recs: new([]slog.Record)} }

func (l logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.recs = append(*l.recs, r.Clone())
	return nil
}
func (l logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logRecorder) WithGroup(string) slog.Handler      { return l }
func (l logRecorder) logger() *slog.Logger               { return slog.New(l) }

// find returns the text of the records at level whose message contains msg.
func (l logRecorder) find(level slog.Level, msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range *l.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			var b strings.Builder
			b.WriteString(r.Message)
			r.Attrs(func(a slog.Attr) bool {
				fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
				return true
			})
			out = append(out, b.String())
		}
	}
	return out
}

// dump logs every record (call it when a test fails).
func (l logRecorder) dump(t *testing.T) {
	t.Helper()
	for _, line := range l.find(slog.LevelDebug, "") {
		t.Log("debug: " + line)
	}
	for _, lvl := range []slog.Level{slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		for _, line := range l.find(lvl, "") {
			t.Logf("%s: %s", lvl, line)
		}
	}
}

// slotState returns a slot's confirmed_flush_lsn and active_pid (0 when inactive), waiting
// until it is inactive if asked.
func slotState(t *testing.T, connString, slot string, waitInactive bool) (decoding.LSN, int) {
	t.Helper()
	var lsn decoding.LSN
	var pid int
	pgtest.Eventually(t, 30*time.Second, "slot "+slot+" to be inactive", func() bool {
		v := pgtest.QueryText(t, connString, `SELECT confirmed_flush_lsn::text || ' ' || coalesce(active_pid, 0)
			FROM pg_replication_slots WHERE slot_name = `+pgsession.QuoteLiteral(slot)+` AND database = current_database()`)
		if v == "" {
			t.Fatalf("slot %s does not exist", slot)
		}
		lsnText, pidText, _ := strings.Cut(v, " ")
		var err error
		if lsn, err = decoding.ParseLSN(lsnText); err != nil {
			t.Fatal(err)
		}
		pid, _ = strconv.Atoi(pidText)
		return !waitInactive || pid == 0
	})
	return lsn, pid
}

// ids returns the first column of every Insert of t, as text.
func ids(t *testing.T, x *reorderbuffer.Txn) []string {
	t.Helper()
	var out []string
	for c, err := range x.Changes() {
		if err != nil {
			t.Fatal(err)
		}
		if ins, ok := c.Msg.(*decoding.Insert); ok {
			out = append(out, string(ins.New[0].Data))
		}
	}
	return out
}

// series returns the decimal strings lo..hi.
func series(lo, hi int) []string {
	var out []string
	for i := lo; i <= hi; i++ {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

// next calls s.Next and fails the test on an error.
func next(ctx context.Context, t *testing.T, s *replication.Stream) *reorderbuffer.Txn {
	t.Helper()
	x, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// expectNothingBefore checks that nothing more arrives: it commits a marker transaction (an
// insert of id into pub_t) on connString, and the next transaction s hands out must be that one.
// The marker is acknowledged.
func expectNothingBefore(ctx context.Context, t *testing.T, s *replication.Stream, connString string, id int) {
	t.Helper()
	pgtest.ExecAll(t, connString, fmt.Sprintf(`INSERT INTO pub_t VALUES (%d)`, id))
	x := next(ctx, t, s)
	if got := ids(t, x); x.GID != "" || !slices.Equal(got, []string{strconv.Itoa(id)}) {
		t.Fatalf("unexpected transaction %d (end %s, GID %q) with %v before the marker %d", x.Xid, x.EndLSN, x.GID, got, id)
	}
	if err := s.Ack(x); err != nil {
		t.Fatal(err)
	}
}

// readWatch tells when a Stream waits for the server: its connections are wrapped so that it
// counts the reads of the socket in progress. Once streaming, only Next reads (the goroutine that
// sends status updates outside Next only writes), so a read in progress is a Next waiting.
type readWatch struct{ reading atomic.Int32 }

// watchReads makes the connections cfg dials, the first and every reconnection, report their
// reads to the returned readWatch.
func watchReads(cfg *replication.Config) *readWatch {
	w := &readWatch{}
	before := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, c *pgconn.Config) error {
		if before != nil {
			if err := before(ctx, c); err != nil {
				return err
			}
		}
		dial := c.DialFunc
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		c.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &watchedConn{Conn: conn, w: w}, nil
		}
		return nil
	}
	return w
}

// waitReading waits until a read is in progress: a Next waits for the server.
func (w *readWatch) waitReading(t *testing.T) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, "Next to wait for the server", func() bool { return w.reading.Load() > 0 })
}

type watchedConn struct {
	net.Conn
	w *readWatch
}

func (c *watchedConn) Read(p []byte) (int, error) {
	c.w.reading.Add(1)
	defer c.w.reading.Add(-1)
	return c.Conn.Read(p)
}

// ownServer starts a server of the given major with extra settings, for this test only.
func ownServer(t *testing.T, major int, settings map[string]string) *pgtest.Server {
	t.Helper()
	var in pgtest.Install
	for _, i := range pgtest.FindInstalls() {
		if i.Major == major {
			in = i
		}
	}
	if in.Major == 0 {
		t.Skipf("PostgreSQL %d is not installed", major)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, in, pgtest.Options{Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv
}

// restarter restarts a server that ownServer started, the way an operator would: pg_ctl's fast
// (SIGINT) or immediate (SIGQUIT) shutdown of the postmaster, then a new postmaster on the same
// data directory, port and socket. The new postmaster is this process's child and dies with it.
type restarter struct {
	srv    *pgtest.Server
	cmd    *exec.Cmd
	exited chan struct{}
}

// newRestarter returns a restarter for srv. Call it right after ownServer, with the same t: its
// cleanup stops the last postmaster before the server's folder is removed.
func newRestarter(t *testing.T, srv *pgtest.Server) *restarter {
	r := &restarter{srv: srv}
	t.Cleanup(func() {
		if r.cmd == nil {
			return
		}
		select {
		case <-r.exited:
		default:
			r.cmd.Process.Signal(syscall.SIGQUIT)
			<-r.exited
		}
	})
	return r
}

func (r *restarter) data() string { return filepath.Join(r.srv.SocketDir(), "data") }

func (r *restarter) postmasterPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.data(), "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// stop shuts the server down with SIGINT (fast) or SIGQUIT (immediate) and waits for it.
func (r *restarter) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	pid := r.postmasterPID(t)
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
	if r.cmd != nil {
		select {
		case <-r.exited:
		case <-time.After(time.Minute):
			t.Fatal("postmaster did not stop")
		}
		return
	}
	// pgtest reaps its own child: the process is gone once it exited.
	pgtest.Eventually(t, time.Minute, "the postmaster to stop", func() bool { return syscall.Kill(pid, 0) != nil })
}

// start runs a new postmaster and waits until it accepts connections.
func (r *restarter) start(t *testing.T) {
	t.Helper()
	in := r.srv.Install()
	cmd := exec.Command(filepath.Join(in.BinDir, "postgres"), "-D", r.data())
	cmd.Dir = r.srv.SocketDir()
	cmd.Env = []string{"LC_ALL=C", "TZ=UTC", "PATH=/usr/bin:/bin"}
	if in.LibDir != "" {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+in.LibDir)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(pgtest.ServerUser)
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	logFile, err := os.OpenFile(filepath.Join(r.srv.SocketDir(), "server.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	exited := r.exited
	go func() {
		cmd.Wait()
		close(exited)
	}()
	pgtest.Eventually(t, time.Minute, "the server to accept connections", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgconn.Connect(ctx, r.srv.ConnString("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return true
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(r.srv.SocketDir(), "server.log"))
			t.Fatalf("postmaster exited: %s", b[max(0, len(b)-2000):])
		default:
		}
		return false
	})
}

func (r *restarter) restart(t *testing.T, sig syscall.Signal) {
	t.Helper()
	r.stop(t, sig)
	r.start(t)
}

// installedMajors returns the installed majors among want (every installed one if want is nil).
func installedMajors(t *testing.T, want ...int) []int {
	t.Helper()
	var out []int
	for _, m := range pgtest.Majors(t) {
		if want == nil || slices.Contains(want, m) {
			out = append(out, m)
		}
	}
	return out
}
