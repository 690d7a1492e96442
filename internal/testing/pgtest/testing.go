package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/pgsession"
)

var (
	mainCalled atomic.Bool

	sharedMu sync.Mutex
	shared   = map[int]*sharedServer{}

	installsOnce sync.Once
	installs     []Install
)

type sharedServer struct {
	once sync.Once
	srv  *Server
	err  error
}

// Main runs the tests of a package whose tests use Shared, then stops every shared server and
// exits with the tests' status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// On SIGINT or SIGTERM it stops the servers and exits with status 1. A test binary that dies
// otherwise (a panic, go test -timeout) takes its servers with it (they get SIGQUIT) and the
// next Start removes their folders.
func Main(m *testing.M) {
	mainCalled.Store(true)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s, ok := <-sig
		if !ok {
			return
		}
		stopShared()
		fmt.Fprintf(os.Stderr, "pgtest: %v: stopped test servers\n", s)
		os.Exit(1)
	}()
	code := m.Run()
	signal.Stop(sig)
	stopShared()
	os.Exit(code)
}

var (
	stopHooksMu sync.Mutex
	stopHooks   []func()
)

// OnStop registers f to run when Main stops the shared servers (after the tests, or on SIGINT or
// SIGTERM): other test helpers (internal/testing/kafkatest's brokers) stop what they started with it.
func OnStop(f func()) {
	stopHooksMu.Lock()
	stopHooks = append(stopHooks, f)
	stopHooksMu.Unlock()
}

func stopShared() {
	stopHooksMu.Lock()
	hooks := stopHooks
	stopHooks = nil
	stopHooksMu.Unlock()
	for _, f := range hooks {
		f()
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for major, e := range shared {
		e.once.Do(func() {}) // wait for a Start in progress
		if e.srv != nil {
			if err := e.srv.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "pgtest: stopping PostgreSQL %d: %v\n", major, err)
			}
		}
		delete(shared, major)
	}
}

func cachedInstalls() []Install {
	installsOnce.Do(func() { installs = FindInstalls() })
	return installs
}

// unavailable skips t, or fails it when PGREORDER_REQUIRE_PG=1.
func unavailable(t testing.TB, msg string) { Unavailable(t, msg) }

// Unavailable skips t because a server it needs is not installed, or fails it when
// PGREORDER_REQUIRE_PG=1. msg says what is missing.
func Unavailable(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s (%s=1); %s", msg, EnvRequire, HowToInstall)
	}
	t.Skipf("%s; %s", msg, HowToInstall)
}

// Majors returns the installed major versions (as FindInstalls), in ascending order. With none
// installed it skips t, or fails it when PGREORDER_REQUIRE_PG=1.
func Majors(t testing.TB) []int {
	t.Helper()
	var majors []int
	for _, in := range cachedInstalls() {
		majors = append(majors, in.Major)
	}
	if len(majors) == 0 {
		unavailable(t, "no PostgreSQL server installed")
	}
	return majors
}

// Shared returns the test binary's server of the given major version, starting it on first use.
// Tests share it: give each its own database (NewDatabase) and slot names. The package's
// TestMain must call Main, which stops the servers. If that major is not installed Shared skips
// t (fails it when PGREORDER_REQUIRE_PG=1); if the server does not start it fails t.
func Shared(t testing.TB, major int) *Server {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest.Shared: the package's TestMain must call pgtest.Main(m)")
	}
	var in Install
	var have []string
	for _, i := range cachedInstalls() {
		have = append(have, strconv.Itoa(i.Major))
		if i.Major == major {
			in = i
		}
	}
	if in.Major == 0 {
		unavailable(t, fmt.Sprintf("PostgreSQL %d is not installed (installed: [%s])", major, strings.Join(have, " ")))
	}
	sharedMu.Lock()
	e := shared[major]
	if e == nil {
		e = &sharedServer{}
		shared[major] = e
	}
	sharedMu.Unlock()
	e.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		e.srv, e.err = Start(ctx, in, Options{})
	})
	if e.err != nil {
		t.Fatal(e.err)
	}
	return e.srv
}

var dbCounter atomic.Int64

// NewDatabase creates a database with a unique name on s and returns its name. At the end of
// the test its replication slots are dropped (their walsenders terminated first) and then the
// database itself.
func NewDatabase(t testing.TB, s *Server) string {
	t.Helper()
	name := fmt.Sprintf("pgt_%d_%d", os.Getpid(), dbCounter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Exec(ctx, s.ConnString("postgres"), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: creating database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := DropDatabase(ctx, s, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return name
}

// DropDatabase drops dbname's replication slots (terminating the processes using them) and
// then the database, also with sessions still connected to it.
func DropDatabase(ctx context.Context, s *Server, dbname string) error {
	lit := pgsession.QuoteLiteral(dbname)
	err := Exec(ctx, s.ConnString("postgres"),
		"SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots WHERE database = "+lit+" AND active_pid IS NOT NULL",
		"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = "+lit,
		"DROP DATABASE IF EXISTS "+pgsession.QuoteIdent(dbname)+" WITH (FORCE)")
	if err != nil {
		return fmt.Errorf("dropping database %s: %w", dbname, err)
	}
	return nil
}

// Connect opens a connection that is closed when the test ends.
func Connect(t testing.TB, connString string) *pgconn.PgConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// MustExec runs sql (one or more statements, simple protocol) on conn and returns the results;
// an error fails t.
func MustExec(t testing.TB, conn *pgconn.PgConn, sql string) []*pgconn.Result {
	t.Helper()
	res, err := conn.Exec(context.Background(), sql).ReadAll()
	if err != nil {
		t.Fatalf("pgtest: %v (in %q)", err, sql)
	}
	return res
}
