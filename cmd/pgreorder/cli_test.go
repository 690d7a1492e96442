package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDSNRedacted: a connection string that does not parse is printed without its password,
// however the password is written.
func TestDSNRedacted(t *testing.T) {
	dsns := map[string][]string{
		"host=/nonexistent password = TopSecret8 port=abc":       {"TopSecret8"},
		`host=/nonexistent password='Top\'Secret9 x' port=abc`:   {"Secret9", "Top"},
		"postgres://u:TopSecret7@localhost:abc/db":               {"TopSecret7"},
		"postgres://u@localhost:abc/db?password=TopSecret6":      {"TopSecret6"},
		"host=/nonexistent sslpassword = 'Top Secret5' port=abc": {"Top Secret5", "Secret5"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for dsn, secrets := range dsns {
		for name, run := range map[string]func() error{
			"stream": func() error {
				return runStream(ctx, []string{"-dsn", dsn, "-slot", "s", "-publication", "p", "-progress", "0"})
			},
			"apply": func() error {
				return runApply(ctx, []string{"-source", "host=/nonexistent", "-target", dsn, "-slot", "s", "-publication", "p"})
			},
			"record": func() error { return runRecord(ctx, []string{"-dsn", dsn, "-o", t.TempDir(), writeWorkload(t)}) },
		} {
			err := run()
			require.Error(t, err, "%s %s", name, dsn)
			require.Contains(t, err.Error(), "xxxxx", "%s %s", name, dsn)
			for _, s := range secrets {
				require.NotContains(t, err.Error(), s, "%s %s", name, dsn)
			}
		}
	}
	for _, usage := range []string{streamUsage, applyUsage} {
		require.Contains(t, usage, "PGPASSWORD")
		require.Contains(t, usage, "password file")
	}
}
