package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// newTablesEnv is a source and a target with schemas of their own: the source publishes every
// table (and, unless copy, has the slot); both have marker.
func newTablesEnv(t *testing.T, major int, copy bool, src, dst []string) *env {
	t.Helper()
	srv := pgtest.Shared(t, major)
	ctx := pgtest.Context(t, time.Minute)
	srcDB, dstDB := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	e := &env{srv: srv, src: srv.ConnString(srcDB), dst: srv.ConnString(dstDB), repl: srv.ReplicationConnString(srcDB), slot: "apply"}
	stmts := append(append([]string{`CREATE TABLE marker (id int PRIMARY KEY)`}, src...), `CREATE PUBLICATION pub FOR ALL TABLES`)
	if !copy {
		stmts = append(stmts, `SELECT pg_create_logical_replication_slot('apply', 'pgoutput')`)
	}
	must(t, pgtest.Exec(ctx, e.src, stmts...))
	must(t, pgtest.Exec(ctx, e.dst, append([]string{`CREATE TABLE marker (id int PRIMARY KEY)`}, dst...)...))
	return e
}

// TestMissingTables checks that a target lacking several published tables stops Run with one
// error naming all of them, before anything is applied or copied: at the start of a session
// that streams, and before the initial copy. Once they exist, Run applies everything.
func TestMissingTables(t *testing.T) {
	src := []string{`CREATE SCHEMA app`, `CREATE TABLE items (id int PRIMARY KEY, v text)`, `CREATE TABLE "Two" (id int PRIMARY KEY)`,
		`CREATE TABLE app.three (id int PRIMARY KEY)`, `CREATE TABLE present (id int PRIMARY KEY)`}
	fix := []string{`CREATE SCHEMA app`, `CREATE TABLE items (id int PRIMARY KEY, v text)`, `CREATE TABLE "Two" (id int PRIMARY KEY)`,
		`CREATE TABLE app.three (id int PRIMARY KEY)`}
	want := []string{`"app"."three"`, `"public"."Two"`, `"public"."items"`}
	for _, major := range testMajors {
		for _, copy := range []bool{false, true} {
			t.Run(fmt.Sprintf("pg%d/copy=%v", major, copy), func(t *testing.T) {
				e := newTablesEnv(t, major, copy, src, []string{`CREATE TABLE present (id int PRIMARY KEY)`})
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO items VALUES (1, 'a')`, `INSERT INTO "Two" VALUES (2)`,
					`INSERT INTO app.three VALUES (3)`, `INSERT INTO present VALUES (4)`, `INSERT INTO marker VALUES (1)`))
				cfg := e.config(t, Buffered)
				cfg.Copy = copy
				a, err := New(cfg)
				must(t, err)
				err = a.Run(ctx)
				var me *MissingTablesError
				if !errors.As(err, &me) || !errors.Is(err, ErrMissingTable) {
					t.Fatalf("Run: %v, want a *MissingTablesError of ErrMissingTable", err)
				}
				t.Logf("error: %v", err)
				var got []string
				for _, m := range me.Tables {
					got = append(got, m.Name)
					if (m.Schema == "app") != (m.Name == `"app"."three"`) {
						t.Errorf("%s: missing schema %q", m.Name, m.Schema)
					}
				}
				if strings.Join(got, " ") != strings.Join(want, " ") || me.Create {
					t.Errorf("missing tables %v (create %v), want %v", got, me.Create, want)
				}
				if msg := err.Error(); !strings.Contains(msg, "Config.SchemaChanges = SchemaAddColumns") || !strings.Contains(msg, `schema "app"`) {
					t.Errorf("the message names neither the option nor the schema: %s", msg)
				}
				if st := a.Stats(); st.Sessions != 1 || st.Txns != 0 || st.InitialCopyRows != 0 {
					t.Errorf("%d sessions, %d transactions, %d rows copied: want 1 and nothing applied", st.Sessions, st.Txns, st.InitialCopyRows)
				}
				if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM present`); n != 0 {
					t.Errorf("%d rows in present, want none before the error", n)
				}
				if copy && e.slotExists(t) {
					t.Error("the copy's slot was left behind")
				}
				must(t, pgtest.Exec(ctx, e.dst, fix...))
				r := start(t, cfg)
				if copy {
					e.waitProgress(t, r) // the marker is in the copy: done only once the progress row is written
				}
				e.waitMarker(t, r, 1)
				r.halt(t)
				e.waitSame(t, "items", `"Two"`, "app.three", "present", "marker")
			})
		}
	}
}

// createdSchema is the source's schema of the tables the target lacks in TestCreateTables.
var createdSchema = []string{
	`CREATE SCHEMA app`,
	`CREATE TABLE "MixedCase" ("Id" int NOT NULL, "Part" text NOT NULL, amount numeric(10,2) NOT NULL, tags text[], ` +
		`at timestamptz, "Note ""q""" varchar(20) DEFAULT 'x', PRIMARY KEY ("Part", "Id"))`,
	`CREATE TABLE app.kids (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, parent int, ` +
		`created timestamptz NOT NULL DEFAULT now(), CHECK (parent > 0))`,
	`CREATE TABLE nokey (a int, b bytea)`,
	`CREATE INDEX ON nokey (a)`,
	// No primary key: the replica identity is a unique index, the target's primary key.
	`CREATE TABLE ri (n int, code text NOT NULL)`,
	`CREATE UNIQUE INDEX ri_code ON ri (code)`,
	`ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_code`,
}

// columnsOf describes a table's columns (name, type, NOT NULL) and primary key, as the catalog of
// the database dsn has them.
func columnsOf(t *testing.T, dsn, table string) string {
	t.Helper()
	return pgtest.QueryText(t, dsn, `SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
		CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum) || ' key (' ||
		coalesce((SELECT string_agg(k.attname, ', ' ORDER BY array_position(i.indkey::int2[], k.attnum)) FROM pg_index i
			JOIN pg_attribute k ON k.attrelid = i.indrelid AND k.attnum = ANY (i.indkey) WHERE i.indrelid = `+
		pgQuoteLiteral(table)+`::regclass AND i.indisprimary), '') || ')'
		FROM pg_attribute a WHERE a.attrelid = `+pgQuoteLiteral(table)+`::regclass AND a.attnum > 0 AND NOT a.attisdropped`)
}

func pgQuoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// TestCreateTables checks Config.SchemaChanges's tables: the published tables the target lacks
// are created from the source's definition (columns, types with their modifiers, NOT NULL, the
// primary key; nothing else), before the initial copy, or at the start of a session that
// streams, or when a table first appears in the stream; the copy and the stream fill them as
// the source has them.
func TestCreateTables(t *testing.T) {
	for _, major := range testMajors {
		for _, c := range []struct {
			copy bool
			mode Mode
		}{{true, Buffered}, {false, Parallel}} {
			t.Run(fmt.Sprintf("pg%d/copy=%v/%s", major, c.copy, c.mode), func(t *testing.T) {
				e := newTablesEnv(t, major, c.copy, createdSchema, []string{`CREATE SCHEMA app`})
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				rows := []string{
					`INSERT INTO "MixedCase" VALUES (1, 'p', 12.5, '{a,"b c"}', '2026-01-02 03:04:05.678+02', 'n1'), ` +
						`(2, 'p', 0.01, NULL, NULL, NULL)`,
					`INSERT INTO app.kids (parent) SELECT g FROM generate_series(1, 50) g`,
					`INSERT INTO nokey VALUES (1, '\x00ff'), (NULL, NULL)`,
					`INSERT INTO ri SELECT g, 'c' || g FROM generate_series(1, 20) g`,
					`INSERT INTO marker VALUES (1)`,
				}
				must(t, pgtest.Exec(ctx, e.src, rows...))
				cfg := e.config(t, c.mode)
				cfg.Copy = c.copy
				cfg.SchemaChanges = SchemaAddColumns
				r := start(t, cfg)
				if c.copy {
					e.waitProgress(t, r) // the copy is done: what follows is streamed
				}
				e.waitMarker(t, r, 1)
				if n := r.a.Stats().TablesCreated; n != 4 {
					t.Fatalf("%d tables created when the session started, want 4", n)
				}
				// Streamed: more rows, an update of the composite key, a table created on the source
				// after the session started (the publication holds every table).
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO "MixedCase" VALUES (3, 'q', 99999999.99, '{}', 'infinity', 'n3')`,
					`UPDATE "MixedCase" SET "Id" = 10, amount = amount + 1 WHERE "Id" = 1`,
					`DELETE FROM app.kids WHERE parent > 45`,
					`UPDATE ri SET code = 'd' || n, n = n + 100 WHERE n <= 5`, `DELETE FROM ri WHERE n > 15`,
					`CREATE TABLE later (id int PRIMARY KEY, "When" timestamptz NOT NULL, n numeric(10,2))`,
					`INSERT INTO later VALUES (1, '2026-05-06 07:08:09+00', 3.14), (2, 'epoch', NULL)`,
					`UPDATE later SET n = 2.72 WHERE id = 2`,
					`INSERT INTO marker VALUES (2)`))
				e.waitMarker(t, r, 2)
				r.halt(t)
				tables := []string{`"MixedCase"`, "app.kids", "nokey", "later", "ri", "marker"}
				e.waitSame(t, tables...)
				if got, want := columnsOf(t, e.dst, "ri"), "n integer, code text not null key (code)"; got != want {
					t.Errorf("ri on the target: %s, want %s", got, want)
				}
				for _, table := range tables[:4] {
					// app.kids's identity column is NOT NULL on both sides, an identity on neither.
					if got, want := columnsOf(t, e.dst, table), columnsOf(t, e.src, table); got != want {
						t.Errorf("%s on the target: %s, want %s", table, got, want)
					}
				}
				// Nothing but the columns, NOT NULL and the primary key: no default, identity,
				// check, other index.
				if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_attrdef`); n != 0 {
					t.Errorf("%d defaults on the target", n)
				}
				if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_attribute WHERE attidentity <> '' OR attgenerated <> ''`); n != 0 {
					t.Errorf("%d identity or generated columns on the target", n)
				}
				if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
					WHERE n.nspname IN ('public', 'app') AND c.contype NOT IN ('p', 'n')`); n != 0 {
					t.Errorf("%d constraints other than primary keys and NOT NULL on the target", n)
				}
				if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
					JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname IN ('public', 'app') AND NOT i.indisprimary`); n != 0 {
					t.Errorf("%d indexes other than primary keys on the target", n)
				}
				// later, first seen in the stream, is copied by a session of its own.
				if st := r.a.Stats(); st.TablesCreated != 5 || (st.InitialCopyRows > 2) != c.copy || st.InitialCopyRows == 0 || st.Sessions < 2 {
					t.Errorf("%d tables created, %d rows copied, %d sessions: want 5 tables, later's rows copied (and the "+
						"initial copy's with the copy), by a second session", st.TablesCreated, st.InitialCopyRows, st.Sessions)
				}
			})
		}
	}
}

// TestCreateTablesRefused checks that tables Config.SchemaChanges cannot create, for a type or
// a schema the target lacks, stop Run with one error naming each table with its type or schema,
// and that none is created then; and that a table that first appears in the stream with such a
// type stops Run the same way, when the session that would copy it starts.
func TestCreateTablesRefused(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			e := newTablesEnv(t, major, false, []string{`CREATE TYPE mood AS ENUM ('sad', 'happy')`, `CREATE SCHEMA app`,
				`CREATE TABLE feel (id int PRIMARY KEY, m mood NOT NULL)`, `CREATE TABLE app.x (id int PRIMARY KEY)`,
				`CREATE TABLE fine (id int PRIMARY KEY)`}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO feel VALUES (1, 'happy')`, `INSERT INTO marker VALUES (1)`))
			cfg := e.config(t, Buffered)
			cfg.SchemaChanges = SchemaAddColumns
			err := Run(ctx, cfg)
			var me *MissingTablesError
			if !errors.As(err, &me) || !errors.Is(err, ErrMissingTable) || !me.Create {
				t.Fatalf("Run: %v, want a *MissingTablesError of tables that cannot be created", err)
			}
			t.Logf("error: %v", err)
			if len(me.Tables) != 2 {
				t.Fatalf("tables %+v, want app.x and feel", me.Tables)
			}
			if m := me.Tables[0]; m.Name != `"app"."x"` || m.Schema != "app" || m.Type != "" {
				t.Errorf("first table %+v, want app.x without its schema", m)
			}
			if m := me.Tables[1]; m.Name != `"public"."feel"` || m.Column != "m" || m.Type != "public.mood" {
				t.Errorf("second table %+v, want feel with column m of type public.mood", m)
			}
			for _, s := range []string{`"public"."feel"`, "public.mood", `column "m"`, `schema "app"`} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the message does not name %s", s)
				}
			}
			if n := pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_class WHERE relname IN ('feel', 'fine', 'x')`); n != 0 {
				t.Errorf("%d of the tables were created", n)
			}

			// Fixed, the tables are created; then a table with a type the target lacks appears in
			// the stream.
			must(t, pgtest.Exec(ctx, e.dst, `CREATE TYPE mood AS ENUM ('sad', 'happy')`, `CREATE SCHEMA app`))
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			must(t, pgtest.Exec(ctx, e.src, `CREATE TYPE color AS ENUM ('red')`, `CREATE TABLE paint (id int PRIMARY KEY, c color)`,
				`INSERT INTO paint VALUES (1, 'red')`))
			select {
			case err = <-r.done:
				r.stop = nil
			case <-ctx.Done():
				t.Fatal("Run did not stop on the table it cannot create")
			}
			// The session that starts to copy it cannot create it.
			if !errors.As(err, &me) || !errors.Is(err, ErrMissingTable) || !me.Create {
				t.Fatalf("Run: %v, want a *MissingTablesError of a table that cannot be created", err)
			}
			t.Logf("error: %v", err)
			if len(me.Tables) != 1 || me.Tables[0].Name != `"public"."paint"` || me.Tables[0].Type != "public.color" {
				t.Errorf("tables %+v, want paint with its type public.color", me.Tables)
			}
			must(t, pgtest.Exec(ctx, e.dst, `CREATE TYPE color AS ENUM ('red')`))
			must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (2)`))
			r = start(t, cfg)
			e.waitMarker(t, r, 2)
			r.halt(t)
			e.waitSame(t, "feel", "app.x", "fine", "paint", "marker")
		})
	}
}

// TestTableAddedToPublication checks a table that first appears in the stream (added to the
// publication after the session started) and that the target lacks, without
// Config.SchemaChanges. By default the session starts over to copy it, and the new session stops
// Run with a *MissingTablesError naming it; with NewTablesStream, Run stops at its first change
// with an *ApplyError of ErrMissingTable naming the table, the change, the transaction and the
// option. Nothing from that transaction on is acknowledged, and once the table exists a new Run
// applies it (copied, by default).
func TestTableAddedToPublication(t *testing.T) {
	for _, major := range testMajors {
		for _, nt := range []changefeed.NewTables{changefeed.NewTablesCopy, changefeed.NewTablesStream} {
			t.Run(fmt.Sprintf("%d/%s", major, nt), func(t *testing.T) {
				e := newTablesEnv(t, major, false, []string{`CREATE TABLE a (id int PRIMARY KEY)`}, []string{`CREATE TABLE a (id int PRIMARY KEY)`})
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cfg := e.config(t, Buffered)
				cfg.NewTables = nt
				r := start(t, cfg)
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
				e.waitMarker(t, r, 1)
				before := e.confirmed(t)
				must(t, pgtest.Exec(ctx, e.src, `CREATE TABLE b (id int PRIMARY KEY, v text)`, `INSERT INTO b VALUES (1, 'x')`,
					`INSERT INTO marker VALUES (2)`))
				var err error
				select {
				case err = <-r.done:
					r.stop = nil
				case <-ctx.Done():
					t.Fatal("Run did not stop on the missing table")
				}
				t.Logf("error: %v", err)
				if !strings.Contains(err.Error(), "Config.SchemaChanges = SchemaAddColumns") {
					t.Errorf("the message does not name the option")
				}
				if nt == changefeed.NewTablesCopy {
					var me *MissingTablesError
					if !errors.As(err, &me) || !errors.Is(err, ErrMissingTable) || len(me.Tables) != 1 || me.Tables[0].Name != `"public"."b"` {
						t.Fatalf("Run: %v, want a *MissingTablesError naming b", err)
					}
					if confirmed := e.confirmed(t); confirmed != before {
						t.Errorf("the slot confirmed %s, was at %s before b's transaction", confirmed, before)
					}
				} else {
					var ae *ApplyError
					if !errors.As(err, &ae) || !errors.Is(err, ErrMissingTable) {
						t.Fatalf("Run: %v, want an *ApplyError of ErrMissingTable", err)
					}
					if ae.Relation != `"public"."b"` || ae.Op != OpInsert || ae.Xid == 0 || ae.CommitLSN == 0 {
						t.Errorf("error fields: relation %s, op %s, xid %d, commit %s", ae.Relation, ae.Op, ae.Xid, ae.CommitLSN)
					}
					if confirmed := e.confirmed(t); confirmed > ae.CommitLSN {
						t.Errorf("the slot confirmed %s, past the failed commit %s", confirmed, ae.CommitLSN)
					}
				}
				must(t, pgtest.Exec(ctx, e.dst, `CREATE TABLE b (id int PRIMARY KEY, v text)`))
				r = start(t, cfg)
				e.waitMarker(t, r, 2)
				r.halt(t)
				e.waitSame(t, "a", "b", "marker")
				if copied := r.a.Stats().InitialCopyRows; (copied == 1) != (nt == changefeed.NewTablesCopy) {
					t.Errorf("%d rows copied", copied)
				}
			})
		}
	}
}
