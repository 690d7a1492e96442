package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
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
						pgtest.ExecAll(t, e.src, `ROLLBACK PREPARED `+g)
					}
				})
				cfg := e.config(t, mode)
				cfg.SchemaChanges = SchemaAddColumns
				r := start(t, cfg)
				hasColumn := func(c string) bool {
					return pgtest.Count(t, e.dst, `SELECT count(*) FROM pg_attribute WHERE attrelid = 's'::regclass AND attname = $1 AND NOT attisdropped`, c) == 1
				}

				// Small, committed.
				pgtest.ExecAll(t, e.src, `BEGIN; ALTER TABLE s ADD COLUMN n numeric(10,2); INSERT INTO s VALUES (1, 'a', 1.5); PREPARE TRANSACTION `+gid(1),
					`INSERT INTO marker VALUES (1)`)
				e.waitMarker(t, r, 1)
				if hasColumn("n") {
					t.Fatalf("the column of a transaction prepared and not committed is on the target")
				}
				pgtest.ExecAll(t, e.src, `COMMIT PREPARED `+gid(1), `INSERT INTO marker VALUES (2)`)
				e.waitMarker(t, r, 2)
				if !hasColumn("n") {
					t.Fatalf("the column of a committed prepared transaction is not on the target")
				}

				// Large (streamed), rolled back.
				pgtest.ExecAll(t, e.src, `BEGIN; INSERT INTO s SELECT g, 'x', g FROM generate_series(10, 1500) g; ALTER TABLE s ADD COLUMN gone int;
					INSERT INTO s SELECT g, 'y', g, g FROM generate_series(2000, 3500) g; PREPARE TRANSACTION `+gid(2),
					`INSERT INTO marker VALUES (3)`)
				e.waitMarker(t, r, 3)
				pgtest.ExecAll(t, e.src, `ROLLBACK PREPARED `+gid(2), `INSERT INTO marker VALUES (4)`)
				e.waitMarker(t, r, 4)
				if hasColumn("gone") {
					t.Errorf("the column of a prepared transaction rolled back is on the target")
				}

				// Large (streamed), committed.
				pgtest.ExecAll(t, e.src, `BEGIN; INSERT INTO s SELECT g, 'x', g FROM generate_series(10, 1500) g; ALTER TABLE s ADD COLUMN late bigint[];
					INSERT INTO s (id, late) SELECT g, ARRAY[g] FROM generate_series(2000, 3500) g; PREPARE TRANSACTION `+gid(3),
					`COMMIT PREPARED `+gid(3), `INSERT INTO marker VALUES (5)`)
				e.waitMarker(t, r, 5)
				st := r.a.Stats()
				r.halt(t)
				if got, want := columnTypes(t, e.dst, "s"), columnTypes(t, e.src, "s"); got != want {
					t.Errorf("target columns\n%s\nwant the source's\n%s", got, want)
				}
				e.sameRows(t, "s")
				// Eager may add the rolled back transaction's column too, when its changes were
				// applied before the rollback arrived (the add is rolled back with them, but counted).
				lo, hi := int64(2), int64(2)
				if mode == Eager {
					hi = 3
				}
				if st.ColumnsAdded < lo || st.ColumnsAdded > hi {
					t.Errorf("Stats.ColumnsAdded %d, want %d to %d", st.ColumnsAdded, lo, hi)
				}
			})
		}
	}
}

// TestSchemaAddColumnSynchronousSource adds a column on a source whose synchronous_standby_names
// names the Applier: the transaction that adds it is sent to the Applier before it is visible on
// the source (its COMMIT waits for the Applier's acknowledgement), so the column's type must come
// from what the stream says of it, not from the source's catalog as of the column, which shows
// the column only after the acknowledgement.
func TestSchemaAddColumnSynchronousSource(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			src, err := pgtest.Start(ctx, pgtest.Shared(t, major).Install(), pgtest.Options{})
			must(t, err)
			t.Cleanup(func() { _ = src.Stop() })
			dst := pgtest.Shared(t, major)
			srcDB, dstDB := pgtest.NewDatabase(t, src), pgtest.NewDatabase(t, dst)
			e := &env{srv: src, src: src.ConnString(srcDB), dst: dst.ConnString(dstDB), repl: src.ReplicationConnString(srcDB), slot: "syncschema"}
			ddl := []string{`CREATE TYPE mood AS ENUM ('sad', 'happy')`, `CREATE TABLE s (id int PRIMARY KEY, v text)`}
			must(t, pgtest.Exec(ctx, e.src, append(append([]string{}, ddl...), `CREATE PUBLICATION pub FOR ALL TABLES`,
				`SELECT pg_create_logical_replication_slot('syncschema', 'pgoutput')`)...))
			must(t, pgtest.Exec(ctx, e.dst, ddl...))
			cfg := e.config(t, Buffered)
			cfg.Source.ConnString += " application_name=" + syncName
			cfg.SchemaChanges = SchemaAddColumns
			must(t, pgtest.Exec(ctx, src.ConnString("postgres"), `ALTER SYSTEM SET synchronous_standby_names = '`+syncName+`'`, `SELECT pg_reload_conf()`))
			t.Cleanup(func() {
				must(t, pgtest.Exec(context.Background(), src.ConnString("postgres"), `ALTER SYSTEM RESET synchronous_standby_names`, `SELECT pg_reload_conf()`))
			})
			r := start(t, cfg)
			waitSync(t, ctx, e.src)
			done := make(chan error, 1)
			go func() {
				done <- pgtest.Exec(ctx, e.src, `BEGIN; ALTER TABLE s ADD COLUMN n numeric(10,2), ADD COLUMN m mood; INSERT INTO s VALUES (1, 'a', 1.5, 'happy'); COMMIT`)
			}()
			select {
			case err := <-done:
				must(t, err)
			case err := <-r.done:
				r.stop = nil
				t.Fatalf("apply stopped: %v", err)
			}
			r.halt(t)
			if got, want := columnTypes(t, e.dst, "s"), columnTypes(t, e.src, "s"); got != want {
				t.Errorf("target columns\n%s\nwant the source's\n%s", got, want)
			}
			e.sameRows(t, "s")
		})
	}
}

// TestSchemaAddColumnStreamedOpen adds a column inside a large transaction that is still open on
// the source while Eager applies its streamed parts: the column is added on the target from the
// stream's description (the source's catalog does not show it until the commit), then the
// transaction commits.
func TestSchemaAddColumnStreamedOpen(t *testing.T) {
	for _, major := range testMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			e := fullEnv(t, major, "streamopen", []string{`CREATE TABLE s (id int PRIMARY KEY, v text)`, `CREATE TABLE marker (id int PRIMARY KEY)`})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := e.config(t, Eager)
			cfg.SchemaChanges = SchemaAddColumns
			r := start(t, cfg)
			big, err := pgx.Connect(ctx, e.src)
			must(t, err)
			defer big.Close(context.Background())
			for _, sql := range []string{`BEGIN`, `INSERT INTO s SELECT g, repeat('x', 200) FROM generate_series(1, 1500) g`,
				`ALTER TABLE s ADD COLUMN late int[]`, `INSERT INTO s (id, late) SELECT g, ARRAY[g] FROM generate_series(2000, 3500) g`} {
				_, err := big.Exec(ctx, sql)
				must(t, err)
			}
			// The worker locks the table to add the column, in its open transaction.
			mon, err := pgx.Connect(ctx, e.dst)
			must(t, err)
			defer mon.Close(context.Background())
			for {
				var n int
				must(t, mon.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = 's'::regclass AND mode = 'AccessExclusiveLock' AND granted
					AND pid <> pg_backend_pid()`).Scan(&n))
				if n > 0 {
					break
				}
				select {
				case err := <-r.done:
					r.stop = nil
					t.Fatalf("apply stopped: %v", err)
				case <-ctx.Done():
					t.Fatalf("the column was not added while the transaction is open (stats %+v)", r.a.Stats())
				case <-time.After(5 * time.Millisecond):
				}
			}
			_, err = big.Exec(ctx, `COMMIT`)
			must(t, err)
			pgtest.ExecAll(t, e.src, `INSERT INTO marker VALUES (1)`)
			e.waitMarker(t, r, 1)
			r.halt(t)
			if got, want := columnTypes(t, e.dst, "s"), columnTypes(t, e.src, "s"); got != want {
				t.Errorf("target columns\n%s\nwant the source's\n%s", got, want)
			}
			e.sameRows(t, "s")
		})
	}
}

// TestTwoPhaseSlot starts on a slot created with two-phase decoding, which the Applier does not
// read: the error says to use a slot made without it, and names no option the Applier lacks.
func TestTwoPhaseSlot(t *testing.T) {
	e := fullEnv(t, testMajors[len(testMajors)-1], "plain", []string{`CREATE TABLE s (id int PRIMARY KEY)`})
	pgtest.ExecAll(t, e.src, `SELECT pg_create_logical_replication_slot('twophase', 'pgoutput', false, true)`)
	cfg := e.config(t, Buffered)
	cfg.Source.Slot = "twophase"
	err := start(t, cfg).stopped(t)
	if !errors.Is(err, replication.ErrSlotMismatch) || !strings.Contains(err.Error(), "without two-phase decoding") ||
		strings.Contains(err.Error(), "TwoPhase") {
		t.Errorf("Run: %v, want ErrSlotMismatch saying to use a slot made without two-phase decoding", err)
	} else {
		t.Logf("%v", err)
	}
}
