package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/spill"
)

// durationFlag is a time.Duration flag that also takes a bare number, in seconds (as
// PostgreSQL's settings of that unit do): -status-interval 10 is 10s.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		*f.d = time.Duration(n * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 10s, 500ms or 2m (a bare number is in seconds)")
	}
	*f.d = d
	return nil
}

// durationVar defines a durationFlag.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(durationFlag{p}, name, usage)
}

// cliSlotWait turns -slot-wait into the libraries' SlotWait: 0 there means the default, here it
// means not waiting.
func cliSlotWait(d time.Duration) time.Duration {
	if d == 0 {
		return time.Nanosecond
	}
	return d
}

// startTimeoutVar defines -start-timeout, the bound of a run's first start
// (changefeed.Config.StartTimeout, apply.Config.StartTimeout), for command, whose first start
// reaches servers.
func startTimeoutVar(fs *flag.FlagSet, p *time.Duration, command, servers string) {
	durationVar(fs, p, "start-timeout", changefeed.DefaultStartTimeout, "how long the first connections to "+servers+
		" are tried (a server still starting) before "+command+" stops with the error, naming the side "+
		"(-1: no limit); once reached, a lost connection is retried for as long as "+command+" runs")
}

// errUsage is wrapped by the errors of a command line that cannot be run as it is: main exits
// with status 2 for them, 1 for other errors, and 0 after -h.
var errUsage = errors.New("usage")

// usageError is a command line's error: a flag that does not parse, a missing argument.
type usageError struct{ err error }

func (e *usageError) Error() string   { return e.err.Error() }
func (e *usageError) Unwrap() []error { return []error{e.err, errUsage} }

// parseFlags parses args with fs. Asked for help (-h, -help), it prints the usage on stdout
// and returns flag.ErrHelp; for a flag that does not parse it returns a usageError that says so
// once (not followed by the whole usage) and points to -h.
func parseFlags(fs *flag.FlagSet, args []string) error {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(os.Stderr)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		os.Stdout.Write(buf.Bytes())
		return flag.ErrHelp
	}
	return &usageError{fmt.Errorf("%w (see pgreorder %s -h)", err, fs.Name())}
}

// syncCommitFlag is -synchronous-commit: a boolean flag (given alone it is on) that also takes
// PostgreSQL's spellings of on and off, and explains the levels it does not take.
type syncCommitFlag struct{ on *bool }

func (f syncCommitFlag) IsBoolFlag() bool { return true }

func (f syncCommitFlag) String() string {
	if f.on == nil || !*f.on {
		return "false"
	}
	return "true"
}

func (f syncCommitFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "true", "on", "1", "yes":
		*f.on = true
	case "false", "off", "0", "no":
		*f.on = false
	case "local", "remote_write", "remote_apply":
		return fmt.Errorf("%s is not taken here: the flag is on or off (on: each commit waits as the target's "+
			"synchronous_commit says); for %s, set it for the target role (ALTER ROLE ... SET synchronous_commit = %s) "+
			"or in -target (options='-c synchronous_commit=%s'), and pass -synchronous-commit", s, s, s, s)
	default:
		return fmt.Errorf("want on or off (or true or false)")
	}
	return nil
}

// The flags that several commands share are registered by the groups below, once each, so that
// they have one name and one meaning everywhere.

// newTablesFlags is -copy-new-tables: whether the rows of a table added to the publications are
// copied (changefeed.Config.NewTables, apply.Config.NewTables).
type newTablesFlags struct{ copyNewTables bool }

func (n *newTablesFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&n.copyNewTables, "copy-new-tables", true, "copy the rows of a table added to the publication while streaming, "+
		"then stream its changes; false streams its changes only, from then on")
}

// newTables returns the changefeed's setting.
func (n *newTablesFlags) newTables() changefeed.NewTables {
	if n.copyNewTables {
		return changefeed.NewTablesCopy
	}
	return changefeed.NewTablesStream
}

// sourceFlags name the source database and what to read of it: -source (and its old name -dsn),
// -slot, -publication, and whether the slot survives a failover: -failover.
type sourceFlags struct {
	source, slot string
	publications []string
	failover     bool
}

// register defines the flags; slotHelp describes -slot as the command uses it.
func (s *sourceFlags) register(fs *flag.FlagSet, slotHelp string) {
	sourceVar(fs, &s.source, "connection string (`DSN`) of the source database (replication=database is added)")
	fs.StringVar(&s.slot, "slot", "", slotHelp)
	fs.Func("publication", "publication to read (repeatable, or comma-separated)", func(v string) error {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				s.publications = append(s.publications, p)
			}
		}
		return nil
	})
	fs.BoolVar(&s.failover, "failover", false, "create the slot with failover, or turn failover on for an existing slot, so that "+
		"a physical standby that synchronizes slots keeps it and the stream continues on the standby once it is promoted "+
		"(PostgreSQL 17+; give -source both servers with target_session_attrs=read-write)")
}

// sourceVar defines -source, the source database's connection string, into p, and its old
// name -dsn.
func sourceVar(fs *flag.FlagSet, p *string, usage string) {
	fs.StringVar(p, "source", "", usage)
	fs.Var(deprecatedAlias{fs: fs, name: "dsn", of: "source"}, "dsn", "deprecated: the old name of -source (a `DSN`), removed in the next release")
}

// missing names the flags of s that were not given.
func (s *sourceFlags) missing() []string {
	var out []string
	for _, m := range []struct {
		name  string
		unset bool
	}{{"-source", s.source == ""}, {"-slot", s.slot == ""}, {"-publication", len(s.publications) == 0}} {
		if m.unset {
			out = append(out, m.name)
		}
	}
	return out
}

// deprecatedAlias is a flag's old name, kept for a release: it sets the flag it stands for, and
// says on stderr (once) that the name is going.
type deprecatedAlias struct {
	fs       *flag.FlagSet
	name, of string
}

func (a deprecatedAlias) String() string { return "" }

func (a deprecatedAlias) Set(v string) error {
	fmt.Fprintf(deprecationOutput, "pgreorder %s: -%s is deprecated and will be removed: use -%s\n", a.fs.Name(), a.name, a.of)
	return a.fs.Set(a.of, v)
}

// deprecationOutput receives the notices of deprecated flags.
var deprecationOutput io.Writer = os.Stderr

// spillFlags bound the memory of transaction data and say where the rest goes: -work-mem,
// -spill-dir, -spill-compression.
type spillFlags struct {
	workMem, dir, compression string
}

func (s *spillFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.workMem, "work-mem", "64MB", workMemHelp)
	fs.StringVar(&s.dir, "spill-dir", "", "spill directory (default: the system temporary directory)")
	fs.StringVar(&s.compression, "spill-compression", "none", spillCompressionHelp)
}

// parse returns the work mem in bytes and the spill compressor.
func (s *spillFlags) parse() (int64, spill.Compressor, error) {
	workMem, err := parseWorkMem(s.workMem)
	if err != nil {
		return 0, nil, err
	}
	codec, err := parseSpillCompression(s.compression)
	if err != nil {
		return 0, nil, err
	}
	return workMem, codec, nil
}

// pgoutputFlags are the options of the pgoutput plugin that stream and kafka choose: -streaming,
// -proto, -messages, -binary, -two-phase, -origin-filter.
type pgoutputFlags struct {
	streaming, originFilter string
	proto                   int
	messages, binary        bool
	twoPhase                bool
}

// register defines the flags; messagesHelp and twoPhaseHelp say what the command does with
// logical decoding messages and prepared transactions.
func (p *pgoutputFlags) register(fs *flag.FlagSet, messagesHelp, twoPhaseHelp string) {
	fs.StringVar(&p.streaming, "streaming", "", `pgoutput streaming: off, on or parallel (default: the best the server has)`)
	fs.IntVar(&p.proto, "proto", 0, "pgoutput proto_version, 1-4 (default: the highest the server speaks)")
	fs.BoolVar(&p.messages, "messages", true, messagesHelp)
	fs.BoolVar(&p.binary, "binary", false, "binary column values")
	fs.BoolVar(&p.twoPhase, "two-phase", false, twoPhaseHelp)
	fs.StringVar(&p.originFilter, "origin-filter", "", `pgoutput's origin option: "any", or "none" (PostgreSQL 16+: `+
		"leave out changes another replication applied)")
}

// parse checks the flags and returns -streaming and -origin-filter parsed.
func (p *pgoutputFlags) parse() (replication.Streaming, replication.OriginFilter, error) {
	if err := parseProto(p.proto); err != nil {
		return 0, 0, err
	}
	streaming, err := replication.ParseStreaming(p.streaming)
	if err != nil {
		return 0, 0, fmt.Errorf("-streaming %q: valid values are off, on and parallel", p.streaming)
	}
	origin, err := replication.ParseOriginFilter(p.originFilter)
	if err != nil {
		return 0, 0, fmt.Errorf("-origin-filter %q: valid values are any and none", p.originFilter)
	}
	return streaming, origin, nil
}

// monitorFlags say how a command reports and talks to the source while it runs:
// -status-interval, -progress, -metrics-addr, -v.
type monitorFlags struct {
	status, progress time.Duration
	metricsAddr      string
	verbose          bool
}

// register defines the flags, -status-interval with the default status.
func (m *monitorFlags) register(fs *flag.FlagSet, status time.Duration) {
	help := "longest time between standby status updates to the source"
	if status == 0 {
		help += fmt.Sprintf(" (default %v)", replication.DefaultStatusInterval)
	}
	durationVar(fs, &m.status, "status-interval", status, help)
	durationVar(fs, &m.progress, "progress", 5*time.Second, "interval of the progress line on stderr (0: none)")
	fs.StringVar(&m.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on host:port at /metrics (port 0: any free port, logged)")
	fs.BoolVar(&m.verbose, "v", false, "debug logging")
}

// check reports a negative -progress.
func (m *monitorFlags) check() error {
	if m.progress < 0 {
		return fmt.Errorf("-progress %v: want an interval such as 5s, or 0 for no progress line", m.progress)
	}
	return nil
}

// logger is the command's logger on stderr, at debug level with -v.
func (m *monitorFlags) logger() *slog.Logger {
	level := slog.LevelInfo
	if m.verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// The sections of each command's usage (printFlags): the flags most runs need come first.
var (
	applyGroups = []flagGroup{
		{"connection", []string{"source", "target", "slot", "publication", "create-slot", "failover", "dsn"}},
		{"initial copy", []string{"copy", "copy-truncate", "copy-workers", "copy-new-tables"}},
		{"apply mode", []string{"mode", "workers", "commit-order", "synchronous-commit", "binary"}},
		{"conflicts and origins", []string{"conflict", "no-conflict-detection", "conflict-retention", "conflict-log-table",
			"origin", "origin-filter"}},
		{"operations and monitoring", []string{"progress", "metrics-addr", "v", "until-caught-up", "skip-lsn", "schema-changes",
			"sync-sequences", "sync-sequences-interval", "sync-sequences-once", "uninstall"}},
		{"advanced", []string{"work-mem", "spill-dir", "spill-compression", "progress-table", "accept-slot-ahead",
			"status-interval", "slot-wait", "start-timeout", "cpuprofile", "memprofile"}},
	}
	streamGroups = []flagGroup{
		{"connection", []string{"source", "slot", "publication", "create-slot", "temporary", "failover", "dsn"}},
		{"output", []string{"o", "file-mode", "resume", "format", "source-name", "source-db", "decimal-handling", "interval-handling"}},
		{"pgoutput", []string{"streaming", "proto", "messages", "binary", "two-phase", "origin-filter"}},
		{"operations and monitoring", []string{"progress", "metrics-addr", "v"}},
		{"advanced", []string{"work-mem", "spill-dir", "spill-compression", "status-interval", "slot-wait", "start-timeout"}},
	}
	kafkaGroups = []flagGroup{
		{"connection", []string{"source", "slot", "publication", "failover", "kafka-brokers", "dsn"}},
		{"topics and records", []string{"kafka-topic-prefix", "kafka-topic-map", "kafka-create-topics", "kafka-partitions",
			"kafka-replication-factor", "kafka-topic-config", "kafka-offsets-topic", "kafka-key-format", "kafka-value-format",
			"kafka-tombstones", "source-name", "source-db", "decimal-handling", "interval-handling"}},
		{"Kafka security", []string{"kafka-tls", "kafka-tls-ca", "kafka-tls-cert", "kafka-tls-key", "kafka-tls-insecure",
			"kafka-sasl-mechanism", "kafka-sasl-user"}},
		{"initial copy", []string{"copy-workers", "copy-new-tables"}},
		{"pgoutput", []string{"streaming", "proto", "messages", "binary", "two-phase", "origin-filter"}},
		{"operations and monitoring", []string{"progress", "metrics-addr", "v"}},
		{"advanced", []string{"work-mem", "spill-dir", "spill-compression", "status-interval", "start-timeout", "kafka-transactional-id",
			"kafka-client-id", "kafka-compression", "kafka-max-buffered", "kafka-transaction-timeout", "kafka-group"}},
	}
)

// commandFlags define the flags of the commands that report the libraries' errors, for explain
// to tell which flags a command has.
var commandFlags = map[string]func(*flag.FlagSet){
	"apply":  func(fs *flag.FlagSet) { new(applyFlags).register(fs) },
	"stream": func(fs *flag.FlagSet) { new(streamFlags).register(fs) },
	"kafka":  func(fs *flag.FlagSet) { new(kafkaFlags).register(fs) },
}

// fieldFlags maps what the libraries' errors name to the flag that sets it: the fields of their
// configurations (configerr.Field.Key: the package, then the field's path in its Config, as
// *apply.ConfigError and the messages that implement configerr.Named give them) and pgoutput's
// options ("pgoutput." and the option, as *replication.OptionError gives it). A field that no
// flag sets maps to "": messages keep the library's name. A test checks that every field the
// libraries name is here, and that every entry names a field that exists and a flag a command
// has. A command without the flag (kafka has no -create-slot) keeps the library's name too.
var fieldFlags = map[string]string{
	"apply.Source.ConnString":         "-source",
	"apply.Source.ConnConfig":         "",
	"apply.Source.Slot":               "-slot",
	"apply.Source.Publications":       "-publication",
	"apply.Source.OriginFilter":       "-origin-filter",
	"apply.Source.Buffer.WorkMem":     "-work-mem",
	"apply.Source.TemporarySlot":      "",
	"apply.Source.Failover":           "-failover",
	"apply.Source.TwoPhase":           "",
	"apply.Source.Reconnect.SlotWait": "",
	"apply.Source.Buffer.SkipThrough": "",
	"apply.Source.Buffer.Incremental": "",
	"apply.Target":                    "-target",
	"apply.TargetConfig":              "",
	"apply.Copy":                      "-copy",
	"apply.Mode":                      "-mode",
	"apply.Workers":                   "-workers",
	"apply.CommitOrder":               "-commit-order",
	"apply.CopyWorkers":               "-copy-workers",
	"apply.CopyTruncate":              "-copy-truncate",
	"apply.NewTables":                 "-copy-new-tables",
	"apply.ProgressTable":             "-progress-table",
	"apply.SlotWait":                  "-slot-wait",
	"apply.StartTimeout":              "-start-timeout",
	"apply.SkipLSN":                   "-skip-lsn",
	"apply.SchemaChanges":             "-schema-changes",
	"apply.SyncSequences":             "-sync-sequences",
	"apply.SyncSequencesInterval":     "-sync-sequences-interval",
	"apply.Conflicts.Off":             "-no-conflict-detection",
	"apply.Conflicts.Resolutions":     "-conflict",
	"apply.Conflicts.Retention":       "-conflict-retention",
	"apply.Conflicts.LogTable":        "-conflict-log-table",
	"apply.Conflicts.MaxLoggedValue":  "",
	"apply.Conflicts.TombstoneTable":  "",

	"replication.ConnString":         "-source",
	"replication.ConnConfig":         "",
	"replication.CreateSlot":         "-create-slot",
	"replication.Publications":       "-publication",
	"replication.TwoPhase":           "-two-phase",
	"replication.Failover":           "-failover",
	"replication.TemporarySlot":      "-temporary",
	"replication.Reconnect.SlotWait": "-slot-wait",

	"snapshot.ConnString":   "-source",
	"snapshot.ConnConfig":   "",
	"snapshot.Publications": "-publication",
	"snapshot.Workers":      "-copy-workers",

	"changefeed.Replication.Slot":               "-slot",
	"changefeed.Replication.TemporarySlot":      "-temporary",
	"changefeed.Replication.Failover":           "-failover",
	"changefeed.Start":                          "",
	"changefeed.StartTimeout":                   "-start-timeout",
	"changefeed.Copier":                         "",
	"changefeed.Replication.Buffer.Incremental": "",
	"changefeed.NewTables":                      "-copy-new-tables",

	"kafkasink.Brokers":           "-kafka-brokers",
	"kafkasink.TopicPrefix":       "-kafka-topic-prefix",
	"kafkasink.TopicMap":          "-kafka-topic-map",
	"kafkasink.OffsetsTopic":      "-kafka-offsets-topic",
	"kafkasink.KeyFormat":         "-kafka-key-format",
	"kafkasink.ValueFormat":       "-kafka-value-format",
	"kafkasink.Partitions":        "-kafka-partitions",
	"kafkasink.ReplicationFactor": "-kafka-replication-factor",
	"kafkasink.Group":             "-kafka-group",
	"kafkasink.SASL.User":         "-kafka-sasl-user",
	"kafkasink.SASL.Mechanism":    "-kafka-sasl-mechanism",

	"pgoutput.slot":              "-slot",
	"pgoutput.publication_names": "-publication",
	"pgoutput.proto_version":     "-proto",
	"pgoutput.streaming":         "-streaming",
	"pgoutput.origin":            "-origin-filter",
	"pgoutput.two_phase":         "-two-phase",
	"pgoutput.binary":            "-binary",
	"pgoutput.messages":          "-messages",
}
