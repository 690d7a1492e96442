package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
)

// checkDemoOutput checks what every run of the demo prints, live or replayed.
func checkDemoOutput(t *testing.T, out string) {
	t.Helper()
	require.Contains(t, out, "Committed transactions, in commit order")
	require.Regexp(t, `(?m)^  \.\.\. .* in \d+ stream blocks so far; \d+ transactions? open; .* in memory, .* spilled to disk$`, out,
		"progress while the large transaction streams in")
	require.Regexp(t, `(?m)^  xid \d+ +commit [0-9A-F]+/[0-9A-F]+ +streamed  \d+ × insert demo_big$`, out)
	require.Contains(t, out, "Statistics (memory limit ")
	require.Regexp(t, `(?m)^  memory            peak .*, now .*; .* of bookkeeping besides$`, out)
	for _, bad := range regexp.MustCompile(`\b1 (transactions|stream blocks|times|subtransaction aborts)\b`).FindAllString(out, -1) {
		t.Errorf("wrong plural %q in:\n%s", bad, out)
	}
	require.Contains(t, out, "The large transaction arrived whole after its commit")
}

// TestDemoCapture replays the embedded capture; demo itself checks that the large transaction
// arrives whole, with every row kept by its savepoints, and that the capture ends with the marker.
func TestDemoCapture(t *testing.T) {
	for _, wm := range []string{"none", "64kB", "256kB", "64MB"} {
		t.Run(wm, func(t *testing.T) {
			var out bytes.Buffer
			require.NoError(t, demo(context.Background(), &out, []string{"-capture", "-work-mem", wm}))
			checkDemoOutput(t, out.String())
			require.Contains(t, out.String(), "1 aborted", "PostgreSQL 15 streams the rolled-back transaction")
			require.Contains(t, out.String(), "was streamed while it ran, then dropped at its Stream Abort")
			spilled := map[string]string{
				"none":  "spilled           14 transactions, ",
				"64kB":  "spilled           2 transactions, ",
				"256kB": "spilled           1 transaction, ",
				"64MB":  "spilled           0 transactions, 0 times, 0 B",
			}[wm]
			require.Contains(t, out.String(), spilled)
		})
	}
}

// TestDemoNoServer runs the README's first command on a machine without PostgreSQL (hidden by
// PGREORDER_PG_VERSIONS): it replays the capture and says why.
func TestDemoNoServer(t *testing.T) {
	t.Setenv(pgserver.EnvVersions, "99")
	var out bytes.Buffer
	require.NoError(t, demo(context.Background(), &out, nil))
	require.Contains(t, out.String(), "No PostgreSQL server could be started (none installed; install them with")
	require.Contains(t, out.String(), "Replaying the embedded capture")
	checkDemoOutput(t, out.String())
}

// TestDemoLive runs the demo as the README's first command does, on a throwaway server of each
// installed major. It compares the rows received with the table, and the rolled-back large
// transaction must have been streamed and then aborted on every version.
func TestDemoLive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers")
	}
	for _, major := range pgtest.Majors(t) {
		t.Run(strconv.Itoa(major), func(t *testing.T) {
			t.Setenv(pgserver.EnvVersions, strconv.Itoa(major))
			var out bytes.Buffer
			err := demo(context.Background(), &out, []string{"-rows", "300", "-savepoints", "6", "-work-mem", "64kB"})
			require.NoError(t, err, out.String())
			s := out.String()
			require.Contains(t, s, "Starting a throwaway PostgreSQL "+strconv.Itoa(major)+".")
			require.Contains(t, s, "Streaming slot \"demo\"")
			checkDemoOutput(t, s)
			require.Contains(t, s, " committed, 1 aborted, 2 streamed", s)
			require.True(t, strings.Contains(s, "1800 rows received, 1200 in the table") || strings.Contains(s, "1200 rows received, 1200 in the table"), s)
		})
	}
}
