package apply

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestRefusedChangeNames makes the target refuse changes: values its column types cannot read
// (through INSERT, COPY and UPDATE statements, text and binary), a statement it cannot prepare,
// and a conflict resolved as an error. The error names the source transaction, its commit LSN,
// the relation and the column, and shows none of the statements the Applier generates; the
// conflict's names the resolution that gets past it.
func TestRefusedChangeNames(t *testing.T) {
	cases := []struct {
		name    string
		target  []string // besides the source's schema
		binary  bool
		remote  []string
		want    []string
		kind    error
		wantCol bool
	}{
		{name: "insert", remote: []string{`INSERT INTO e VALUES (1, 'ab', 'x')`},
			want: []string{`INSERT "public"."e"`, `column "c" (integer)`, `invalid input syntax for type integer`}, kind: ErrData},
		{name: "too_long", remote: []string{`INSERT INTO e VALUES (1, 'abcdéf', '1')`},
			want: []string{`INSERT "public"."e"`, `column "b" (character varying(3))`, `value too long`}, kind: ErrData},
		{name: "copy", remote: []string{`INSERT INTO e SELECT g, 'ab', CASE WHEN g = 3 THEN 'x' ELSE g::text END FROM generate_series(1, 6) g`},
			want: []string{`INSERT "public"."e"`, `column "c" (integer)`, `invalid input syntax for type integer`}, kind: ErrData},
		{name: "update", remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`, `UPDATE e SET c = 'y' WHERE id = 1`},
			want: []string{`UPDATE "public"."e"`, `column "c" (integer)`, `invalid input syntax for type integer`}, kind: ErrData},
		{name: "binary", binary: true, target: []string{`DROP TABLE e`, `CREATE TABLE e (id int PRIMARY KEY, b text, c int)`},
			remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`},
			want:   []string{`INSERT "public"."e"`, `column "c"`}, kind: ErrSchemaMismatch},
		{name: "prepare", target: []string{`CREATE RULE e_nothing AS ON UPDATE TO e DO INSTEAD NOTHING`},
			remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`},
			want:   []string{`INSERT "public"."e"`, `cannot be used with table that has INSERT or UPDATE rules`}},
		{name: "conflict", target: []string{`INSERT INTO e VALUES (1, 'xy', 2)`}, remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`},
			want: []string{`conflict=insert_exists`, `set Config.Conflicts.Resolutions[conflict.InsertExists] to conflict.ApplyRemote (or conflict.Skip) to get past it`},
			kind: ErrConflict},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := fullEnv(t, testMajors[len(testMajors)-1], "refused", []string{`CREATE TABLE e (id int PRIMARY KEY, b text, c text)`})
			execOn(t, e.dst, `DROP TABLE e`, `CREATE TABLE e (id int PRIMARY KEY, b varchar(3), c int)`)
			if len(c.target) > 0 {
				execOn(t, e.dst, c.target...)
			}
			execOn(t, e.src, c.remote...)
			cfg := e.config(t, Buffered)
			cfg.Binary = c.binary
			r := start(t, cfg)
			err := r.stopped(t)
			var ae *ApplyError
			if !errors.As(err, &ae) {
				t.Fatalf("Run: %v, want an *ApplyError", err)
			}
			msg := err.Error()
			t.Logf("%s", msg)
			if c.kind != nil && !errors.Is(err, c.kind) {
				t.Errorf("Run: %v, want an error wrapping %v", err, c.kind)
			}
			want := append([]string{fmt.Sprintf("source transaction %d (commit %s,", ae.Xid, ae.CommitLSN)}, c.want...)
			if ae.Xid == 0 || ae.CommitLSN == 0 {
				t.Errorf("xid %d, commit LSN %s", ae.Xid, ae.CommitLSN)
			}
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("the error lacks %q", w)
				}
			}
			for _, no := range []string{"WITH pgr", "set_config", "INSERT INTO", "UPDATE \"public\".\"e\" SET", "$1", "preparing"} {
				if strings.Contains(msg, no) {
					t.Errorf("the error shows the generated statement (%q)", no)
				}
			}
		})
	}
}

// TestColumnAt: a position the server reports in a generated statement names a column only when
// it points at the column's name or just after it.
func TestColumnAt(t *testing.T) {
	m := &relMap{cols: []colMap{{name: `"a"`}, {name: `"b"`}, {name: `"ab"`}}}
	sql := `UPDATE "public"."t" SET "b" = $1 WHERE ("a" = $2 OR ("a" IS NULL AND $2 IS NULL)) AND ("ab" = $3)`
	for _, c := range []struct {
		at   string // the text the position points at, first occurrence
		want int
	}{
		{`"b" = $1`, 1}, {`= $1`, 1}, {`$1`, 1}, {`= $2`, 0}, {`"ab"`, 2}, {`= $3`, 2}, {`WHERE`, -1}, {`UPDATE`, -1},
	} {
		pos := strings.Index(sql, c.at) + 1
		if got := columnAt(m, sql, pos); got != c.want {
			t.Errorf("position %d (%s): column %d, want %d", pos, c.at, got, c.want)
		}
	}
}
