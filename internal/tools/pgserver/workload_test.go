package pgserver_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
)

func TestParseWorkload(t *testing.T) {
	type step struct{ session, sql string }
	tests := []struct {
		name     string
		text     string
		setup    []step
		workload []step
		err      bool
	}{
		{name: "empty", text: "  \n-- nothing\n"},
		{name: "no sections", text: "SELECT 1; SELECT 2", workload: []step{{"1", "SELECT 1"}, {"1", "SELECT 2"}}},
		{
			name:     "sections",
			text:     "CREATE TABLE a(x int);\n-- setup\nCREATE TABLE b(x int);\n-- workload\nINSERT INTO a VALUES (1);\n",
			setup:    []step{{"1", "CREATE TABLE a(x int)"}, {"1", "CREATE TABLE b(x int)"}},
			workload: []step{{"1", "INSERT INTO a VALUES (1)"}},
		},
		{
			name:     "sessions",
			text:     "-- session a\nBEGIN;\n  --   session b  \nBEGIN; COMMIT;\n-- session a\nCOMMIT;",
			workload: []step{{"a", "BEGIN"}, {"b", "BEGIN"}, {"b", "COMMIT"}, {"a", "COMMIT"}},
		},
		{
			name:     "quotes",
			text:     `SELECT 'a;b''c', "x;""y", E'\';', $$;$$, $f$ $$ ; $f$, $1, a$b; SELECT 2`,
			workload: []step{{"1", `SELECT 'a;b''c', "x;""y", E'\';', $$;$$, $f$ $$ ; $f$, $1, a$b`}, {"1", "SELECT 2"}},
		},
		{
			name:     "comments",
			text:     "SELECT 1 -- no; split\n/* ; /* nested ; */ */ + 1;\n;;",
			workload: []step{{"1", "SELECT 1 -- no; split\n/* ; /* nested ; */ */ + 1"}},
		},
		{
			name:     "directive inside a statement is text",
			text:     "SELECT 1\n-- session b\n;",
			workload: []step{{"1", "SELECT 1\n-- session b"}},
		},
		{name: "setup without workload", text: "-- setup\nSELECT 1;", err: true},
		{name: "two workloads", text: "-- workload\n-- workload\n", err: true},
		{name: "setup after workload", text: "-- workload\n-- setup\n", err: true},
		{name: "open quote", text: "SELECT 'x", err: true},
		{name: "open dollar quote", text: "SELECT $q$x$$", err: true},
		{name: "open comment", text: "SELECT /* x", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := pgserver.ParseWorkload(tt.text)
			if tt.err {
				require.ErrorIs(t, err, pgserver.ErrWorkload)
				return
			}
			require.NoError(t, err)
			conv := func(steps []pgserver.Step) []step {
				var out []step
				for _, s := range steps {
					out = append(out, step{s.Session, s.SQL})
				}
				return out
			}
			require.Equal(t, tt.setup, conv(w.Setup))
			require.Equal(t, tt.workload, conv(w.Workload))
		})
	}
}

func TestParseWorkloadLines(t *testing.T) {
	w, err := pgserver.ParseWorkload("-- setup\n\nCREATE TABLE t(x text);\n-- workload\nINSERT INTO t\nVALUES ('a\nb');  INSERT INTO t VALUES ($$\n$$);\n\n  SELECT 1;")
	require.NoError(t, err)
	require.Equal(t, 3, w.Setup[0].Line)
	var lines []int
	for _, s := range w.Workload {
		lines = append(lines, s.Line)
	}
	require.Equal(t, []int{5, 7, 10}, lines)
}

func ExampleParseWorkload() {
	w, err := pgserver.ParseWorkload(`
-- setup
CREATE TABLE t (id int);
-- workload
-- session a
BEGIN; INSERT INTO t VALUES (1);
-- session b
INSERT INTO t VALUES (2);
-- session a
COMMIT;
`)
	if err != nil {
		panic(err)
	}
	for _, s := range w.Setup {
		fmt.Printf("setup     %s: %s\n", s.Session, s.SQL)
	}
	for _, s := range w.Workload {
		fmt.Printf("workload  %s: %s\n", s.Session, s.SQL)
	}
	// Output:
	// setup     1: CREATE TABLE t (id int)
	// workload  a: BEGIN
	// workload  a: INSERT INTO t VALUES (1)
	// workload  b: INSERT INTO t VALUES (2)
	// workload  a: COMMIT
}
