package initcopy

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestBlocked: the source is blocked only when commits wait for a synchronous standby and none
// streams; what the check cannot read is an error, never a verdict.
func TestBlocked(t *testing.T) {
	row := func(cells ...string) [][][]byte {
		r := make([][]byte, len(cells))
		for i, c := range cells {
			r[i] = []byte(c)
		}
		return [][][]byte{r}
	}
	for _, tc := range []struct {
		name    string
		rows    [][][]byte
		blocked bool
		err     bool
	}{
		{"nothing waits", row("0", "0", "s1"), false, false},
		{"waits, a standby streams", row("3", "1", "s1"), false, false},
		{"waits, none streams", row("2", "0", "FIRST 1 (s1, s2)"), true, false},
		{"no row", nil, false, true},
		{"not a number", row("x", "0", ""), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := blocked(context.Background(), func(context.Context, string) ([][][]byte, error) { return tc.rows, nil })
			if (err != nil) != tc.err || (e != nil) != tc.blocked {
				t.Fatalf("blocked: %v, %v; want blocked %v, error %v", e, err, tc.blocked, tc.err)
			}
			if e == nil {
				return
			}
			e.Tables = "public.t"
			msg := e.Error()
			if !errors.Is(e, ErrBlocked) || e.Retryable() || !strings.Contains(msg, `synchronous_standby_names = "FIRST 1 (s1, s2)"`) ||
				!strings.Contains(msg, "public.t") || !strings.Contains(msg, "2 of them") {
				t.Errorf("error %q: want ErrBlocked, not retryable, naming the tables, the waiting commits and the setting", msg)
			}
		})
	}
}
