package target

import (
	"strings"
	"testing"

	"github.com/pgreorder/pgreorder/internal/configerr"
)

// TestCreateTableSQL: the statement quotes every name (quotes, dots, semicolons and letter case
// kept), writes the types as the target named them, NOT NULL where the source has it and the
// primary key in its order; it is one command.
func TestCreateTableSQL(t *testing.T) {
	for _, c := range []struct {
		def   TableDef
		types []string
		want  string
	}{
		{TableDef{TableName: TableName{Schema: "public", Name: "t"},
			Columns: []ColumnDef{{Name: "id", NotNull: true}, {Name: "v"}}, Key: []string{"id"}},
			[]string{"integer", "numeric(10,2)"},
			`CREATE TABLE "public"."t" ("id" integer NOT NULL, "v" numeric(10,2), PRIMARY KEY ("id"))`},
		{TableDef{TableName: TableName{Schema: `My "Sch"`, Name: "x); DROP TABLE y; --"},
			Columns: []ColumnDef{{Name: `B"`, NotNull: true}, {Name: "a.b", NotNull: true}, {Name: "Tags"}}, Key: []string{"a.b", `B"`}},
			[]string{"text", "timestamp(3) with time zone", "text[]"},
			`CREATE TABLE "My ""Sch"""."x); DROP TABLE y; --" ("B""" text NOT NULL, "a.b" timestamp(3) with time zone NOT NULL, ` +
				`"Tags" text[], PRIMARY KEY ("a.b", "B"""))`},
		{TableDef{TableName: TableName{Schema: "s", Name: "nokey"}, Columns: []ColumnDef{{Name: "a"}}},
			[]string{"public.mood"}, `CREATE TABLE "s"."nokey" ("a" public.mood)`},
		{TableDef{TableName: TableName{Schema: "s", Name: "empty"}}, nil, `CREATE TABLE "s"."empty" ()`},
	} {
		got := createTableSQL(&c.def, c.types)
		if got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
		if strings.Count(got, "CREATE") != 1 {
			t.Errorf("%s: more than one command", got)
		}
	}
}

// TestCreateErrors: the errors name the table, and the schema or the column and its type.
func TestCreateErrors(t *testing.T) {
	e := &CreateError{Table: `"app"."t"`, Schema: "app"}
	if s := e.Error(); !strings.Contains(s, `"app"."t"`) || !strings.Contains(s, `schema "app"`) {
		t.Errorf("schema: %s", s)
	}
	e = &CreateError{Table: `"public"."t"`, Column: "M", Type: "public.mood"}
	if s := e.Error(); !strings.Contains(s, `"public"."t"`) || !strings.Contains(s, `column "M"`) || !strings.Contains(s, "public.mood") {
		t.Errorf("type: %s", s)
	}
	n := (&NoTableError{Table: `"public"."t"`}).Named(func(f configerr.Field) string { return "-" + f.Arg })
	if !strings.Contains(n, `"public"."t"`) || !strings.Contains(n, "-add-columns") {
		t.Errorf("no table: %s", n)
	}
}
