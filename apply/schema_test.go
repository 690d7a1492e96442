package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// columnTypes returns table's columns with their types, as format_type names them, in order.
func columnTypes(t *testing.T, dsn, table string) string {
	t.Helper()
	rows := queryAll(t, dsn, `SELECT attname || ' ' || pg_catalog.format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attname`, table)
	return strings.Join(rows, ", ")
}

// schemaTypes are created on both sides: the columns the source adds use them.
var schemaTypes = []string{
	`CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')`,
	`CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
	`CREATE TABLE s (id int PRIMARY KEY, v text)`,
	`CREATE TABLE marker (id int PRIMARY KEY)`,
}

// TestSchemaAddColumns adds columns on the source mid-stream, of types that need their typmod,
// arrays, an enum and a domain: with a change in the same transaction, alone (the next change
// brings the column), and inside a streamed transaction applied while it runs (Eager). Each must
// arrive on the target with the source's type, and every row with its values.
func TestSchemaAddColumns(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Eager, Parallel} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := fullEnv(t, major, "schema", schemaTypes)
				cfg := e.config(t, mode)
				cfg.SchemaChanges = SchemaAddColumns
				r := start(t, cfg)
				pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 'a')`,
					// With a change in the same transaction.
					`BEGIN; ALTER TABLE s ADD COLUMN n numeric(10,2), ADD COLUMN vc varchar(20); INSERT INTO s VALUES (2, 'b', 12.5, 'x'); COMMIT`,
					// Alone; the change comes later.
					`ALTER TABLE s ADD COLUMN ts timestamptz(3), ADD COLUMN arr int[], ADD COLUMN m mood, ADD COLUMN p posint, ADD COLUMN "Odd ""name""" text`,
					`INSERT INTO marker VALUES (0)`,
					`UPDATE s SET ts = '2026-01-02 03:04:05.678+00', arr = '{1,NULL,3}', m = 'happy', p = 7, "Odd ""name""" = 'q' WHERE id = 1`,
					`INSERT INTO marker VALUES (1)`)
				e.waitMarker(t, r, 1)
				// In a streamed transaction, between its changes.
				pgtest.ExecAll(t, e.src, `BEGIN; INSERT INTO s SELECT g, repeat('x', 200) FROM generate_series(10, 1500) g;
					ALTER TABLE s ADD COLUMN late bigint[]; INSERT INTO s (id, late) SELECT g, ARRAY[g] FROM generate_series(2000, 3500) g; COMMIT`,
					`INSERT INTO marker VALUES (2)`)
				e.waitMarker(t, r, 2)
				st := r.a.Stats()
				r.halt(t)
				if got, want := columnTypes(t, e.dst, "s"), columnTypes(t, e.src, "s"); got != want {
					t.Errorf("target columns\n%s\nwant the source's\n%s", got, want)
				}
				e.sameRows(t, "s")
				if st.ColumnsAdded != 8 {
					t.Errorf("Stats.ColumnsAdded %d, want 8", st.ColumnsAdded)
				}
			})
		}
	}
}

// TestSchemaMissingColumn stops, without SchemaAddColumns, on a column the source added, with an
// error that names the table, the column and the option (and no generated SQL); a restart with
// the option then applies everything, nothing lost or repeated. A column dropped on the source
// is reported and stays on the target; a type the target lacks is a clear error.
func TestSchemaMissingColumn(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := fullEnv(t, major, "schemamiss", schemaTypes)
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 'a')`, `ALTER TABLE s ADD COLUMN c int`,
				`INSERT INTO s VALUES (2, 'b', 2)`, `UPDATE s SET c = 1 WHERE id = 1`)
			cfg := e.config(t, Buffered)
			err := start(t, cfg).stopped(t)
			var ae *ApplyError
			if !errors.As(err, &ae) || !errors.Is(err, ErrSchemaMismatch) {
				t.Fatalf("Run: %v, want an *ApplyError wrapping ErrSchemaMismatch", err)
			}
			msg := err.Error()
			t.Logf("%s", msg)
			for _, w := range []string{`"public"."s"`, `column "c"`, "Config.SchemaChanges = SchemaAddColumns", "Config.SkipLSN = " + ae.CommitLSN.String()} {
				if !strings.Contains(msg, w) {
					t.Errorf("the error lacks %q", w)
				}
			}
			for _, no := range []string{"INSERT INTO", "$1", "COPY "} {
				if strings.Contains(msg, no) {
					t.Errorf("the error shows generated SQL (%q)", no)
				}
			}

			cfg.SchemaChanges = SchemaAddColumns
			r := start(t, cfg)
			pgtest.ExecAll(t, e.src, `ALTER TABLE s DROP COLUMN v`, `INSERT INTO s VALUES (3, 3)`, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			st := r.a.Stats()
			if st.ColumnsAdded != 1 || st.SourceColumnsGone != 1 {
				t.Errorf("Stats.ColumnsAdded %d, SourceColumnsGone %d, want 1 and 1", st.ColumnsAdded, st.SourceColumnsGone)
			}
			if got := queryAll(t, e.dst, `SELECT format('%s %s %s', id, coalesce(v, '-'), coalesce(c::text, '-')) FROM s ORDER BY id`); strings.Join(got, ",") != "1 a 1,2 b 2,3 - 3" {
				t.Errorf("target rows %q", got)
			}

			// A type that the target lacks.
			pgtest.ExecAll(t, e.src, `CREATE TYPE only_src AS ENUM ('x')`, `ALTER TABLE s ADD COLUMN o only_src`, `INSERT INTO s VALUES (4, 4, 'x')`)
			err = r.stopped(t)
			if !errors.Is(err, ErrSchemaMismatch) || !strings.Contains(err.Error(), `column "o" has type public.only_src on the source, which does not exist on the target`) {
				t.Errorf("Run: %v, want an error naming the missing type", err)
			}
		})
	}
}

// queryAll returns the first column of sql's rows, as text.
func queryAll(t *testing.T, dsn, sql string, args ...any) []string {
	t.Helper()
	ctx := pgtest.Context(t, time.Minute)
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, sql, args...)
	must(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	return out
}

// TestSchemaTypeChange changes a column's type on the source to one whose values the target's
// column cannot take: the error names the table, the column and both types.
func TestSchemaTypeChange(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := fullEnv(t, major, "schematype", []string{`CREATE TABLE s (id int PRIMARY KEY, c int)`})
			pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 1)`, `ALTER TABLE s ALTER COLUMN c TYPE text`, `INSERT INTO s VALUES (2, 'two')`)
			cfg := e.config(t, Buffered)
			cfg.SchemaChanges = SchemaAddColumns
			err := start(t, cfg).stopped(t)
			if !errors.Is(err, ErrData) {
				t.Fatalf("Run: %v, want ErrData", err)
			}
			t.Logf("%v", err)
			for _, w := range []string{`"public"."s"`, `column "c" is text on the source and integer on the target`} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error lacks %q", w)
				}
			}
		})
	}
}

// TestSchemaTargetColumnDropped drops a column on the target while the Applier runs, after it
// read the table: the insert that needs the column (a COPY, a single INSERT, an UPDATE) stops
// Run with an error that names the column and the fix, not the server's bare undefined_column.
func TestSchemaTargetColumnDropped(t *testing.T) {
	for _, mode := range []Mode{Buffered, Parallel} {
		for i, stmt := range []string{`INSERT INTO s SELECT g, 'x' FROM generate_series(10, 20) g`, `INSERT INTO s VALUES (2, 'a')`,
			`UPDATE s SET v = 'z' WHERE id = 1`} {
			t.Run(fmt.Sprintf("%s/%d", mode, i), func(t *testing.T) {
				e := fullEnv(t, testMajors[len(testMajors)-1], "dropped", schemaTypes)
				r := start(t, e.config(t, mode))
				pgtest.ExecAll(t, e.src, `INSERT INTO s VALUES (1, 'a')`, `INSERT INTO marker VALUES (1)`)
				e.waitMarker(t, r, 1)
				pgtest.ExecAll(t, e.dst, `ALTER TABLE s DROP COLUMN v`)
				pgtest.ExecAll(t, e.src, stmt, `INSERT INTO marker VALUES (2)`)
				err := r.stopped(t)
				if !errors.Is(err, ErrSchemaMismatch) || !strings.Contains(err.Error(), `no column "v"`) ||
					!strings.Contains(err.Error(), "Config.SchemaChanges = SchemaAddColumns") {
					t.Errorf("Run: %v, want an error naming the column and the fix", err)
				}
			})
		}
	}
}

// TestSchemaAddColumnRolledBack fails the session after the column was added and the change that
// needed it applied, before the commit: both are rolled back, and the next session adds the
// column again and applies the change once.
func TestSchemaAddColumnRolledBack(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			e := fullEnv(t, major, "schemaroll", schemaTypes)
			pgtest.ExecAll(t, e.src, `ALTER TABLE s ADD COLUMN n numeric(10,2)`, `INSERT INTO s VALUES (1, 'a', 1.25)`, `INSERT INTO marker VALUES (1)`)
			cfg := e.config(t, Buffered)
			cfg.SchemaChanges = SchemaAddColumns
			var failed atomic.Bool
			cfg.hooks = &hooks{stage: func(ctx context.Context, stage string, x txnRef) error {
				if stage == "before-commit" && failed.CompareAndSwap(false, true) {
					return retry.Retry("injected failure before the commit")
				}
				return nil
			}}
			r := start(t, cfg)
			e.waitMarker(t, r, 1)
			st := r.a.Stats()
			r.halt(t)
			if !failed.Load() || st.Sessions != 2 || st.ColumnsAdded != 2 {
				t.Errorf("failure injected %v, %d sessions, %d columns added; want true, 2, 2", failed.Load(), st.Sessions, st.ColumnsAdded)
			}
			e.sameRows(t, "s")
		})
	}
}
