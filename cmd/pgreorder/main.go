// Command pgreorder demonstrates, records, replays and streams pgoutput logical replication.
//
//	pgreorder demo                         run a workload on a throwaway server and show the reordered output
//	pgreorder record [flags] WORKLOAD.sql  capture a workload's stream with streaming off and on
//	pgreorder replay [flags] FILE          reorder a capture and print committed transactions as JSON lines
//	pgreorder stream [flags]               stream a live slot as JSON lines
//
// demo, and record without -dsn, start a throwaway PostgreSQL server from an installation they
// find (see internal/pgserver). Before changing anything on the system for it they say so on
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

func usage() {
	fmt.Fprintf(os.Stderr, "usage: pgreorder COMMAND [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, commands[n].summary)
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		if os.Args[1] != "-h" && os.Args[1] != "help" && os.Args[1] != "--help" {
			fmt.Fprintf(os.Stderr, "pgreorder: unknown command %q\n", os.Args[1])
		}
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cmd.run(ctx, os.Args[2:])
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgreorder %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
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
