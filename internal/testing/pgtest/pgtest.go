package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
)

// The server types, constants and errors are pgserver's.
type (
	// Install is one PostgreSQL installation found on this machine.
	Install = pgserver.Install
	// Server is a running throwaway PostgreSQL server.
	Server = pgserver.Server
	// Options configures Start.
	Options = pgserver.Options
	// StartError reports a server that did not come up.
	StartError = pgserver.StartError
	// Workload is a SQL script for Record.
	Workload = pgserver.Workload
	// Step is one statement of a Workload and the session that runs it.
	Step = pgserver.Step
	// Variant is one way of reading the changes in Record.
	Variant = pgserver.Variant
	// RecordOptions configures Record.
	RecordOptions = pgserver.RecordOptions
	// Capture is what one variant's slot gave for a workload.
	Capture = pgserver.Capture
)

// pgserver's constants, and the environment variables only tests read.
const (
	MinMajor     = pgserver.MinMajor
	EnvPGDir     = pgserver.EnvPGDir
	EnvVersions  = pgserver.EnvVersions
	ServerUser   = pgserver.ServerUser
	SuperUser    = pgserver.SuperUser
	HowToInstall = pgserver.HowToInstall

	// EnvRequire, set to "1", turns every "no server installed" skip into a test failure.
	EnvRequire = "PGREORDER_REQUIRE_PG"
	// EnvReport names a file to which Start appends one line per server started, so that a CI
	// run can show which versions its tests ran against (go test hides the output of passing
	// packages).
	EnvReport = "PGREORDER_PG_REPORT"
)

// pgserver's errors and variants.
var (
	ErrNotInstalled = pgserver.ErrNotInstalled
	ErrUnsupported  = pgserver.ErrUnsupported
	ErrWorkload     = pgserver.ErrWorkload

	// Variants are the captures Record makes by default (pgserver.Variants).
	Variants = pgserver.Variants
)

// FindInstalls is pgserver.FindInstalls.
func FindInstalls() []Install { return pgserver.FindInstalls() }

// AllInstalls is pgserver.AllInstalls: every installation, whatever PGREORDER_PG_VERSIONS says.
func AllInstalls() []Install { return pgserver.AllInstalls() }

// DefaultPGDirs is pgserver.DefaultPGDirs.
func DefaultPGDirs() []string { return pgserver.DefaultPGDirs() }

// DefaultSettings is pgserver.DefaultSettings.
func DefaultSettings() map[string]string { return pgserver.DefaultSettings() }

// ParseWorkload is pgserver.ParseWorkload.
func ParseWorkload(text string) (*Workload, error) { return pgserver.ParseWorkload(text) }

// Record is pgserver.Record.
func Record(ctx context.Context, connString string, w *Workload, opts RecordOptions) ([]Capture, error) {
	return pgserver.Record(ctx, connString, w, opts)
}

// Exec is pgserver.Exec: it connects, runs each statement on its own and disconnects.
func Exec(ctx context.Context, connString string, statements ...string) error {
	return pgserver.Exec(ctx, connString, statements...)
}

// Start is pgserver.Start with Options.CreateUser set: tests running as root get the
// unprivileged server user created if needed. It reports the server to PGREORDER_PG_REPORT.
func Start(ctx context.Context, in Install, opts Options) (*Server, error) {
	opts.CreateUser = true
	s, err := pgserver.Start(ctx, in, opts)
	if err == nil {
		report(in)
	}
	return s, err
}

func report(in Install) {
	path := os.Getenv(EnvReport)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	// One short write per line: O_APPEND keeps lines from parallel test binaries whole.
	fmt.Fprintf(f, "PostgreSQL %s\t%s\t%s\n", in.Version, filepath.Base(os.Args[0]), in.BinDir)
}
