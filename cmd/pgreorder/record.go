package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
)

func init() {
	register("record", "capture a workload's pgoutput stream with streaming off and on", runRecord)
}

type recordFlags struct {
	dsn       string
	major     int
	out       string
	workMem   string
	immediate bool
	variants  string
}

func runRecord(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("record", flag.ContinueOnError)
	var f recordFlags
	sourceVar(fs, &f.dsn, "connection string (`DSN`) of the database to record on (superuser: it creates a publication and slots);\n"+
		"empty: start a throwaway server (what that changes on the system is said on stderr first)")
	fs.IntVar(&f.major, "pg-major", 0, "major version of the throwaway server (0: the newest installed)")
	fs.StringVar(&f.out, "o", "", "folder for the capture files (created if needed; required)")
	fs.StringVar(&f.workMem, "work-mem", "64kB", "logical_decoding_work_mem for the streamed reads")
	fs.BoolVar(&f.immediate, "immediate", false, "stream every change at once: debug_logical_replication_streaming = immediate (16+)")
	fs.StringVar(&f.variants, "variants", "", "comma-separated captures to make (default: all the server supports): "+variantNames())
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: pgreorder record [-source DSN | -pg-major N] -o DIR [flags] WORKLOAD.sql\n\n"+
			"Runs WORKLOAD.sql's setup part (what comes before a `-- workload` line, if there is one),\n"+
			"creates a publication FOR ALL TABLES and one pgoutput slot per capture back to back, runs the workload\n"+
			"part (`-- session NAME` lines switch connections, for interleaved transactions), then writes what each\n"+
			"slot gives to DIR/VARIANT.capture: one message per line, lsn<TAB>xid<TAB>hex(data), as\n"+
			"pg_logical_slot_peek_binary_changes returns them, after '#' comment lines naming the server, options\n"+
			"and workload. plain.capture (streaming off) is what a consumer of the streamed captures must produce.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 || f.out == "" || (f.dsn != "" && f.major != 0) {
		fs.Usage()
		return &usageError{flag.ErrHelp}
	}
	text, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	w, err := pgserver.ParseWorkload(string(text))
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	opts := pgserver.RecordOptions{WorkMem: f.workMem, Immediate: f.immediate}
	if f.variants != "" {
		for _, name := range strings.Split(f.variants, ",") {
			v, ok := findVariant(strings.TrimSpace(name))
			if !ok {
				return fmt.Errorf("unknown variant %q (have %s)", name, variantNames())
			}
			opts.Variants = append(opts.Variants, v)
		}
	}

	dsn := f.dsn
	if dsn == "" {
		srv, err := startRecordServer(ctx, f.major)
		if err != nil {
			return err
		}
		defer srv.Stop()
		dsn = srv.ConnString("postgres")
	}
	caps, err := pgserver.Record(ctx, dsn, w, opts)
	if err != nil {
		return pgsession.RedactConnError(err, dsn)
	}
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		return err
	}
	for _, c := range caps {
		path := filepath.Join(f.out, c.Variant.Name+".capture")
		if err := writeCapture(path, c); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "pgreorder record: %-18s %6d messages  %s\n", c.Variant.Name, len(c.Records), path)
	}
	return nil
}

func variantNames() string {
	names := make([]string, len(pgserver.Variants))
	for i, v := range pgserver.Variants {
		names[i] = v.Name
	}
	return strings.Join(names, ", ")
}

func findVariant(name string) (pgserver.Variant, bool) {
	for _, v := range pgserver.Variants {
		if v.Name == name {
			return v, true
		}
	}
	return pgserver.Variant{}, false
}

// startRecordServer starts a throwaway server of the given major (0: the newest installed).
func startRecordServer(ctx context.Context, major int) (*pgserver.Server, error) {
	installs := pgserver.FindInstalls()
	if len(installs) == 0 {
		return nil, fmt.Errorf("no PostgreSQL installed: %s; or pass -source", pgserver.HowToInstall)
	}
	in := installs[len(installs)-1]
	if major != 0 {
		found := false
		for _, i := range installs {
			if i.Major == major {
				in, found = i, true
			}
		}
		if !found {
			return nil, fmt.Errorf("PostgreSQL %d is not installed: %s", major, pgserver.HowToInstall)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	fmt.Fprintf(os.Stderr, "pgreorder record: starting a throwaway %s\n", in)
	return pgserver.Start(sctx, in, pgserver.Options{CreateUser: true, Log: systemLog("record")})
}

// writeCapture writes c to path through a temporary file, so a failed run leaves no partial file.
func writeCapture(path string, c pgserver.Capture) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	cw := capture.NewWriter(tmp)
	if err := cw.Comment(c.Header); err != nil {
		return err
	}
	for _, r := range c.Records {
		if err := cw.Write(r); err != nil {
			return err
		}
	}
	if err := cw.Flush(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
