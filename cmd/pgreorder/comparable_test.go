package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// comparable reduces the txn format's output (format.Writer) to what a streamed and a non-streamed reading of the
// same changes must agree on, one line per transaction: it leaves out transactions with no
// changes (the server sends nothing for them with streaming off, a Stream Commit with it on) and
// the gid (a two-phase reading names what a plain reading sees as an ordinary commit). Lines are
// re-encoded with sorted keys, so they compare as strings.
func comparable(out string) ([]string, error) {
	var txns []string
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		var o map[string]any
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			return nil, fmt.Errorf("comparable: %w: %s", err, line)
		}
		if ch, ok := o["changes"].([]any); ok && len(ch) == 0 {
			continue
		}
		delete(o, "gid")
		b, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		txns = append(txns, string(b))
	}
	return txns, nil
}
