package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/spill"
)

func TestNegotiate(t *testing.T) {
	base := func(mod func(*Config)) Config {
		c := Config{Slot: "s1", Publications: []string{"pub"}}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	tests := []struct {
		name    string
		cfg     Config
		major   int
		proto   int
		stream  Streaming
		args    string
		wantErr error
	}{
		{"pg13 defaults", base(nil), 13, 1, StreamingOff, "proto_version '1', publication_names '\"pub\"'", nil},
		{"pg14 defaults", base(nil), 14, 2, StreamingOn, "proto_version '2', publication_names '\"pub\"', streaming 'on'", nil},
		{"pg15 defaults", base(nil), 15, 3, StreamingOn, "proto_version '3', publication_names '\"pub\"', streaming 'on'", nil},
		{"pg16 defaults", base(nil), 16, 4, StreamingParallel, "proto_version '4', publication_names '\"pub\"', streaming 'parallel'", nil},
		{"pg18 defaults", base(nil), 18, 4, StreamingParallel, "proto_version '4', publication_names '\"pub\"', streaming 'parallel'", nil},
		{"pg18 proto 2", base(func(c *Config) { c.ProtoVersion = 2 }), 18, 2, StreamingOn, "proto_version '2', publication_names '\"pub\"', streaming 'on'", nil},
		{"pg18 streaming off", base(func(c *Config) { c.Streaming = StreamingOff }), 18, 4, StreamingOff, "proto_version '4', publication_names '\"pub\"', streaming 'off'", nil},
		{"pg18 all options", base(func(c *Config) {
			c.Binary, c.Messages, c.TwoPhase, c.OriginFilter = true, true, true, OriginFilterNone
			c.Publications = []string{"a", `we"ird'one`}
		}), 18, 4, StreamingParallel,
			`proto_version '4', publication_names '"a","we""ird''one"', streaming 'parallel', binary 'true', messages 'true', two_phase 'true', origin 'none'`, nil},
		{"pg15 parallel", base(func(c *Config) { c.Streaming = StreamingParallel }), 15, 0, 0, "", ErrUnsupported},
		{"pg15 proto 4", base(func(c *Config) { c.ProtoVersion = 4 }), 15, 0, 0, "", ErrUnsupported},
		{"pg14 two-phase", base(func(c *Config) { c.TwoPhase = true }), 14, 0, 0, "", ErrUnsupported},
		{"pg15 origin", base(func(c *Config) { c.OriginFilter = OriginFilterNone }), 15, 0, 0, "", ErrUnsupported},
		{"proto 1 streaming on", base(func(c *Config) { c.ProtoVersion = 1; c.Streaming = StreamingOn }), 18, 0, 0, "", ErrUnsupported},
		{"bad streaming", base(func(c *Config) { c.Streaming = 9 }), 18, 0, 0, "", ErrInvalidConfig},
		{"bad proto", base(func(c *Config) { c.ProtoVersion = 5 }), 18, 0, 0, "", ErrInvalidConfig},
		{"bad origin", base(func(c *Config) { c.OriginFilter = 7 }), 18, 0, 0, "", ErrInvalidConfig},
		{"bad slot", base(func(c *Config) { c.Slot = "Bad-Slot" }), 18, 0, 0, "", ErrInvalidConfig},
		{"no slot", base(func(c *Config) { c.Slot = "" }), 18, 0, 0, "", ErrInvalidConfig},
		{"no publication", base(func(c *Config) { c.Publications = nil }), 18, 0, 0, "", ErrInvalidConfig},
		{"empty publication", base(func(c *Config) { c.Publications = []string{""} }), 18, 0, 0, "", ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := tt.cfg.Negotiate(tt.major)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				var oe *OptionError
				if !errors.As(err, &oe) {
					t.Fatalf("err %T is not an *OptionError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n.ProtoVersion != tt.proto || n.Streaming != tt.stream {
				t.Errorf("proto %d streaming %q, want %d %q", n.ProtoVersion, n.Streaming, tt.proto, tt.stream)
			}
			if got := strings.Join(n.PluginArgs, ", "); got != tt.args {
				t.Errorf("args\n got %s\nwant %s", got, tt.args)
			}
			opts := n.decodingOptions()
			if opts.ProtoVersion != tt.proto {
				t.Errorf("decoding proto %d", opts.ProtoVersion)
			}
			if (n.Streaming == StreamingParallel) != (opts.AbortInfo == decoding.AbortInfoAlways) {
				t.Errorf("abort info %v with streaming %s", opts.AbortInfo, n.Streaming)
			}
		})
	}
}

func TestParseOptions(t *testing.T) {
	for in, want := range map[string]Streaming{"": StreamingDefault, "default": StreamingDefault, "off": StreamingOff,
		"ON": StreamingOn, "parallel": StreamingParallel} {
		got, err := ParseStreaming(in)
		if err != nil || got != want {
			t.Errorf("ParseStreaming(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && !strings.EqualFold(got.String(), in) {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for in, want := range map[string]OriginFilter{"": OriginFilterDefault, "any": OriginFilterAny, "None": OriginFilterNone} {
		got, err := ParseOriginFilter(in)
		if err != nil || got != want || !strings.EqualFold(got.String(), in) {
			t.Errorf("ParseOriginFilter(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"yes", "true", " on"} {
		if _, err := ParseStreaming(in); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseStreaming(%q): %v, want ErrInvalidConfig", in, err)
		}
		if _, err := ParseOriginFilter(in); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseOriginFilter(%q): %v, want ErrInvalidConfig", in, err)
		}
	}
}

func TestParseMajor(t *testing.T) {
	for in, want := range map[string]int{
		"15.8 (Debian 15.8-1.pgdg120+1)": 15, "18beta1": 18, "16.4": 16, "10.0": 10,
	} {
		if got, err := parseMajor(in); err != nil || got != want {
			t.Errorf("parseMajor(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "9.6.1", "x"} {
		if _, err := parseMajor(in); err == nil {
			t.Errorf("parseMajor(%q) succeeded", in)
		}
	}
}

func TestRetryable(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("replication: %w", &pgconn.PgError{Code: code}) }
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"network", fmt.Errorf("replication: receive: %w", io.ErrUnexpectedEOF), true},
		{"net.OpError", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"server ended", fmt.Errorf("%w (CommandComplete)", ErrServerEndedStream), true},
		{"slot active", fmt.Errorf("x: %w: %w", ErrSlotActive, &pgconn.PgError{Code: "55006"}), true},
		{"terminated", pg("57P01"), true},
		{"starting up", pg("57P03"), true},
		{"too many connections", pg("53300"), true},
		{"connection failure", pg("08006"), true},
		{"object in use", pg("55006"), true},
		{"undefined object", pg("42704"), false},
		{"slot invalidated", pg("55000"), false},
		{"wal removed", pg("58P01"), false},
		{"auth", pg("28P01"), false},
		{"check", &CheckError{Setting: "wal_level", Err: ErrServerConfig}, false},
		{"check with retryable cause", &CheckError{Setting: "max_wal_senders", Err: ErrServerConfig, Cause: &pgconn.PgError{Code: "53300"}}, false},
		{"option", &OptionError{Option: "streaming", Err: ErrUnsupported}, false},
		{"invalid config", fmt.Errorf("%w: x", ErrInvalidConfig), false},
		{"protocol", &ProtocolError{Msg: "x"}, false},
		{"buffer input", &reorderbuffer.InputError{Err: reorderbuffer.ErrProtocol}, false},
		{"buffer failed", fmt.Errorf("%w: x", reorderbuffer.ErrFailed), false},
		{"data lost upstream", &reorderbuffer.InputError{Err: &reorderbuffer.MissingError{What: "COMMIT PREPARED"}}, false},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), false},
		{"closed", ErrClosed, false},
		{"spill file not written", &reorderbuffer.InputError{Err: &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}}, true},
		{"spill file corrupt", &reorderbuffer.InputError{Err: fmt.Errorf("%w: %w", spill.ErrCorrupt, &fs.PathError{Op: "read", Path: "x", Err: io.ErrUnexpectedEOF})}, false},
		{"deadlock", pg("40P01"), true},
	} {
		if got := Retryable(tt.err); got != tt.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestTransient: Transient and Retryable follow pgsession's table of transient SQLSTATEs, which
// apply's retry decision shares.
func TestTransient(t *testing.T) {
	for _, code := range []string{"08006", "08P01", "53300", "57P01", "57P04", "25P04", "40P01", "55006", "55000",
		"58030", "58P01", "42704", "23505", "XX000"} {
		want := pgsession.TransientSQLState(code)
		err := fmt.Errorf("x: %w", &pgconn.PgError{Code: code})
		if got := Transient(err); got != want {
			t.Errorf("Transient(%v) = %v, want %v", code, got, want)
		}
		if Retryable(err) != want {
			t.Errorf("Retryable disagrees with pgsession.TransientSQLState on %q", code)
		}
	}
	for _, err := range []error{nil, io.EOF, errors.New("x"), &net.OpError{Op: "dial", Err: errors.New("refused")}} {
		if Transient(err) {
			t.Errorf("Transient(%v): not an error of a server", err)
		}
	}
}

func TestFlushPosition(t *testing.T) {
	for _, tt := range []struct {
		name                         string
		buffer, received, slot, sent decoding.LSN
		want                         decoding.LSN
	}{
		{"acknowledged and received", 100, 150, 50, 80, 100},
		{"resume position not received yet", 200, 150, 50, 80, 150},
		{"nothing received: the slot's position", 200, 0, 50, 0, 50},
		{"buffer behind the slot", 10, 150, 50, 0, 50},
		{"never moves back", 90, 150, 50, 120, 120},
	} {
		if got := flushPosition(tt.buffer, tt.received, tt.slot, tt.sent); got != tt.want {
			t.Errorf("%s: flushPosition(%d, %d, %d, %d) = %d, want %d", tt.name, tt.buffer, tt.received, tt.slot, tt.sent, got, tt.want)
		}
	}
}

func TestConnConfigPinsSettings(t *testing.T) {
	base, err := pgconn.ParseConfig(`host=/tmp dbname=d replication=true DateStyle='SQL, DMY' IntervalStyle=sql_standard ` +
		`extra_float_digits=0 client_encoding=LATIN1 options='-c datestyle=German'`)
	if err != nil {
		t.Fatal(err)
	}
	orig := maps.Clone(base.RuntimeParams)
	var hookSaw map[string]string
	cfg := Config{BeforeConnect: func(_ context.Context, c *pgconn.Config) error {
		hookSaw = maps.Clone(c.RuntimeParams)
		c.RuntimeParams["DATESTYLE"] = "Postgres" // the hook cannot unpin either
		c.Password = "token"
		return nil
	}}
	pc, err := cfg.connConfig(context.Background(), base, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"replication": "database", "datestyle": "ISO", "intervalstyle": "postgres",
		"extra_float_digits": "3", "client_encoding": "UTF8", "application_name": "pgreorder",
		"options": "-c datestyle=German", "standard_conforming_strings": "on", "search_path": "pg_catalog, pg_temp",
		"statement_timeout": "0", "idle_in_transaction_session_timeout": "0", "idle_session_timeout": "0"}
	if !maps.Equal(pc.RuntimeParams, want) {
		t.Errorf("runtime params %v\nwant %v", pc.RuntimeParams, want)
	}
	if pc.Password != "token" || pc.OnNotice == nil {
		t.Errorf("password %q, OnNotice set %v", pc.Password, pc.OnNotice != nil)
	}
	if !maps.Equal(base.RuntimeParams, orig) || base.Password == "token" || !maps.Equal(hookSaw, orig) {
		t.Errorf("the base configuration was modified (%v) or the hook saw another (%v)", base.RuntimeParams, hookSaw)
	}

	base.RuntimeParams["application_name"] = "mine"
	pc, err = (&Config{}).connConfig(context.Background(), base, slog.New(slog.DiscardHandler))
	if err != nil || pc.RuntimeParams["application_name"] != "mine" {
		t.Errorf("application_name %q, %v; want the configured one", pc.RuntimeParams["application_name"], err)
	}

	hookErr := errors.New("no token")
	cfg.BeforeConnect = func(context.Context, *pgconn.Config) error { return hookErr }
	if _, err := cfg.connConfig(context.Background(), base, slog.New(slog.DiscardHandler)); !errors.Is(err, hookErr) {
		t.Errorf("failing hook: %v", err)
	}
}

// TestConnectionMisuse: configurations that cannot work are errors, never panics, and nothing is
// dialled for them.
func TestConnectionMisuse(t *testing.T) {
	parsed, err := pgconn.ParseConfig("host=/nonexistent dbname=d")
	if err != nil {
		t.Fatal(err)
	}
	ok := Config{Slot: "s", Publications: []string{"p"}}
	for _, tt := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no connection", func(c *Config) {}},
		{"both", func(c *Config) { c.ConnString, c.ConnConfig = "host=/nonexistent", parsed }},
		{"not from ParseConfig", func(c *Config) { c.ConnConfig = &pgconn.Config{Host: "/nonexistent"} }},
		{"bad connection string", func(c *Config) { c.ConnString = "host='" }},
		{"bad slot", func(c *Config) { c.ConnString, c.Slot = "host=/nonexistent", "Bad" }},
		{"no publication", func(c *Config) { c.ConnString, c.Publications = "host=/nonexistent", nil }},
	} {
		cfg := ok
		tt.mod(&cfg)
		_, err := Connect(context.Background(), cfg)
		if !errors.Is(err, ErrInvalidConfig) || Retryable(err) {
			t.Errorf("%s: %v; want ErrInvalidConfig, not retryable", tt.name, err)
		}
		if _, err := Start(context.Background(), cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Start: %v", tt.name, err)
		}
	}
	c := &Conn{}
	if _, err := c.CreateSlot(context.Background(), ExportSnapshot); !errors.Is(err, ErrClosed) {
		t.Errorf("CreateSlot on a closed Conn: %v", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("Close twice: %v", err)
	}
}

func TestReconnectDelay(t *testing.T) {
	p := ReconnectPolicy{MinDelay: 100 * time.Millisecond, MaxDelay: time.Second}
	var got []time.Duration
	for n := 1; n <= 6; n++ {
		got = append(got, p.delay(n))
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, time.Second, time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("delays %v, want %v", got, want)
	}
	var zero ReconnectPolicy
	if zero.delay(1) != DefaultMinReconnectDelay || zero.delay(100) != DefaultMaxReconnectDelay {
		t.Errorf("default delays %v, %v", zero.delay(1), zero.delay(100))
	}
	second := ReconnectPolicy{MinDelay: time.Second, MaxDelay: time.Second}.backoff()
	for range 1000 {
		if d := second.Delay(1); d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("the delay of 1s with jitter is %v", d)
		}
	}
}
