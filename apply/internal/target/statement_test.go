package target

import (
	"strings"
	"testing"
)

// TestColumnAt: a position the server reports in a generated statement names a column only when
// it points at the column's name or just after it.
func TestColumnAt(t *testing.T) {
	m := &Table{cols: []colMap{{name: `"a"`}, {name: `"b"`}, {name: `"ab"`}}}
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
