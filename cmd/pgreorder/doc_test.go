package main

import (
	"bytes"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// logKeys returns the keys of a logfmt line, after time, level and msg.
func logKeys(line string) []string {
	var keys []string
	for _, m := range regexp.MustCompile(`(?:^| )([a-z_]+)=`).FindAllStringSubmatch(line, -1) {
		if k := m[1]; k != "time" && k != "level" && k != "msg" {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestTryItDoc: docs/try-it.md shows what stream prints (its final lines with their keys, in
// order, and the progress line), and runs psql from PATH: the server builds of 16 to 18 it
// points to have none.
func TestTryItDoc(t *testing.T) {
	b, err := os.ReadFile("../../docs/try-it.md")
	require.NoError(t, err)
	doc := string(b)
	require.False(t, strings.Contains(doc, "$PGBIN/psql"), "$PGBIN/psql: the npm builds have no psql")

	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	log.Info("progress", streamStatsAttrs(reorderbuffer.Stats{}, replication.Progress{}, 0)...)
	want := logKeys(buf.String())

	var final []string // msg of each sample log line, in order
	for line := range strings.Lines(doc) {
		m := regexp.MustCompile(`^time=\S+ level=INFO msg=(\S+)`).FindStringSubmatch(line)
		if m == nil {
			continue
		}
		switch m[1] {
		case "progress":
			require.Equal(t, want, logKeys(line), "the progress line's keys")
		case "stopped":
			require.Equal(t, []string{"acked"}, logKeys(line), "the stopped line's keys")
		}
		final = append(final, m[1])
	}
	i := slices.Index(final, "closed")
	require.True(t, i >= 0 && slices.Equal(final[i:min(i+3, len(final))], []string{"closed", "progress", "stopped"}),
		"the last lines as stream prints them: %v", final)
	require.Regexp(t, `(?m)^\d\d:\d\d:\d\d received \d+ txns, .* \| acked \d+ \| lag `, doc, "the periodic progress line")
}
