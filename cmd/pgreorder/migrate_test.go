package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestApplyMigration walks through a migration from one major version to another with the
// command: a column the source adds stops apply with an error naming -schema-changes and
// -skip-lsn; with -schema-changes add-columns a transaction the target refuses stops it again;
// -skip-lsn with the LSN the error names skips it, and -until-caught-up exits once caught up;
// -sync-sequences-once brings the target's sequence up to the source's.
func TestApplyMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers")
	}
	majors := streamMajors(t)
	if len(majors) < 2 {
		pgtest.Unavailable(t, "needs PostgreSQL 15 and 18")
	}
	for _, pair := range [][2]int{{majors[0], majors[1]}, {majors[1], majors[0]}} {
		t.Run(fmt.Sprintf("pg%d-pg%d", pair[0], pair[1]), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srcSrv, dstSrv := pgtest.Shared(t, pair[0]), pgtest.Shared(t, pair[1])
			src, dst := srcSrv.ConnString(pgtest.NewDatabase(t, srcSrv)), dstSrv.ConnString(pgtest.NewDatabase(t, dstSrv))
			schema := []string{`CREATE TYPE mood AS ENUM ('sad', 'happy')`, `CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
				`CREATE TABLE s (id serial PRIMARY KEY, v int)`}
			require.NoError(t, pgtest.Exec(ctx, src, append(schema, `CREATE PUBLICATION p FOR TABLE s`,
				`SELECT pg_create_logical_replication_slot('mig', 'pgoutput')`)...))
			require.NoError(t, pgtest.Exec(ctx, dst, append(schema, `ALTER TABLE s ADD CHECK (v < 100)`)...))
			require.NoError(t, pgtest.Exec(ctx, src, `INSERT INTO s (v) VALUES (1)`, `ALTER TABLE s ADD COLUMN n numeric(10,2)`,
				`INSERT INTO s (v, n) VALUES (500, 1.5)`, `INSERT INTO s (v, n) VALUES (2, 2.25)`, `SELECT nextval('s_id_seq') FROM generate_series(1, 10)`))
			args := []string{"-source", src, "-target", dst, "-slot", "mig", "-publication", "p", "-until-caught-up", "-progress", "0"}

			err := runApply(ctx, args)
			require.Error(t, err)
			msg := explain("apply", err)
			t.Log(msg)
			require.Contains(t, msg, `column "n"`)
			require.Contains(t, msg, "-schema-changes add-columns")
			require.Regexp(t, `-skip-lsn [0-9A-F]+/[0-9A-F]+`, msg)
			require.NotContains(t, msg, "Config.")

			args = append(args, "-schema-changes", "add-columns")
			err = runApply(ctx, args)
			require.Error(t, err)
			msg = explain("apply", err)
			t.Log(msg)
			require.Contains(t, msg, "violates check constraint")
			lsn := regexp.MustCompile(`-skip-lsn ([0-9A-F]+/[0-9A-F]+)`).FindStringSubmatch(msg)
			require.NotNil(t, lsn, msg)

			err = runApply(ctx, append(args, "-skip-lsn", "0/10"))
			require.Error(t, err)
			msg = explain("apply", err)
			require.Contains(t, msg, "-skip-lsn 0/10")
			require.NotContains(t, msg, "Config.")

			require.NoError(t, pgtest.Exec(ctx, src, `ALTER TABLE s ADD COLUMN vc varchar(20), ADD COLUMN ts timestamptz(3), `+
				`ADD COLUMN a int[], ADD COLUMN m mood, ADD COLUMN d posint`,
				`INSERT INTO s (v, vc, ts, a, m, d) VALUES (3, 'vc', '2026-01-02 03:04:05.678+00', '{1,2}', 'happy', 5)`))
			require.NoError(t, runApply(ctx, append(args, "-skip-lsn", lsn[1])))
			const types = `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) FROM pg_attribute
				WHERE attrelid = 's'::regclass AND attnum > 0 AND NOT attisdropped`
			var srcTypes, dstTypes string
			sc, err := pgx.Connect(ctx, src)
			require.NoError(t, err)
			defer sc.Close(context.Background())
			require.NoError(t, sc.QueryRow(ctx, types).Scan(&srcTypes))
			conn, err := pgx.Connect(ctx, dst)
			require.NoError(t, err)
			defer conn.Close(context.Background())
			var rows string
			require.NoError(t, conn.QueryRow(ctx, `SELECT string_agg(format('%s:%s:%s', id, v, n), ',' ORDER BY id) FROM s`).Scan(&rows))
			require.Equal(t, "1:1:,3:2:2.25,14:3:", rows)
			require.NoError(t, conn.QueryRow(ctx, types).Scan(&dstTypes))
			require.Equal(t, srcTypes, dstTypes)
			require.NoError(t, conn.QueryRow(ctx, `SELECT format('%s %s %s %s %s', vc, ts AT TIME ZONE 'UTC', a, m, d) FROM s WHERE id = 14`).Scan(&rows))
			require.Equal(t, "vc 2026-01-02 03:04:05.678 {1,2} happy 5", rows)

			// Restarted with the same -skip-lsn: caught up at once, nothing skipped again.
			require.NoError(t, runApply(ctx, append(args, "-skip-lsn", lsn[1])))

			require.NoError(t, runApply(ctx, []string{"-source", src, "-target", dst, "-slot", "mig", "-publication", "p", "-sync-sequences-once"}))
			var next int64
			require.NoError(t, conn.QueryRow(ctx, `SELECT nextval('s_id_seq')`).Scan(&next))
			require.Equal(t, int64(15), next, "the target's sequence continues after the source's")
			require.False(t, strings.Contains(rows, "500"))
		})
	}
}

// TestApplyMissingTables: the target lacks two published tables, and a type one of them uses.
// apply names both tables at once and -schema-changes; with it, the table whose type is missing
// is named with the type; once the type exists, -copy with -schema-changes creates both tables
// and fills them.
func TestApplyMissingTables(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	majors := streamMajors(t)
	srv := pgtest.Shared(t, majors[len(majors)-1])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, dst := srv.ConnString(pgtest.NewDatabase(t, srv)), srv.ConnString(pgtest.NewDatabase(t, srv))
	require.NoError(t, pgtest.Exec(ctx, src, `CREATE TYPE mood AS ENUM ('sad', 'happy')`,
		`CREATE TABLE a (id int PRIMARY KEY, v numeric(10,2) NOT NULL)`, `CREATE TABLE "B" (id int PRIMARY KEY, m mood)`,
		`INSERT INTO a VALUES (1, 2.5)`, `INSERT INTO "B" VALUES (1, 'happy')`, `CREATE PUBLICATION p FOR TABLE a, "B"`))
	args := []string{"-source", src, "-target", dst, "-slot", "tabs", "-publication", "p", "-copy", "-until-caught-up", "-progress", "0"}

	err := runApply(ctx, args)
	require.Error(t, err)
	msg := explain("apply", err)
	t.Log(msg)
	require.Contains(t, msg, `"public"."B", "public"."a"`)
	require.Contains(t, msg, "-schema-changes add-columns")
	require.NotContains(t, msg, "Config.")

	args = append(args, "-schema-changes", "add-columns")
	err = runApply(ctx, args)
	require.Error(t, err)
	msg = explain("apply", err)
	t.Log(msg)
	require.Contains(t, msg, `"public"."B" cannot be created`)
	require.Contains(t, msg, "public.mood")
	require.NotContains(t, msg, `"public"."a"`)

	require.NoError(t, pgtest.Exec(ctx, dst, `CREATE TYPE mood AS ENUM ('sad', 'happy')`))
	require.NoError(t, runApply(ctx, args))
	require.Equal(t, "1 2.50 1 happy", pgtest.QueryText(t, dst, `SELECT format('%s %s %s %s', a.id, a.v, b.id, b.m) FROM a, "B" b`))
}
