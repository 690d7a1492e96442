package target

import (
	"slices"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// fullTable is a REPLICA IDENTITY FULL table (id int NOT NULL, j json, v text, n int NOT NULL)
// whose target has a unique index on id.
func fullTable() *Table {
	return &Table{Table: detect.Table{Name: `"public"."f"`, Key: []int{0, 1, 2, 3}, Full: true},
		copyCols: `("id", "j", "v", "n")`, insertCols: `("id", "j", "v", "n")`,
		cols: []colMap{{name: `"id"`, typeOID: 23, notNull: true}, {name: `"j"`, typeOID: 114, textEq: true},
			{name: `"v"`, typeOID: 25}, {name: `"n"`, typeOID: 23, notNull: true}}}
}

// TestFullSetStatements: the set statements of a FULL table with a target key name their rows
// by every column of the old row, compared as whereSQL compares them, and write every column;
// a keyed table's name them by the key and write the others (golden).
func TestFullSetStatements(t *testing.T) {
	m := fullTable()
	const origin = " AND <origin>"
	match := `pgr_t."id" = v.pgr_1 AND pgr_t."j"::text IS NOT DISTINCT FROM v.pgr_2::text AND ` +
		`pgr_t."v" IS NOT DISTINCT FROM v.pgr_3 AND pgr_t."n" = v.pgr_4`
	for _, c := range []struct{ name, got, want string }{
		{"delete", setDeleteSQL(m, []int{0}, true, origin),
			`WITH pgr AS (DELETE FROM "public"."f" AS pgr_t USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), ` +
				`pg_catalog.unnest($3), pg_catalog.unnest($4)) AS v(pgr_1, pgr_2, pgr_3, pgr_4) WHERE ` + match + origin +
				` RETURNING 1) SELECT 1 / (pg_catalog.count(*) = pg_catalog.cardinality($1))::int FROM pgr`},
		{"update", setUpdateSQL(m, []int{0}, true, origin),
			`WITH pgr AS (UPDATE "public"."f" AS pgr_t SET "id" = v.pgr_5, "j" = v.pgr_6, "v" = v.pgr_7, "n" = v.pgr_8 ` +
				`FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4), ` +
				`pg_catalog.unnest($5), pg_catalog.unnest($6), pg_catalog.unnest($7), pg_catalog.unnest($8)) ` +
				`AS v(pgr_1, pgr_2, pgr_3, pgr_4, pgr_5, pgr_6, pgr_7, pgr_8) WHERE ` + match + origin +
				` RETURNING 1) SELECT 1 / (pg_catalog.count(*) = pg_catalog.cardinality($1))::int FROM pgr`},
		{"keyed delete", setDeleteSQL(m, []int{0}, false, ""),
			`WITH pgr AS (DELETE FROM "public"."f" AS pgr_t USING ROWS FROM (pg_catalog.unnest($1)) AS v(pgr_1) ` +
				`WHERE pgr_t."id" = v.pgr_1 RETURNING 1) SELECT 1 / (pg_catalog.count(*) = pg_catalog.cardinality($1))::int FROM pgr`},
		{"keyed update", setUpdateSQL(m, []int{0}, false, ""),
			`WITH pgr AS (UPDATE "public"."f" AS pgr_t SET "j" = v.pgr_2, "v" = v.pgr_3, "n" = v.pgr_4 ` +
				`FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4)) ` +
				`AS v(pgr_1, pgr_2, pgr_3, pgr_4) WHERE pgr_t."id" = v.pgr_1 RETURNING 1) ` +
				`SELECT 1 / (pg_catalog.count(*) = pg_catalog.cardinality($1))::int FROM pgr`},
	} {
		if c.got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.name, c.got, c.want)
		}
	}
}

// TestFullKey: a FULL table is keyed by its target's unique index only when that index
// identifies a row for sure.
func TestFullKey(t *testing.T) {
	m := fullTable()
	one := func(cols ...int) *detect.Indexes {
		return &detect.Indexes{Unique: []detect.UniqueIndex{{Name: "u", Cols: cols}}, OnConflict: true, Count: 1}
	}
	for _, c := range []struct {
		name string
		rc   *detect.Indexes
		want []int
	}{
		{"NOT NULL column", one(0), []int{0}},
		{"NOT NULL columns", one(3, 0), []int{3, 0}},
		{"a nullable column", one(0, 2), nil},
		{"a column without equality", func() *detect.Indexes { m.cols[1].notNull = true; return one(1) }(), nil},
		{"two unique indexes", &detect.Indexes{Unique: []detect.UniqueIndex{{Cols: []int{0}}, {Cols: []int{3}}}, OnConflict: true, Count: 2}, nil},
		{"an exclusion constraint besides", &detect.Indexes{Unique: []detect.UniqueIndex{{Cols: []int{0}}}, OnConflict: true, Count: 2}, nil},
		{"an expression or partial index", &detect.Indexes{OnConflict: true, Count: 1}, nil},
		{"deferrable", &detect.Indexes{Unique: []detect.UniqueIndex{{Cols: []int{0}}}, Count: 1}, nil},
		{"no unique index", &detect.Indexes{}, nil},
	} {
		if got := fullKey(m, c.rc); !slices.Equal(got, c.want) {
			t.Errorf("%s: key %v, want %v", c.name, got, c.want)
		}
	}
}

// TestFullHeld: which changes of a FULL table keyed by its target's unique index are held: an
// update or delete must send its whole old row, keep the key, and name the row held.
func TestFullHeld(t *testing.T) {
	txt := func(s string) decoding.Column { return decoding.Column{Kind: decoding.ColumnText, Data: []byte(s)} }
	null := decoding.Column{Kind: decoding.ColumnNull}
	unchanged := decoding.Column{Kind: decoding.ColumnUnchanged}
	row := func(id, v, n string) decoding.Tuple { return decoding.Tuple{txt(id), null, txt(v), txt(n)} }
	m := fullTable()
	nt := &netTable{m: m, keyed: true, key: []int{0}, full: true}
	steps := []struct {
		name     string
		op       byte
		tup, old decoding.Tuple
		oldKind  byte
		want     bool
	}{
		{"insert", 'I', row("1", "a", "1"), nil, 0, true},
		{"update naming another row", 'U', row("1", "b", "1"), row("1", "x", "1"), 'O', false},
		{"update without the old row", 'U', row("1", "b", "1"), nil, 0, false},
		{"update naming the row held", 'U', row("1", "b", "1"), row("1", "a", "1"), 'O', true},
		{"update of the key", 'U', row("2", "b", "1"), row("1", "b", "1"), 'O', false},
		{"update with an unchanged value of the row held", 'U', decoding.Tuple{txt("1"), null, unchanged, txt("2")}, row("1", "b", "1"), 'O', true},
		{"delete naming another row", 'D', nil, row("1", "b", "1"), 'O', false},
		{"delete by key only", 'D', nil, decoding.Tuple{txt("1"), null, null, null}, 'K', false},
		{"delete naming the row held", 'D', nil, row("1", "b", "2"), 'O', true},
		{"update of a row not held, with an unchanged value", 'U', decoding.Tuple{txt("3"), null, unchanged, txt("2")}, row("3", "b", "1"), 'O', false},
		{"update of a row not held", 'U', row("3", "c", "2"), row("3", "b", "1"), 'O', true},
		{"an old row with a value not sent", 'D', nil, decoding.Tuple{txt("4"), null, unchanged, txt("1")}, 'O', false},
	}
	for _, s := range steps {
		if got := nt.add(s.op, s.tup, s.old, s.oldKind, 0); got != s.want {
			t.Errorf("%s: held %v, want %v", s.name, got, s.want)
		}
	}
	// The net rows: key 1 inserted and deleted again (checked absent by its key), key 3 updated,
	// named by its first old row.
	if len(nt.rows) != 2 || nt.rows[0].first != 'I' || nt.rows[0].row != nil ||
		nt.rows[1].first != 'U' || !sameTuple(nt.rows[1].key, row("3", "b", "1")) || !sameTuple(nt.rows[1].row, row("3", "c", "2")) {
		t.Errorf("net rows %+v", nt.rows)
	}
}

// TestCoalesceFullFallbacks: the changes of REPLICA IDENTITY FULL tables are held for set
// statements when the target's unique index identifies a row for sure (a primary key, a unique
// index on NOT NULL columns), and go row by row otherwise (a unique column that may be NULL,
// two unique indexes, a partial one, a deferrable one; without a unique index, inserts are held
// until an update or delete): each table ends as the source's rows.
func TestCoalesceFullFallbacks(t *testing.T) {
	tables := []struct {
		name, ddl string
		held      bool // updates and deletes held
	}{
		{"f_pk", "(id int PRIMARY KEY, v text)", true},
		{"f_unique", "(id int NOT NULL UNIQUE, v text)", true},
		{"f_nullable", "(id int UNIQUE, v text)", false},
		{"f_two", "(id int NOT NULL UNIQUE, v text UNIQUE)", false},
		{"f_partial", "(id int NOT NULL, v text)", false},
		{"f_deferrable", "(id int NOT NULL UNIQUE DEFERRABLE, v text)", false},
		{"f_none", "(id int NOT NULL, v text)", false},
	}
	pgtest.EachMajor(t, pgtest.Majors(t), func(t *testing.T, srv *Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		ddl := []string{"CREATE UNIQUE INDEX ON public.f_partial (id) WHERE id > 0",
			"CREATE TABLE public.progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)"}
		for _, tb := range tables {
			ddl = append([]string{"CREATE TABLE public." + tb.name + " " + tb.ddl}, ddl...)
		}
		pgtest.ExecAll(t, dsn, ddl...)
		c := testConn(ctx, t, dsn, "full", "public.progress", &Counters{})
		reg := NewRegistry()
		txt := func(s string) decoding.Column { return decoding.Column{Kind: decoding.ColumnText, Data: []byte(s)} }
		row := func(id, v string) decoding.Tuple { return decoding.Tuple{txt(id), txt(v)} }
		type step struct {
			m    decoding.Message
			held bool // for a table whose updates and deletes are held
		}
		steps := []step{
			{&decoding.Insert{New: row("1", "a")}, true},
			{&decoding.Insert{New: row("2", "b")}, true},
			{&decoding.Insert{New: row("3", "c")}, true},
			{&decoding.Update{OldKind: 'O', Old: row("1", "a"), New: row("1", "a2")}, true},
			{&decoding.Delete{OldKind: 'O', Old: row("2", "b")}, true},
			{&decoding.Update{OldKind: 'O', Old: row("1", "a2"), New: row("1", "a3")}, true},
		}
		c.Begin(1, nil)
		c.Coalesce(true)
		for i, tb := range tables {
			rel := reg.Intern(&decoding.Relation{RelationID: uint32(i + 1), Namespace: "public", Name: tb.name, ReplicaIdentity: 'f',
				Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}, {Flags: 1, Name: "v", TypeOID: 25}}}, nil)
			m, err := c.Mapping(ctx, rel, OpInsert)
			if err != nil {
				t.Fatal(err)
			}
			for j, s := range steps {
				if err := c.Change(ctx, s.m, []*Relation{rel}); err != nil {
					t.Fatalf("%s: change %d: %v", tb.name, j, err)
				}
				nt := c.co.tables[m]
				held := nt != nil && !nt.rowPath && len(nt.log) > 0
				want := tb.held && s.held
				if tb.name == "f_none" {
					want = j < 3 // inserts, until an update
				}
				if held != want {
					t.Errorf("%s: change %d: held %v, want %v", tb.name, j, held, want)
				}
			}
		}
		if err := c.Commit(ctx, ProgressKey{Slot: "s", System: "1", Timeline: 1}, 100, false); err != nil {
			t.Fatal(err)
		}
		for _, tb := range tables {
			rows, err := Query(ctx, c.PG(), "SELECT string_agg(id || '=' || v, ',' ORDER BY id) FROM public."+tb.name)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(rows[0][0]); got != "1=a3,3=c" {
				t.Errorf("%s: %s, want 1=a3,3=c", tb.name, got)
			}
		}
		if c.setDone != 1 || c.setFallbacks != 0 {
			t.Errorf("set statements succeeded %d times, fell back %d times; want once and never", c.setDone, c.setFallbacks)
		}
	})
}
