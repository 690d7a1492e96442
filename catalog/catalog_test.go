package catalog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// relation describes table oid as a Relation message would (the Reader needs its OID and, for
// its cache, its shape).
func relation(t *testing.T, ctx context.Context, dsn, table string, columns ...string) *decoding.Relation {
	t.Helper()
	var oid uint32
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.QueryRow(ctx, "SELECT $1::regclass::oid", table).Scan(&oid))
	r := &decoding.Relation{RelationID: oid, Name: table}
	for _, c := range columns {
		r.Columns = append(r.Columns, decoding.RelationColumn{Name: c, TypeOID: 25})
	}
	return r
}

// TestKeys: the event key is the primary key whatever the replica identity; without one, the
// replica identity index, else the first unique index (by name) whose columns are all NOT NULL,
// skipping partial and expression indexes and INCLUDE columns; else none.
func TestKeys(t *testing.T) {
	for _, major := range []int{15, 18} {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			ctx := pgtest.Context(t, time.Minute)
			dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
			pgtest.ExecAll(t, dsn,
				"CREATE TABLE pk (b int, a int, v text NOT NULL, PRIMARY KEY (a, b), UNIQUE (v))",
				"ALTER TABLE pk REPLICA IDENTITY FULL",
				"CREATE TABLE ident (x int NOT NULL, y int NOT NULL, z int NOT NULL)",
				"CREATE UNIQUE INDEX ident_a ON ident (x)", "CREATE UNIQUE INDEX ident_b ON ident (y)",
				"ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_b",
				"CREATE TABLE uniq (n int, x int NOT NULL, y int NOT NULL, w int NOT NULL)",
				"CREATE UNIQUE INDEX uniq_a ON uniq (n)",             // nullable: not a key
				"CREATE UNIQUE INDEX uniq_b ON uniq (x) WHERE x > 0", // partial
				"CREATE UNIQUE INDEX uniq_c ON uniq ((x + 1))",       // an expression
				"CREATE UNIQUE INDEX uniq_e ON uniq (w)",             // after uniq_d by name
				"CREATE UNIQUE INDEX uniq_d ON uniq (y) INCLUDE (w)", // its key is y
				"ALTER TABLE uniq REPLICA IDENTITY FULL",
				"CREATE TABLE nokey (v text)", "ALTER TABLE nokey REPLICA IDENTITY FULL",
			)
			cat, err := catalog.New(catalog.Config{ConnString: dsn})
			require.NoError(t, err)
			defer cat.Close()
			for table, want := range map[string][]string{"pk": {"a", "b"}, "ident": {"y"}, "uniq": {"y"}, "nokey": nil} {
				tbl, err := cat.Table(ctx, relation(t, ctx, dsn, table))
				require.NoError(t, err)
				require.Equal(t, want, tbl.Key, table)
			}
		})
	}
}

// TestColumns: NOT NULL, the default expression (none for a generated column), the type's name
// and an enum's labels in their order.
func TestColumns(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, time.Minute)
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn,
		"CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')", "ALTER TYPE mood ADD VALUE 'meh' BEFORE 'ok'",
		`CREATE TABLE t (id serial PRIMARY KEY, v varchar(5) NOT NULL DEFAULT 'x', m mood DEFAULT 'ok',
			g int GENERATED ALWAYS AS (id * 2) STORED, "Odd ""Name""" text)`)
	cat, err := catalog.New(catalog.Config{ConnString: dsn})
	require.NoError(t, err)
	defer cat.Close()
	tbl, err := cat.Table(ctx, relation(t, ctx, dsn, "t"))
	require.NoError(t, err)
	// With search_path pinned empty, names outside pg_catalog come schema-qualified.
	require.Equal(t, map[string]format.TableColumn{
		"id":         {NotNull: true, Default: "nextval('public.t_id_seq'::regclass)", TypeName: "int4"},
		"v":          {NotNull: true, Default: "'x'::character varying", TypeName: "varchar"},
		"m":          {Default: "'ok'::public.mood", TypeName: "mood", EnumLabels: []string{"sad", "meh", "ok", "happy"}},
		"g":          {TypeName: "int4"},
		`Odd "Name"`: {TypeName: "text"},
	}, tbl.Columns)
	require.Equal(t, []string{"id"}, tbl.Key)
}

// TestRefresh: a table is read again when its relation is described differently, not before;
// a lost connection is opened again, and the query that met the loss run again on it.
func TestRefresh(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, time.Minute)
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	cat, err := catalog.New(catalog.Config{ConnString: dsn})
	require.NoError(t, err)
	defer cat.Close()
	rel := relation(t, ctx, dsn, "t", "id", "v")
	tbl, err := cat.Table(ctx, rel)
	require.NoError(t, err)
	require.Equal(t, []string{"id"}, tbl.Key)

	pgtest.ExecAll(t, dsn, "ALTER TABLE t ADD COLUMN w int NOT NULL DEFAULT 0")
	tbl, err = cat.Table(ctx, rel) // the same description: the cached answer
	require.NoError(t, err)
	require.NotContains(t, tbl.Columns, "w")
	rel2 := relation(t, ctx, dsn, "t", "id", "v", "w")
	tbl, err = cat.Table(ctx, rel2)
	require.NoError(t, err)
	require.Equal(t, format.TableColumn{NotNull: true, Default: "0", TypeName: "int4"}, tbl.Columns["w"])

	pgtest.ExecAll(t, dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgreorder-catalog'")
	pgtest.ExecAll(t, dsn, "ALTER TABLE t DROP CONSTRAINT t_pkey")
	// The connection is opened again.
	tbl, err = cat.Table(ctx, relation(t, ctx, dsn, "t", "id"))
	require.NoError(t, err)
	require.Nil(t, tbl.Key)
	name, err := cat.Database(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, name)
	require.NoError(t, cat.Close())
	require.NoError(t, cat.Close())
	_, err = cat.Table(ctx, rel)
	require.ErrorIs(t, err, catalog.ErrClosed)
}

// TestPublished: the tables of the publications as the stream publishes them.
func TestPublished(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, time.Minute)
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, `CREATE SCHEMA "a.b"`, `CREATE TABLE "a.b".t (id int)`, "CREATE TABLE u (id int)", "CREATE TABLE v (id int)",
		`CREATE PUBLICATION "p,1" FOR TABLE "a.b".t`, `CREATE PUBLICATION "p""2" FOR TABLE u`)
	cat, err := catalog.New(catalog.Config{ConnString: dsn + " replication=database"})
	require.NoError(t, err)
	defer cat.Close()
	got, err := cat.Published(ctx, []string{"p,1", `p"2`, "missing"})
	require.NoError(t, err)
	require.Equal(t, []catalog.TableName{{Schema: "a.b", Name: "t"}, {Schema: "public", Name: "u"}}, got)
	require.Equal(t, `"a.b".t`, got[0].String())
}
