package snapshot_test

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/snapshot"
)

// typeColumns is a table with a column of most kinds of types: built-in scalars, arrays, JSON,
// an enum, an array of it, a composite type and a domain (types described by Type messages), a
// type without a binary send function (aclitem), a TOASTed value and a generated column (not
// published before PostgreSQL 18, nor on 18 without publish_generated_columns).
const typeColumns = `id int PRIMARY KEY, i2 int2, i8 int8, n numeric(12,3), f4 real, f8 float8, b bool,
	t text, vc varchar(20), ch char(3), by bytea, d date, ts timestamp, tz timestamptz, iv interval,
	u uuid, j json, jb jsonb, ia int[], ta text[], m mood, p posint, ip inet, acl aclitem, big text,
	ma mood[], cp pair, g int GENERATED ALWAYS AS (id * 2) STORED`

const typeNames = `id, i2, i8, n, f4, f8, b, t, vc, ch, by, d, ts, tz, iv, u, j, jb, ia, ta, m, p, ip, acl, big, ma, cp`

// typeRows are rows of typeColumns (without id and g) as SQL expressions.
var typeRows = []string{
	`-32768, 9223372036854775807, 123456789.125, (1/3.0)::real, pi(), true,
	 e'tab\there nl\nhere bs\\here cr\rhere q"\'', 'héllo ✓', 'ab', '\x00ff5c0a0d09',
	 '2024-02-29', '2024-02-29 10:34:56.789012', '2024-02-29 10:34:56.789012+02', '1 year 2 mons 3 days 04:05:06.789',
	 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.50, null]}', '{"b": {"c": "d\u00e9"}}',
	 '{1,NULL,-3}', '{"a b","c,d",NULL,"e\"f","g\\h",""}', 'happy', 42, '192.168.0.1/24',
	 ('=r/' || quote_ident(current_user))::aclitem, repeat('long ', 30000), '{happy,NULL,sad}', '(7,"x y")'`,
	`NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
	 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL`,
	`0, 0, 'NaN', 'Infinity', '-Infinity', false, '', '', '', '', 'infinity', '-infinity', 'infinity',
	 '-178000000 years', '00000000-0000-0000-0000-000000000000', '[]', '{}', '{{1,2},{3,4}}', '{}', 'sad', 1,
	 '::1', ('=arwdDxt/' || quote_ident(current_user))::aclitem, '', '{}', '(,)'`,
}

const typeSetup = `CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TYPE pair AS (a int, b text);`

func insertTypeRows(t *testing.T, cs string, base int) {
	t.Helper()
	var stmts []string
	for i, r := range typeRows {
		stmts = append(stmts, fmt.Sprintf("INSERT INTO types (%s) VALUES (%d, %s)", typeNames, base+i+1, r))
	}
	pgtest.ExecAll(t, cs, stmts...)
}

// TestTypes: rows copied and the same rows streamed carry the same columns, byte for byte, in
// the text and in the binary format, and the copy describes the table and its types exactly as
// the stream's Relation and Type messages do. The rows written after the slot was created are
// not copied.
func TestTypes(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		for _, binary := range []bool{false, true} {
			t.Run(map[bool]string{false: "text", true: "binary"}[binary], func(t *testing.T) {
				db := pgtest.NewDatabase(t, srv)
				cs := srv.ConnString(db)
				ctx := pgtest.Context(t, 2*time.Minute)
				pgtest.ExecAll(t, cs, typeSetup, "CREATE TABLE types ("+typeColumns+")", "CREATE PUBLICATION pub FOR TABLE types")
				insertTypeRows(t, cs, 0)
				conn, snap, _ := connectSlot(ctx, t, srv, db, "s", binary, "pub")
				insertTypeRows(t, cs, 1000) // after the consistent point: streamed, not copied

				var mu sync.Mutex
				copied := map[int]decoding.Tuple{}
				var table *snapshot.Table
				types := map[uint32]*decoding.DataType{}
				res, err := snapshot.Copy(ctx, snapshot.Config{ConnString: cs, Publications: []string{"pub"}, Binary: binary}, snap,
					func(ctx context.Context, c *snapshot.Chunk) error {
						for m, err := range c.Changes() {
							if err != nil {
								return err
							}
							ins := m.Msg.(*decoding.Insert)
							id := tupleID(t, ins.New[0])
							mu.Lock()
							copied[id] = cloneTuple(ins.New)
							table = c.Table
							for _, col := range c.Table.Relation.Columns {
								if dt, ok := m.Schema.Type(col.TypeOID); ok {
									types[col.TypeOID] = dt
								}
							}
							mu.Unlock()
						}
						return nil
					})
				if err != nil {
					t.Fatal(err)
				}
				if res.Rows != int64(len(typeRows)) || len(copied) != len(typeRows) {
					t.Fatalf("copied %d rows (%d distinct), want %d", res.Rows, len(copied), len(typeRows))
				}

				s, err := conn.StartStreaming(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close(ctx)
				streamed := map[int]decoding.Tuple{}
				for len(streamed) < len(typeRows) {
					x, err := s.Next(ctx)
					if err != nil {
						t.Fatal(err)
					}
					for m, err := range x.Changes() {
						if err != nil {
							t.Fatal(err)
						}
						ins, ok := m.Msg.(*decoding.Insert)
						if !ok {
							continue
						}
						streamed[tupleID(t, ins.New[0])] = cloneTuple(ins.New)
						rel := m.Relation
						want := *rel
						want.Xid = 0
						if !reflect.DeepEqual(*table.Relation, want) {
							t.Errorf("copy describes the table as\n%+v\nthe stream as\n%+v", *table.Relation, want)
						}
						for _, col := range rel.Columns {
							dt, ok := m.Schema.Type(col.TypeOID)
							if ok {
								w := *dt
								w.Xid = 0
								dt = &w
							}
							if got := types[col.TypeOID]; !reflect.DeepEqual(got, dt) {
								t.Errorf("column %s: copy describes its type as %+v, the stream as %+v", col.Name, got, dt)
							}
						}
					}
					s.Ack(x)
				}
				if len(types) != 4 {
					t.Errorf("types described: %v, want mood, posint, _mood and pair", types)
				}
				for i := range typeRows {
					c, s := copied[i+1], streamed[1000+i+1]
					if c == nil || s == nil {
						t.Fatalf("row %d: copied %v, streamed %v", i+1, c != nil, s != nil)
					}
					if len(c) != len(s) {
						t.Fatalf("row %d: %d columns copied, %d streamed", i+1, len(c), len(s))
					}
					for j := 1; j < len(c); j++ {
						name := table.Relation.Columns[j].Name
						if c[j].Kind != s[j].Kind || !bytes.Equal(c[j].Data, s[j].Data) {
							t.Errorf("row %d column %s: copied %c %q, streamed %c %q", i+1, name,
								c[j].Kind, trim(c[j].Data), s[j].Kind, trim(s[j].Data))
						}
					}
				}
				// The column without a send function is text in both formats.
				for j, col := range table.Relation.Columns {
					if col.Name == "acl" && copied[1][j].Kind != decoding.ColumnText {
						t.Errorf("aclitem copied as %c", copied[1][j].Kind)
					}
					if col.Name == "g" {
						t.Errorf("the generated column is published")
					}
				}
			})
		}
	})
}

func tupleID(t *testing.T, c decoding.Column) int {
	t.Helper()
	switch c.Kind {
	case decoding.ColumnText:
		id, err := strconv.Atoi(string(c.Data))
		if err != nil {
			t.Fatal(err)
		}
		return id
	case decoding.ColumnBinary:
		if len(c.Data) != 4 {
			t.Fatalf("binary int4 of %d bytes", len(c.Data))
		}
		return int(int32(uint32(c.Data[0])<<24 | uint32(c.Data[1])<<16 | uint32(c.Data[2])<<8 | uint32(c.Data[3])))
	}
	t.Fatalf("id column of kind %c", c.Kind)
	return 0
}

func cloneTuple(t decoding.Tuple) decoding.Tuple {
	out := make(decoding.Tuple, len(t))
	for i, c := range t {
		out[i] = decoding.Column{Kind: c.Kind, Data: bytes.Clone(c.Data)}
	}
	return out
}

func trim(b []byte) string {
	if len(b) > 60 {
		return string(b[:60]) + "..."
	}
	return string(b)
}

// TestConcurrentWrites: a table split in chunks over three workers is copied while a writer
// inserts, updates (also the key) and deletes rows, copied and not yet copied, before the slot
// exists, between its creation and the copy, during the copy (each chunk waits for writes while
// its COPY is open) and after it. The stream is started as soon as Open returns, so the copy
// runs after the replication connection moved on. Copy then stream, applied to a map, must
// find every change exactly once (an insert of a key already there, or an update or delete of
// a key not there, fails) and equal the table at the end. Text format on PostgreSQL 15, binary
// on 18.
func TestConcurrentWrites(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		binary := srv.Major() >= 18
		db := pgtest.NewDatabase(t, srv)
		cs := srv.ConnString(db)
		ctx := pgtest.Context(t, 3*time.Minute)
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		const n = 12000
		pgtest.ExecAll(t, cs, `CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL, pad text NOT NULL)`,
			`CREATE TABLE done (id int PRIMARY KEY)`,
			fmt.Sprintf(`INSERT INTO big SELECT i, 0, md5(i::text) || md5((-i)::text) FROM generate_series(1, %d) i`, n),
			`CREATE PUBLICATION pub FOR TABLE big, done`)
		w := startWriter(ctx, t, cs, seed, 2*n, "big")
		must(t, w.waitFor(ctx, 20))
		conn, snap, _ := connectSlot(ctx, t, srv, db, "s", binary, "pub")
		must(t, w.waitFor(ctx, 20))
		sess, err := snapshot.Open(ctx, snapshot.Config{ConnString: cs, Publications: []string{"pub"}, Workers: 3,
			ChunkSize: 64 << 10, Binary: binary}, snap)
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close(ctx)
		// Every worker holds the snapshot: the replication connection may move on.
		s, err := conn.StartStreaming(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		if sess.Workers() != 3 {
			t.Errorf("%d workers, want 3", sess.Workers())
		}
		m := newRowModel()
		var mu sync.Mutex
		workers := map[int]int{}
		res, err := sess.Run(ctx, func(ctx context.Context, c *snapshot.Chunk) error {
			dec := pgvalue.NewDecoder(nil)
			first := true
			for ch, err := range dec.Changes(c) {
				if err != nil {
					return err
				}
				if first {
					first = false
					if err := w.waitFor(ctx, 3); err != nil {
						return err
					}
				}
				if err := m.apply(ch); err != nil {
					return err
				}
			}
			mu.Lock()
			workers[c.Worker]++
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := sess.Close(ctx); err != nil {
			t.Fatal(err)
		}
		copied := m.keys("public.big")
		diagnose = func(t *testing.T, e *modelError) {
			keys, before, after := w.keysBefore("big", n, m.streamed())
			var missing, extra []string
			for k := range keys {
				if !copied[strconv.Itoa(k)] {
					missing = append(missing, strconv.Itoa(k))
				}
			}
			for k := range copied {
				if id, _ := strconv.Atoi(k); !keys[id] {
					extra = append(extra, k)
				}
			}
			t.Logf("consistent point %s: %d rows by the writer's log, %d copied; missing from the copy %v, extra %v; "+
				"last transactions not streamed %v, first streamed %v", snap.ConsistentPoint, len(keys), len(copied), missing, extra, before, after)
			for _, op := range w.ops(e.key) {
				t.Log(op)
			}
		}
		defer func() { diagnose = nil }()
		var big *snapshot.Table
		for _, tab := range res.Tables {
			if tab.Name == "big" {
				big = tab
			}
		}
		if big == nil || big.Chunks < 6 {
			t.Fatalf("big was copied in %v chunks, want several", big)
		}
		if len(workers) < 2 {
			t.Errorf("chunks per worker: %v; want them spread", workers)
		}
		t.Logf("copied %d rows in %d chunks of big (%d bytes), chunks per worker %v", res.Rows, big.Chunks, big.Size, workers)
		must(t, w.waitFor(ctx, 20))
		w.stop()
		t.Logf("writer: %s", w)
		pgtest.ExecAll(t, cs, `INSERT INTO done VALUES (1)`)
		streamInto(ctx, t, s, m, []*snapshot.Result{res}, isDone, nil)
		checkModel(ctx, t, cs, m, "public.big", "SELECT * FROM big", 0)
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
