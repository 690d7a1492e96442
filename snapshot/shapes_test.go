package snapshot_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/snapshot"
)

// TestPublicationShapes: what the copy delivers for each way of publishing a table is what the
// stream publishes: a column list, row filters of two publications (joined with OR), a
// partitioned table published through its root (two levels of partitions, and also listed leaf
// by leaf by another publication: the root wins, as in the stream), another through its root,
// one leaf by leaf (each partition a table of its own, as in the stream), an inheritance parent
// and its child, replica identities USING INDEX
// and FULL, a name that needs quoting, and on PostgreSQL 18 a stored generated column published
// with publish_generated_columns. Rows written before the slot are copied, rows written after
// it are streamed (including updates that move rows in and out of a row filter and across
// partitions); copy then stream must equal what the publications publish of each table at the
// end, and the copy must describe each table as the stream's Relation message does.
func TestPublicationShapes(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		db := pgtest.NewDatabase(t, srv)
		cs := srv.ConnString(db)
		ctx := pgtest.Context(t, 2*time.Minute)
		pubs := []string{"p1", "p2", "p3"}
		pgtest.ExecAll(t, cs,
			`CREATE TABLE cl (id int PRIMARY KEY, a text, b int, secret text)`,
			`CREATE TABLE rf (id int PRIMARY KEY, v int)`,
			`ALTER TABLE rf REPLICA IDENTITY FULL`, // a row filter on v, for updates
			`CREATE TABLE pr (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (id)`,
			`CREATE TABLE pr1 PARTITION OF pr FOR VALUES FROM (0) TO (100)`,
			`CREATE TABLE pr2 PARTITION OF pr FOR VALUES FROM (100) TO (1000) PARTITION BY RANGE (id)`,
			`CREATE TABLE pr2a PARTITION OF pr2 FOR VALUES FROM (100) TO (500)`,
			`CREATE TABLE pr2b PARTITION OF pr2 FOR VALUES FROM (500) TO (1000)`,
			`CREATE TABLE pl (id int PRIMARY KEY, v text) PARTITION BY LIST (id)`,
			`CREATE TABLE pl1 PARTITION OF pl FOR VALUES IN (1, 2)`,
			`CREATE TABLE pl2 PARTITION OF pl FOR VALUES IN (3, 4)`,
			`CREATE TABLE lp (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`,
			`CREATE TABLE lp1 PARTITION OF lp FOR VALUES FROM (0) TO (10)`,
			`CREATE TABLE lp2 PARTITION OF lp FOR VALUES FROM (10) TO (1000)`,
			`CREATE TABLE parent (id int PRIMARY KEY, v text)`,
			`CREATE TABLE child (extra int) INHERITS (parent)`,
			`ALTER TABLE child ADD PRIMARY KEY (id)`,
			`CREATE TABLE ri (id int NOT NULL, u int NOT NULL, v text)`,
			`CREATE UNIQUE INDEX ri_u ON ri (u)`,
			`ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_u`,
			`CREATE TABLE rfull (id int, v text)`,
			`ALTER TABLE rfull REPLICA IDENTITY FULL`,
			`CREATE TABLE "Odd ""name""" (id int PRIMARY KEY, "Col" text)`,
			`CREATE TABLE done (id int PRIMARY KEY)`,
			`CREATE PUBLICATION p1 FOR TABLE cl (id, a, b), rf WHERE (v > 10), pr, lp, parent, ri, rfull, "Odd ""name""", done`,
			`CREATE PUBLICATION p2 FOR TABLE rf WHERE (v < 0), pl WITH (publish_via_partition_root = true)`,
			`CREATE PUBLICATION p3 FOR TABLE pr WITH (publish_via_partition_root = true)`,
			`INSERT INTO cl SELECT i, 'a' || i, i, 'secret' FROM generate_series(1, 20) i`,
			`INSERT INTO rf SELECT i, CASE WHEN i % 2 = 0 THEN 15 ELSE 5 END FROM generate_series(1, 20) i`,
			`INSERT INTO pr SELECT i * 40, i, 'v' || i FROM generate_series(1, 20) i`,
			`INSERT INTO pl VALUES (1, 'one'), (2, 'two'), (4, 'four')`,
			`INSERT INTO lp SELECT i, 'l' || i FROM generate_series(1, 20) i`,
			`INSERT INTO parent SELECT i, 'p' || i FROM generate_series(1, 10) i`,
			`INSERT INTO child SELECT i, 'c' || i, i FROM generate_series(11, 20) i`,
			`INSERT INTO ri SELECT i, i, 'r' || i FROM generate_series(1, 20) i`,
			`INSERT INTO rfull SELECT i, 'f' || i FROM generate_series(1, 20) i`,
			`INSERT INTO "Odd ""name""" SELECT i, 'o' || i FROM generate_series(1, 20) i`)
		if srv.Major() >= 18 {
			pgtest.ExecAll(t, cs, `CREATE TABLE gen (id int PRIMARY KEY, g int GENERATED ALWAYS AS (id * 10) STORED)`,
				`CREATE PUBLICATION p4 FOR TABLE gen WITH (publish_generated_columns = stored)`,
				`INSERT INTO gen SELECT i FROM generate_series(1, 20) i`)
			pubs = append(pubs, "p4")
		}
		conn, snap, _ := connectSlot(ctx, t, srv, db, "s", false, pubs...)
		pgtest.ExecAll(t, cs,
			`INSERT INTO cl VALUES (101, 'x', 1, 's')`, `UPDATE cl SET a = 'y', secret = 'z' WHERE id = 1`, `DELETE FROM cl WHERE id = 2`,
			`INSERT INTO rf VALUES (101, 50), (102, 5), (103, -3)`,
			`UPDATE rf SET v = 20 WHERE id = 1`, // out of the filter, into it: an insert
			`UPDATE rf SET v = 1 WHERE id = 2`,  // out of it: a delete
			`DELETE FROM rf WHERE id IN (3, 4)`,
			`INSERT INTO pr VALUES (5, 1, 'a'), (600, 2, 'b')`,
			`UPDATE pr SET id = 150 WHERE id = 40`, // to another partition
			`DELETE FROM pr WHERE id = 80`,
			`INSERT INTO pl VALUES (3, 'three')`, `UPDATE pl SET v = 'uno' WHERE id = 1`,
			`INSERT INTO lp VALUES (0, 'zero'), (500, 'l500')`, `UPDATE lp SET id = 25 WHERE id = 5`, `DELETE FROM lp WHERE id = 12`,
			`INSERT INTO parent VALUES (101, 'p')`, `INSERT INTO child VALUES (102, 'c', 7)`, `UPDATE child SET extra = 8 WHERE id = 11`,
			`INSERT INTO ri VALUES (101, 1001, 'r')`, `UPDATE ri SET v = 'q' WHERE u = 1`, `UPDATE ri SET u = 2000 WHERE u = 2`,
			`DELETE FROM ri WHERE u = 3`,
			`INSERT INTO rfull VALUES (101, 'f')`, `UPDATE rfull SET v = 'g' WHERE id = 1`, `DELETE FROM rfull WHERE id = 2`,
			`INSERT INTO "Odd ""name""" VALUES (101, 'o')`)
		if srv.Major() >= 18 {
			pgtest.ExecAll(t, cs, `INSERT INTO gen VALUES (101)`, `UPDATE gen SET id = 102 WHERE id = 1`)
		}

		m := newRowModel()
		res, err := snapshot.Copy(ctx, snapshot.Config{ConnString: cs, Publications: pubs, Workers: 2}, snap, copyInto(m))
		if err != nil {
			t.Fatal(err)
		}
		tables := map[string]*snapshot.Table{}
		for _, tab := range res.Tables {
			tables[tab.String()] = tab
		}
		want := []string{"public.\"Odd \"\"name\"\"\"", "public.child", "public.cl", "public.done", "public.lp1", "public.lp2", "public.parent", "public.pl",
			"public.pr", "public.rf", "public.rfull", "public.ri"}
		if srv.Major() >= 18 {
			want = append(want, "public.gen")
		}
		slices.Sort(want)
		var got []string
		for name := range tables {
			got = append(got, name)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("copied tables %v, want %v", got, want)
		}
		if tab := tables["public.rf"]; tab.RowFilter != "(v > 10) OR (v < 0)" || !slices.Equal(tab.Publications, []string{"p1", "p2"}) {
			t.Errorf("rf: row filter %q, publications %v", tab.RowFilter, tab.Publications)
		}
		if tab := tables["public.pr"]; !tab.Partitioned || tab.Chunks != 3 {
			t.Errorf("pr: partitioned %t, %d chunks; want its three leaves", tab.Partitioned, tab.Chunks)
		}
		if tab := tables["public.pl"]; !tab.Partitioned || tab.Chunks != 2 {
			t.Errorf("pl: partitioned %t, %d chunks; want its two leaves", tab.Partitioned, tab.Chunks)
		}
		var cols []string
		for _, c := range tables["public.cl"].Relation.Columns {
			cols = append(cols, c.Name)
		}
		if strings.Join(cols, ",") != "id,a,b" {
			t.Errorf("cl columns %v, want the column list", cols)
		}

		s, err := conn.StartStreaming(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		pgtest.ExecAll(t, cs, `INSERT INTO done VALUES (1)`)
		streamInto(ctx, t, s, m, []*snapshot.Result{res}, isDone, nil)

		for _, c := range []struct {
			name, query string
			key         []int
		}{
			{"public.cl", "SELECT id, a, b FROM cl", []int{0}},
			{"public.rf", "SELECT * FROM rf WHERE v > 10 OR v < 0", []int{0, 1}},
			{"public.pr", "SELECT * FROM pr", []int{0, 1}},
			{"public.pl", "SELECT * FROM pl", []int{0}},
			{"public.lp1", "SELECT * FROM lp1", []int{0}},
			{"public.lp2", "SELECT * FROM lp2", []int{0}},
			{"public.parent", "SELECT * FROM ONLY parent", []int{0}},
			{"public.child", "SELECT * FROM child", []int{0}},
			{"public.ri", "SELECT * FROM ri", []int{1}},
			{"public.rfull", "SELECT * FROM rfull", []int{0, 1}},
			{`public.Odd "name"`, `SELECT * FROM "Odd ""name"""`, []int{0}},
			{"public.gen", "SELECT * FROM gen", []int{0}},
		} {
			if c.name == "public.gen" && srv.Major() < 18 {
				continue
			}
			checkModel(ctx, t, cs, m, c.name, c.query, c.key...)
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for name := range m.rows {
			if strings.HasPrefix(name, "public.pr") && name != "public.pr" || strings.HasPrefix(name, "public.pl") && name != "public.pl" {
				t.Errorf("rows of partition %s delivered as its own", name)
			}
		}
	})
}

// TestCreatedAfterSnapshot: a table created after the consistent point in a FOR ALL TABLES
// publication is not copied (the stream sends every row it ever had), nor locked.
func TestCreatedAfterSnapshot(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		db := pgtest.NewDatabase(t, srv)
		cs := srv.ConnString(db)
		ctx := pgtest.Context(t, time.Minute)
		pgtest.ExecAll(t, cs, `CREATE TABLE a (id int PRIMARY KEY)`, `INSERT INTO a VALUES (1)`, `CREATE PUBLICATION everything FOR ALL TABLES`)
		conn, snap, _ := connectSlot(ctx, t, srv, db, "s", false, "everything")
		pgtest.ExecAll(t, cs, `CREATE TABLE b (id int PRIMARY KEY)`, `INSERT INTO b VALUES (2)`)
		m := newRowModel()
		res, err := snapshot.Copy(ctx, snapshot.Config{ConnString: cs, Publications: []string{"everything"}}, snap, copyInto(m))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Tables) != 1 || res.Tables[0].Name != "a" || res.Rows != 1 {
			t.Fatalf("copied %v, %d rows; want a's row", res.Tables, res.Rows)
		}
		s, err := conn.StartStreaming(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		pgtest.ExecAll(t, cs, `CREATE TABLE done (id int)`, `INSERT INTO done VALUES (1)`)
		streamInto(ctx, t, s, m, []*snapshot.Result{res}, isDone, nil)
		checkModel(ctx, t, cs, m, "public.a", "SELECT * FROM a", 0)
		checkModel(ctx, t, cs, m, "public.b", "SELECT * FROM b", 0)
	})
}
