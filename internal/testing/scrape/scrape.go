// Package scrape reads a Prometheus metrics endpoint in tests: Get fetches it and returns every
// sample of the text exposition format by its name and labels as printed, such as
// pgreorder_wal_position_bytes{position="received"}. Get fails the test on a response other
// than 200 or a line that is not a sample; Parse returns an error. It is test machinery: nothing
// shipped imports it.
package scrape

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Get fetches url and returns its samples.
func Get(ctx context.Context, t testing.TB, url string) map[string]float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	v, err := Parse(string(body))
	require.NoError(t, err)
	return v
}

// Parse returns the samples of text, in the text exposition format.
func Parse(text string) (map[string]float64, error) {
	out := map[string]float64{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i <= 0 {
			return nil, fmt.Errorf("not a sample: %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("sample %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, nil
}
