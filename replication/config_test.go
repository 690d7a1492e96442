package replication

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
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
		stream  string
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
			c.Binary, c.Messages, c.TwoPhase, c.Origin = true, true, true, "NONE"
			c.Publications = []string{"a", `we"ird'one`}
		}), 18, 4, StreamingParallel,
			`proto_version '4', publication_names '"a","we""ird''one"', streaming 'parallel', binary 'true', messages 'true', two_phase 'true', origin 'none'`, nil},
		{"pg15 parallel", base(func(c *Config) { c.Streaming = StreamingParallel }), 15, 0, "", "", ErrUnsupported},
		{"pg15 proto 4", base(func(c *Config) { c.ProtoVersion = 4 }), 15, 0, "", "", ErrUnsupported},
		{"pg14 two-phase", base(func(c *Config) { c.TwoPhase = true }), 14, 0, "", "", ErrUnsupported},
		{"pg15 origin", base(func(c *Config) { c.Origin = "none" }), 15, 0, "", "", ErrUnsupported},
		{"proto 1 streaming on", base(func(c *Config) { c.ProtoVersion = 1; c.Streaming = StreamingOn }), 18, 0, "", "", ErrUnsupported},
		{"bad streaming", base(func(c *Config) { c.Streaming = "yes" }), 18, 0, "", "", ErrInvalidConfig},
		{"bad proto", base(func(c *Config) { c.ProtoVersion = 5 }), 18, 0, "", "", ErrInvalidConfig},
		{"bad origin", base(func(c *Config) { c.Origin = "some" }), 18, 0, "", "", ErrInvalidConfig},
		{"bad slot", base(func(c *Config) { c.Slot = "Bad-Slot" }), 18, 0, "", "", ErrInvalidConfig},
		{"no slot", base(func(c *Config) { c.Slot = "" }), 18, 0, "", "", ErrInvalidConfig},
		{"no publication", base(func(c *Config) { c.Publications = nil }), 18, 0, "", "", ErrInvalidConfig},
		{"empty publication", base(func(c *Config) { c.Publications = []string{""} }), 18, 0, "", "", ErrInvalidConfig},
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
