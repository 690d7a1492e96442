package target

import (
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// TestNames: configured names parse as the server reads them, and quote back to the same
// names.
func TestNames(t *testing.T) {
	for _, c := range []struct {
		in    string
		parts []string // nil: refused
		quote string
	}{
		{"progress", []string{"progress"}, `"progress"`},
		{"Public.Progress", []string{"public", "progress"}, `"public"."progress"`},
		{`"My ""Sch""".t`, []string{`My "Sch"`, "t"}, `"My ""Sch"""."t"`},
		{`"a.b"`, []string{"a.b"}, `"a.b"`},
		{`"unterminated`, nil, ""},
		{"a..b", nil, ""},
		{"a.b.c", nil, ""},
		{"a.", nil, ""},
		{`""`, nil, ""},
		{"", nil, ""},
	} {
		parts, err := ParseQualified(c.in)
		if c.parts == nil {
			if err == nil {
				t.Errorf("%q: parsed as %q", c.in, parts)
			}
			continue
		}
		if err != nil || !slices.Equal(parts, c.parts) {
			t.Errorf("%q: %q, %v; want %q", c.in, parts, err, c.parts)
			continue
		}
		if q := pgsession.QuoteQualified(parts...); q != c.quote {
			t.Errorf("%q: quoted %s, want %s", c.in, q, c.quote)
		}
	}
}

func testTable() *Table {
	m := &Table{Table: detect.Table{Name: `"public"."t"`, Key: []int{0}}, copyCols: `("id", "j", "v")`,
		insertCols: `("id", "j", "v")`, cols: []colMap{{name: `"id"`, typeOID: 23}, {name: `"j"`, typeOID: 114, textEq: true}, {name: `"v"`, typeOID: 25}}}
	return m
}

// TestStatements: the statements built for each shape of change (golden).
func TestStatements(t *testing.T) {
	m := testTable()
	cond, oids := whereSQL(nil, m, []byte{1}, false, 3, nil)
	if string(cond) != `"id" = $3` || !slices.Equal(oids, []uint32{23}) {
		t.Errorf("key condition %s %v", cond, oids)
	}
	if cond, _ := whereSQL(nil, m, []byte{2}, false, 1, nil); string(cond) != `"id" IS NULL` {
		t.Errorf("NULL key condition %s", cond)
	}
	// FULL: every column sent, a type without equality compared as text, NULL matching NULL.
	m.Full = true
	cond, oids = whereSQL(nil, m, []byte{1, 1, 1}, true, 1, nil)
	want := `("id" = $1 OR ("id" IS NULL AND $1 IS NULL)) AND ("j"::text = $2::text OR ("j" IS NULL AND $2 IS NULL)) AND ` +
		`("v" = $3 OR ("v" IS NULL AND $3 IS NULL))`
	if string(cond) != want || !slices.Equal(oids, []uint32{23, 114, 25}) {
		t.Errorf("full condition\n got %s %v\nwant %s", cond, oids, want)
	}
	// Columns NOT NULL on the target are compared with "=" alone.
	m.cols[0].notNull, m.cols[1].notNull = true, true
	cond, _ = whereSQL(nil, m, []byte{1, 1, 1}, true, 1, nil)
	want = `"id" = $1 AND "j"::text = $2::text AND ("v" = $3 OR ("v" IS NULL AND $3 IS NULL))`
	if string(cond) != want {
		t.Errorf("full condition, NOT NULL columns\n got %s\nwant %s", cond, want)
	}
	m.cols[0].notNull, m.cols[1].notNull = false, false
	if got := string(rowTarget(m, []byte("c"))); got != `WHERE ctid = (SELECT ctid FROM "public"."t" WHERE c LIMIT 1)` {
		t.Errorf("row target %s", got)
	}
	m.Partitioned = true
	if got := string(rowTarget(m, []byte("c"))); got != `WHERE (tableoid, ctid) = (SELECT tableoid, ctid FROM "public"."t" WHERE c LIMIT 1)` {
		t.Errorf("partitioned row target %s", got)
	}
	m.Partitioned, m.Full = false, false
	tg := &Conn{}
	if got := tg.insertSQL(m); got != `INSERT INTO "public"."t" ("id", "j", "v") VALUES ($1, $2, $3)` {
		t.Errorf("insert %s", got)
	}
	m.insertCols = `("id", "j", "v") OVERRIDING SYSTEM VALUE` // a GENERATED ALWAYS AS IDENTITY column
	if got := tg.insertSQL(m); got != `INSERT INTO "public"."t" ("id", "j", "v") OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3)` {
		t.Errorf("insert into an identity column %s", got)
	}
	m.insertCols = m.copyCols
	// Parameters carry columns: an UPDATE's SET list, then its key.
	if got := paramCols(m, "U\x00\x01\x01\x01"); !slices.Equal(got, []int{1, 2, 0}) {
		t.Errorf("update parameters carry columns %v", got)
	}
	if got := paramCols(m, "D\x02"); len(got) != 0 {
		t.Errorf("delete by a NULL key: parameters carry columns %v", got)
	}
}

// TestRefusedValues: where the server says which value it refused, the error names the column.
func TestRefusedValues(t *testing.T) {
	for _, c := range []struct {
		e    pgconn.PgError
		want int
	}{
		{pgconn.PgError{Where: "unnamed portal parameter $2 = '...'"}, 2},
		{pgconn.PgError{Message: "incorrect binary data format in bind parameter 3"}, 3},
		{pgconn.PgError{Message: "no parameter"}, 0},
	} {
		if got := paramOf(&c.e); got != c.want {
			t.Errorf("%+v: parameter %d, want %d", c.e, got, c.want)
		}
	}
	m := &Table{info: &Relation{Rel: &decoding.Relation{Columns: []decoding.RelationColumn{{Name: "v"}, {Name: "vv"}}}}}
	for where, want := range map[string]int{"COPY t, line 3, column vv: \"x\"": 1, "COPY t, line 3, column v": 0,
		"COPY t, line 3": -1, "SQL function": -1} {
		if got := copyColumn(m, where); got != want {
			t.Errorf("%q: column %d, want %d", where, got, want)
		}
	}
	for code, want := range map[string]Kind{"42P01": KindMissingTable, "42703": KindSchemaMismatch, "42501": KindPermission,
		"23505": KindConstraint, "22P02": KindData, "40001": KindNone} {
		if got := kindOf(&pgconn.PgError{Code: code}); got != want {
			t.Errorf("SQLSTATE %s: %v, want %v", code, got, want)
		}
	}
	if kindOf(errors.New("not from the server")) != KindNone {
		t.Error("an error not from the server has a kind")
	}
	// A refused change names its statement and relation; a lost connection is itself.
	err := StatementError(OpInsert, &pgconn.PgError{Code: "23505", Message: "duplicate key"})
	var ce *ChangeError
	if !errors.As(err, &ce) || ce.Kind != KindConstraint || ce.Op != OpInsert {
		t.Errorf("refused: %#v", err)
	}
	if err := StatementError(OpInsert, &pgconn.PgError{Code: "40P01"}); errors.As(err, &ce) {
		t.Errorf("a deadlock is a refused change: %v", err)
	}
	lost := errors.New("connection reset")
	if err := StatementError(OpUpdate, lost); err != lost {
		t.Errorf("a lost connection is %v", err)
	}
}
