package replication

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// Streaming is the pgoutput "streaming" option.
type Streaming uint8

const (
	StreamingDefault  Streaming = iota // the best the server supports: parallel on 16+, on for 14 and 15, off below
	StreamingOff                       // the server reorders (and spills) every transaction itself
	StreamingOn                        // PostgreSQL 14+: large transactions are sent while they run
	StreamingParallel                  // PostgreSQL 16+: as on, and Stream Abort carries abort_lsn and abort_time
)

var streamingNames = [...]string{StreamingDefault: "default", StreamingOff: "off", StreamingOn: "on", StreamingParallel: "parallel"}

// String returns the option's value as pgoutput reads it ("off", "on", "parallel"), or "default".
func (s Streaming) String() string {
	if int(s) < len(streamingNames) {
		return streamingNames[s]
	}
	return fmt.Sprintf("Streaming(%d)", int(s))
}

// ParseStreaming parses "off", "on" or "parallel" (in any letter case); "" and "default" are
// StreamingDefault.
func ParseStreaming(s string) (Streaming, error) {
	if s == "" {
		return StreamingDefault, nil
	}
	for v, n := range streamingNames {
		if strings.EqualFold(s, n) {
			return Streaming(v), nil
		}
	}
	return 0, &OptionError{Option: "streaming", Value: s, Rule: streamRule, Err: ErrInvalidConfig}
}

// OriginFilter is pgoutput's "origin" option: which changes the server sends by the replication
// origin they were committed with (PostgreSQL 16+).
type OriginFilter uint8

const (
	OriginFilterDefault OriginFilter = iota // the option is not sent: every change, on any server
	OriginFilterAny                         // "any": every change
	OriginFilterNone                        // "none": only changes committed without an origin, not those another replication applied
)

var originFilterNames = [...]string{OriginFilterDefault: "", OriginFilterAny: "any", OriginFilterNone: "none"}

// String returns the option's value as pgoutput reads it ("any", "none"), or "" when not sent.
func (f OriginFilter) String() string {
	if int(f) < len(originFilterNames) {
		return originFilterNames[f]
	}
	return fmt.Sprintf("OriginFilter(%d)", int(f))
}

// ParseOriginFilter parses "any" or "none" (in any letter case); "" is OriginFilterDefault.
func ParseOriginFilter(s string) (OriginFilter, error) {
	for v, n := range originFilterNames {
		if strings.EqualFold(s, n) {
			return OriginFilter(v), nil
		}
	}
	return 0, &OptionError{Option: "origin", Value: s, Rule: originRule, Err: ErrInvalidConfig}
}

// DefaultStatusInterval is the longest time between two standby status updates when
// Config.StatusInterval is zero and the server's wal_sender_timeout is 40s or more (below that, a
// quarter of it). It is the default of PostgreSQL's own wal_receiver_status_interval and well
// under the default wal_sender_timeout (60s).
const DefaultStatusInterval = 10 * time.Second

// Defaults of ReconnectPolicy.
const (
	DefaultMinReconnectDelay = 100 * time.Millisecond
	DefaultMaxReconnectDelay = 30 * time.Second
	// DefaultSlotWait is how long Start and a reconnection wait for a slot in use by another
	// connection when ReconnectPolicy.SlotWait is 0: longer than the server's default
	// wal_sender_timeout (60s), after which it drops the walsender of a consumer whose host or
	// network died (one whose process died lets go of the slot at once).
	DefaultSlotWait = 90 * time.Second
)

// Config describes one replication stream. The zero value is not enough on its own: a connection
// (ConnString or ConnConfig), Slot and Publications are required; every other field has a working
// zero value.
type Config struct {
	// ConnString is a libpq connection string or URL. Use it or ConnConfig, not both.
	ConnString string
	// ConnConfig is a connection configuration made by pgconn.ParseConfig and then adjusted as the
	// application needs: TLSConfig, DialFunc (tunnels), LookupFunc, ValidateConnect, AfterConnect,
	// OnNotice, Fallbacks... It is copied before each connection attempt and never modified.
	ConnConfig *pgconn.Config
	// BeforeConnect, if set, is called before every connection attempt, the first one and each
	// reconnection, with a fresh copy of the connection configuration that it may change: set a
	// password that expires (an IAM authentication token), pick a host, open a tunnel. An error
	// fails the attempt (Start returns it; a reconnection retries it).
	BeforeConnect func(ctx context.Context, cfg *pgconn.Config) error

	// Whatever the connection string or configuration says, the connection is made with
	// replication=database and with the session settings pgoutput formats text values with
	// pinned to PostgreSQL's own subscriber's (see the package documentation):
	// DateStyle ISO, IntervalStyle postgres, extra_float_digits 3, and client_encoding UTF8.

	// Slot is the logical replication slot to read (pgoutput). Slot names are 1 to 63 characters
	// of a-z, 0-9 and '_', as PostgreSQL requires.
	Slot string
	// Publications are the publication names passed to pgoutput (at least one). They must exist
	// in the connection's database.
	Publications []string
	// CreateSlot creates the slot (plugin pgoutput) before streaming if it does not exist yet.
	CreateSlot bool
	// TemporarySlot makes a created slot temporary: the server drops it when the connection ends,
	// so a stream on a temporary slot cannot reconnect.
	TemporarySlot bool
	// Failover keeps the slot usable after a physical standby of the server is promoted
	// (PostgreSQL 17+): a created slot is created with failover enabled, and an existing slot
	// without it is altered to have it (logged once), so that a standby with
	// sync_replication_slots on keeps a copy of it. When the connection is then lost to a
	// failover, the stream continues from the promoted standby (a connection string that names
	// both servers, with target_session_attrs=read-write, reaches whichever is the primary). On
	// connecting, what the server lacks for that (a standby streaming through a physical slot
	// listed in synchronized_standby_slots) is logged as a warning. It is refused with a
	// *ConfigError on servers before 17, and with TemporarySlot.
	Failover bool

	// ProtoVersion is the pgoutput protocol version; 0 asks for the highest the server speaks:
	// 1 below PostgreSQL 14, 2 on 14, 3 on 15, 4 on 16 and later.
	ProtoVersion int
	// Streaming is StreamingOff, StreamingOn or StreamingParallel; StreamingDefault (the zero
	// value) asks for the best the server supports: parallel on 16+, on for 14 and 15, off below.
	Streaming Streaming
	// Binary asks for binary column values where the type has a send function (PostgreSQL 14+).
	Binary bool
	// Messages asks for logical decoding messages (pg_logical_emit_message), PostgreSQL 14+.
	Messages bool
	// TwoPhase asks for prepared transactions to be decoded at PREPARE (protocol 3+, PostgreSQL 15+).
	// It must match the slot: a created slot is created with two-phase decoding when it is set, and
	// an existing slot must have been created the same way (pg_replication_slots.two_phase).
	TwoPhase bool
	// OriginFilter is pgoutput's origin option: OriginFilterDefault (not sent), OriginFilterAny,
	// or OriginFilterNone (PostgreSQL 16+: only changes committed without a replication origin).
	OriginFilter OriginFilter

	// StatusInterval is the longest time between two standby status updates, sent whether or not
	// the consumer is inside Next. 0 means DefaultStatusInterval, or a quarter of the server's
	// wal_sender_timeout if that is shorter.
	StatusInterval time.Duration

	// Reconnect says how a Stream reconnects after losing its connection. The zero value
	// reconnects with exponential backoff for as long as Next's context allows.
	Reconnect ReconnectPolicy

	// Buffer configures the reorder buffer. Buffer.Decoding.ProtoVersion and Buffer.Decoding.AbortInfo
	// are overwritten with the negotiated values. Buffer.SkipThrough is the consumer's last durable
	// position, the EndLSN of the last transaction it handled for good: the stream starts at the
	// slot's own position and drops every transaction that ends at or before SkipThrough (see
	// the package documentation). It must not be beyond the server's current WAL position.
	// Buffer.SpillCompressor compresses spill files (package spillcompress; nil does not).
	Buffer reorderbuffer.Config

	// Logger receives progress messages, server notices (at Warn) and reconnections; nil logs
	// nothing.
	Logger *slog.Logger
}

// ReconnectPolicy configures the reconnection of a Stream. Between two attempts it waits a delay
// that starts at MinDelay and doubles up to MaxDelay, with ±20% jitter; a cancelled context or
// Close stops the wait. Only errors for which Retryable is true are retried; the others end the
// stream.
type ReconnectPolicy struct {
	// Disabled makes Next return the error that broke the connection instead of reconnecting.
	Disabled bool
	// MinDelay is the delay before the first attempt; 0 means DefaultMinReconnectDelay.
	MinDelay time.Duration
	// MaxDelay is the longest delay between two attempts; 0 means DefaultMaxReconnectDelay.
	MaxDelay time.Duration
	// MaxAttempts is the number of failed attempts in a row after which Next gives up and returns
	// the last error; 0 means no limit.
	MaxAttempts int
	// SlotWait is how long Start, and a reconnection, retry a slot that another connection
	// streams from (ErrSlotActive) before giving up with its *SlotActiveError, which names the
	// connection that holds it; the first refusal is logged at Warn with the holder. 0 means
	// DefaultSlotWait; a negative value waits as long as the context allows.
	SlotWait time.Duration
}

// slotWait returns the effective SlotWait; negative means no limit.
func (p ReconnectPolicy) slotWait() time.Duration {
	if p.SlotWait == 0 {
		return DefaultSlotWait
	}
	return p.SlotWait
}

// reconnectJitter spreads each reconnection delay by ±20%, so that many consumers do not
// reconnect in step.
const reconnectJitter = 0.2

// backoff returns the schedule of delays between attempts: from MinDelay, doubling up to
// MaxDelay, with ±20% jitter.
func (p ReconnectPolicy) backoff() retry.Backoff {
	lo, hi := p.MinDelay, p.MaxDelay
	if lo <= 0 {
		lo = DefaultMinReconnectDelay
	}
	if hi <= 0 {
		hi = DefaultMaxReconnectDelay
	}
	return retry.Backoff{Min: lo, Max: hi, Jitter: reconnectJitter}
}

// delay returns the wait before attempt n (1-based), without jitter.
func (p ReconnectPolicy) delay(n int) time.Duration { return p.backoff().Base(n) }

// Negotiated is what a Config resolves to against a given server.
type Negotiated struct {
	ServerMajor  int       // the server's major version, e.g. 15
	ProtoVersion int       // the pgoutput protocol version sent
	Streaming    Streaming // StreamingOff, StreamingOn or StreamingParallel
	// PluginArgs are the START_REPLICATION options, in the order sent, already quoted.
	PluginArgs []string
}

// ErrUnsupported is wrapped by the *OptionError returned when the server cannot honour an option.
var ErrUnsupported = retry.Stop("replication: option not supported by the server")

// ErrInvalidConfig is wrapped by every error about a Config that no server would accept.
var ErrInvalidConfig = retry.Stop("replication: invalid configuration")

// OptionError reports an option that is invalid or that the server's version does not support.
type OptionError struct {
	Option      string
	Value       string
	ServerMajor int    // 0 when the value is invalid for every server
	Rule        string // what a valid value is, when the value is invalid; may be ""
	Err         error
}

func (e *OptionError) Error() string {
	if e.ServerMajor != 0 {
		return fmt.Sprintf("replication: option %s=%q is not supported by PostgreSQL %d", e.Option, e.Value, e.ServerMajor)
	}
	if e.Rule != "" {
		return fmt.Sprintf("replication: invalid option %s=%q: %s", e.Option, e.Value, e.Rule)
	}
	return fmt.Sprintf("replication: invalid option %s=%q", e.Option, e.Value)
}

// Retryable reports false: the option has to be changed, or the server upgraded.
func (e *OptionError) Retryable() bool { return false }

// Rules of OptionError for the values that no server accepts.
const (
	slotNameRule = "a slot name is 1 to 63 characters, each a lower-case letter, a digit or an underscore"
	pubNameRule  = "at least one publication, none of them empty"
	protoRule    = "pgoutput protocol versions are 1 to 4"
	streamRule   = "valid values are off, on and parallel"
	originRule   = `valid values are "any" and "none"`
)

func (e *OptionError) Unwrap() error { return e.Err }

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// maxProto returns the highest pgoutput protocol version the server major speaks.
func maxProto(major int) int {
	switch {
	case major >= 16:
		return 4
	case major == 15:
		return 3
	case major == 14:
		return 2
	default:
		return 1
	}
}

// Negotiate resolves c against a server of the given major version: the protocol version, the
// streaming mode and the exact pgoutput options START_REPLICATION will carry. It reports an
// *OptionError for an option the server cannot honour rather than silently dropping it.
func (c *Config) Negotiate(serverMajor int) (Negotiated, error) {
	n := Negotiated{ServerMajor: serverMajor}
	if err := c.validate(); err != nil {
		return n, err
	}
	unsupported := func(opt, val string) error {
		return &OptionError{Option: opt, Value: val, ServerMajor: serverMajor, Err: ErrUnsupported}
	}
	top := maxProto(serverMajor)
	n.ProtoVersion = c.ProtoVersion
	switch {
	case c.ProtoVersion == 0:
		n.ProtoVersion = top
	case c.ProtoVersion < 1 || c.ProtoVersion > 4:
		return n, &OptionError{Option: "proto_version", Value: strconv.Itoa(c.ProtoVersion), Rule: protoRule, Err: ErrInvalidConfig}
	case c.ProtoVersion > top:
		return n, unsupported("proto_version", strconv.Itoa(c.ProtoVersion))
	}

	switch c.Streaming {
	case StreamingDefault:
		switch {
		case n.ProtoVersion >= 4:
			n.Streaming = StreamingParallel
		case n.ProtoVersion >= 2:
			n.Streaming = StreamingOn
		default:
			n.Streaming = StreamingOff
		}
	case StreamingOff:
		n.Streaming = StreamingOff
	case StreamingOn:
		if n.ProtoVersion < 2 {
			return n, unsupported("streaming", c.Streaming.String())
		}
		n.Streaming = StreamingOn
	case StreamingParallel:
		if n.ProtoVersion < 4 {
			return n, unsupported("streaming", c.Streaming.String())
		}
		n.Streaming = StreamingParallel
	default:
		return n, &OptionError{Option: "streaming", Value: c.Streaming.String(), Rule: streamRule, Err: ErrInvalidConfig}
	}
	if c.TwoPhase && n.ProtoVersion < 3 {
		return n, unsupported("two_phase", "true")
	}
	if (c.Binary || c.Messages) && serverMajor < 14 {
		opt := "binary"
		if !c.Binary {
			opt = "messages"
		}
		return n, unsupported(opt, "true")
	}
	switch c.OriginFilter {
	case OriginFilterDefault:
	case OriginFilterAny, OriginFilterNone:
		if serverMajor < 16 {
			return n, unsupported("origin", c.OriginFilter.String())
		}
	default:
		return n, &OptionError{Option: "origin", Value: c.OriginFilter.String(), Rule: originRule, Err: ErrInvalidConfig}
	}

	pubs := make([]string, len(c.Publications))
	for i, p := range c.Publications {
		pubs[i] = pgsession.QuoteIdent(p)
	}
	n.PluginArgs = append(n.PluginArgs,
		"proto_version '"+strconv.Itoa(n.ProtoVersion)+"'",
		"publication_names "+pgsession.QuoteCommandLiteral(strings.Join(pubs, ",")),
	)
	if n.ProtoVersion >= 2 {
		// Sent explicitly even when off, so the choice never depends on a server default.
		n.PluginArgs = append(n.PluginArgs, "streaming '"+n.Streaming.String()+"'")
	}
	if c.Binary {
		n.PluginArgs = append(n.PluginArgs, "binary 'true'")
	}
	if c.Messages {
		n.PluginArgs = append(n.PluginArgs, "messages 'true'")
	}
	if c.TwoPhase {
		n.PluginArgs = append(n.PluginArgs, "two_phase 'true'")
	}
	if c.OriginFilter != OriginFilterDefault {
		n.PluginArgs = append(n.PluginArgs, "origin '"+c.OriginFilter.String()+"'")
	}
	return n, nil
}

// validate checks what does not depend on the server: the slot name and the publications.
func (c *Config) validate() error {
	if !slotNameRE.MatchString(c.Slot) {
		return &OptionError{Option: "slot", Value: c.Slot, Rule: slotNameRule, Err: ErrInvalidConfig}
	}
	if len(c.Publications) == 0 {
		return &OptionError{Option: "publication_names", Value: "", Rule: pubNameRule, Err: ErrInvalidConfig}
	}
	for _, p := range c.Publications {
		if p == "" {
			return &OptionError{Option: "publication_names", Value: p, Rule: pubNameRule, Err: ErrInvalidConfig}
		}
	}
	if c.Failover && c.TemporarySlot {
		return configerr.New(ErrInvalidConfig, field("Failover"), "is set, and so is %s: a temporary slot ends with its "+
			"connection and is never kept on a standby", field("TemporarySlot"))
	}
	return nil
}

// decodingOptions returns the decoder options that match what the server was asked for.
func (n Negotiated) decodingOptions() decoding.Options {
	ai := decoding.AbortInfoNever
	if n.Streaming == StreamingParallel {
		ai = decoding.AbortInfoAlways
	}
	return decoding.Options{ProtoVersion: n.ProtoVersion, AbortInfo: ai}
}

// parseMajor extracts the major version from a server_version parameter such as "15.8 (Debian …)"
// or "18beta1".
func parseMajor(v string) (int, error) {
	i := 0
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		i++
	}
	m, err := strconv.Atoi(v[:i])
	if err != nil || m < 10 {
		return 0, fmt.Errorf("replication: cannot parse server_version %q", v)
	}
	return m, nil
}
