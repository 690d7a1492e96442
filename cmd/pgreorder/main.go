// Command pgreorder demonstrates, records, replays and streams pgoutput logical replication.
//
//	pgreorder demo                         run a workload on a throwaway server and show the reordered output
//	pgreorder record [flags] WORKLOAD.sql  capture a workload's stream with streaming off and on
//	pgreorder replay [flags] FILE          reorder a capture and print committed transactions as JSON lines
//	pgreorder stream [flags]               stream a live slot as JSON lines
//
// demo, and record without -source, start a throwaway PostgreSQL server from an installation they
// find (see internal/tools/pgserver). Before changing anything on the system for it they say so on
// stderr: the folder they create under the temporary directory (removed at exit), the folders of
// earlier runs that died which they remove, and, run as root, the system user "pgreorder" they
// create with useradd if it does not exist (PostgreSQL refuses to run as root).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sort"
	"syscall"
)

// command is one subcommand. Each lives in its own file and registers itself in init.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string) error) {
	commands[name] = command{summary: summary, run: run}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: pgreorder COMMAND [flags]\n       pgreorder COMMAND -h   (the command's flags)\n       pgreorder -version\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}

// buildVersion, when set at link time (-ldflags "-X main.buildVersion=v1.2.3"), is what -version
// prints instead of what the build information says.
var buildVersion string

// shortVersion is the module version alone (a tag, a pseudo-version, "(devel)"), for the
// events' source.version.
func shortVersion() string {
	if buildVersion != "" {
		return buildVersion
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return ""
}

// version describes the build: the module version (a tag, or a pseudo-version; "(devel)" for a
// build from a work tree), the commit and the Go version.
func version() string {
	if buildVersion != "" {
		return "pgreorder " + buildVersion + " " + runtime.Version()
	}
	v, commit, dirty := "(unknown)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := "pgreorder " + v
	if commit != "" {
		out += " commit " + commit[:min(len(commit), 12)]
		if dirty {
			out += " (modified)"
		}
	}
	return out + " " + runtime.Version()
}

func main() {
	tuneCollector = true // not in tests, which run commands in their own process
	os.Exit(run(os.Args[1:]))
}

// run runs the command line args and returns the exit status: 0, 1 for an error, 2 for a
// command line that cannot be run.
func run(args []string) int {
	if len(args) < 1 {
		usage(os.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(os.Stdout)
		return 0
	case "-version", "--version", "version":
		fmt.Println(version())
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "pgreorder: unknown command %q\n", args[0])
		usage(os.Stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cmd.run(ctx, args[1:])
	stop()
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage) && errors.Is(err, flag.ErrHelp):
		return 2 // the usage was printed on stderr
	case errors.Is(err, flag.ErrHelp):
		return 0 // asked for: printed on stdout
	}
	fmt.Fprintf(os.Stderr, "pgreorder %s: %s\n", args[0], explain(args[0], err))
	if errors.Is(err, errUsage) {
		return 2
	}
	return 1
}

// systemLog returns the writer given to pgserver.Options.Log: every line written to it goes to
// stderr after "pgreorder NAME: ". pgserver writes one whole line per call.
func systemLog(name string) io.Writer {
	return prefixWriter{w: os.Stderr, prefix: "pgreorder " + name + ": "}
}

type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, p.prefix+string(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}
