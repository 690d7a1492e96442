package apply

import (
	"fmt"
	"testing"
)

// TestSchemaAddColumnPrepared adds columns on the source inside prepared transactions (PREPARE
// TRANSACTION), with SchemaAddColumns. The Applier decodes without two-phase: a prepared
// transaction reaches the target when COMMIT PREPARED commits it on the source, as one
// transaction (streamed when large), and not at all when ROLLBACK PREPARED ends it. The column
// and the rows of a committed one arrive; nothing of one rolled back does, its column included,
// even when it was streamed and applied as it arrived (Eager).
func TestSchemaAddColumnPrepared(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Eager} {
			t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
				e := fullEnv(t, major, "prepared", []string{`CREATE TABLE s (id int PRIMARY KEY, v text)`, `CREATE TABLE marker (id int PRIMARY KEY)`})
				db := queryAll(t, e.src, `SELECT current_database()::text`)[0]
				gid := func(i int) string { return fmt.Sprintf("'%s_%d'", db, i) } // unique on the server
				t.Cleanup(func() {                                                 // prepared transactions left by a failure would keep the database
					for _, g := range queryAll(t, e.src, `SELECT quote_literal(gid) FROM pg_prepared_xacts WHERE database = current_database()`) {
						execOn(t, e.src, `ROLLBACK PREPARED `+g)
					}
				})
				cfg := e.config(t, mode)
				cfg.SchemaChanges = SchemaAddColumns
				r := start(t, cfg)
				hasColumn := func(c string) bool {
					return count(t, e.dst, `SELECT count(*) FROM pg_attribute WHERE attrelid = 's'::regclass AND attname = $1 AND NOT attisdropped`, c) == 1
				}

				// Small, committed.
				execOn(t, e.src, `BEGIN; ALTER TABLE s ADD COLUMN n numeric(10,2); INSERT INTO s VALUES (1, 'a', 1.5); PREPARE TRANSACTION `+gid(1),
					`INSERT INTO marker VALUES (1)`)
				e.waitMarker(t, r, 1)
				if hasColumn("n") {
					t.Fatalf("the column of a transaction prepared and not committed is on the target")
				}
				execOn(t, e.src, `COMMIT PREPARED `+gid(1), `INSERT INTO marker VALUES (2)`)
				e.waitMarker(t, r, 2)
				if !hasColumn("n") {
					t.Fatalf("the column of a committed prepared transaction is not on the target")
				}

				// Large (streamed), rolled back.
				execOn(t, e.src, `BEGIN; INSERT INTO s SELECT g, 'x', g FROM generate_series(10, 1500) g; ALTER TABLE s ADD COLUMN gone int;
					INSERT INTO s SELECT g, 'y', g, g FROM generate_series(2000, 3500) g; PREPARE TRANSACTION `+gid(2),
					`INSERT INTO marker VALUES (3)`)
				e.waitMarker(t, r, 3)
				execOn(t, e.src, `ROLLBACK PREPARED `+gid(2), `INSERT INTO marker VALUES (4)`)
				e.waitMarker(t, r, 4)
				if hasColumn("gone") {
					t.Errorf("the column of a prepared transaction rolled back is on the target")
				}

				// Large (streamed), committed.
				execOn(t, e.src, `BEGIN; INSERT INTO s SELECT g, 'x', g FROM generate_series(10, 1500) g; ALTER TABLE s ADD COLUMN late bigint[];
					INSERT INTO s (id, late) SELECT g, ARRAY[g] FROM generate_series(2000, 3500) g; PREPARE TRANSACTION `+gid(3),
					`COMMIT PREPARED `+gid(3), `INSERT INTO marker VALUES (5)`)
				e.waitMarker(t, r, 5)
				st := r.a.Stats()
				r.halt(t)
				if got, want := columnTypes(t, e.dst, "s"), columnTypes(t, e.src, "s"); got != want {
					t.Errorf("target columns\n%s\nwant the source's\n%s", got, want)
				}
				e.sameRows(t, "s")
				if st.ColumnsAdded != 2 {
					t.Errorf("Stats.ColumnsAdded %d, want 2", st.ColumnsAdded)
				}
			})
		}
	}
}
