package format_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

// TestEventsMatchWriter: Events gives the debezium format's lines one at a time, each with its
// key (the primary key's columns, typed; the prefix of a message; none for a truncate).
func TestEventsMatchWriter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := pgtest.Shared(t, pgtest.Majors(t)[len(pgtest.Majors(t))-1])
	db := pgtest.NewDatabase(t, srv)
	conn, err := pgx.Connect(ctx, srv.ConnString(db))
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, sql := range []string{
		`CREATE TABLE k (a int, b text, v text, PRIMARY KEY (a, b))`,
		`CREATE TABLE nokey (v text)`,
		`ALTER TABLE nokey REPLICA IDENTITY NOTHING`,
		`CREATE PUBLICATION pub FOR TABLE k, nokey`,
		`SELECT pg_create_logical_replication_slot('s', 'pgoutput')`,
		`INSERT INTO k VALUES (1, 'x', 'one'), (2, 'y"', 'two')`,
		`INSERT INTO nokey VALUES ('n')`,
		`UPDATE k SET v = 'uno' WHERE a = 1`,
		`DELETE FROM k WHERE a = 2`,
		`SELECT pg_logical_emit_message(true, 'pfx', 'hello')`,
		`TRUNCATE k`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	read := func(each func(x *reorderbuffer.Txn)) {
		rows, err := conn.Query(ctx, `SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL,
			'proto_version', '2', 'publication_names', 'pub', 'messages', 'true')`)
		require.NoError(t, err)
		defer rows.Close()
		b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir()})
		require.NoError(t, err)
		defer b.Close()
		for rows.Next() {
			var lsn string
			var data []byte
			require.NoError(t, rows.Scan(&lsn, &data))
			l, err := decoding.ParseLSN(lsn)
			require.NoError(t, err)
			require.NoError(t, b.Add(l, data))
			for x, ok := b.Next(); ok; x, ok = b.Next() {
				each(x)
			}
		}
		require.NoError(t, rows.Err())
	}
	var out bytes.Buffer
	w := format.NewWriter(&out, format.Config{Kind: format.KindDebezium, Now: fixedNow})
	defer w.Close()
	read(func(x *reorderbuffer.Txn) { require.NoError(t, w.WriteTxn(x)) })
	ev := format.NewEvents(format.Config{Now: fixedNow})
	var lines, keys []string
	read(func(x *reorderbuffer.Txn) {
		_, err := ev.Txn(ctx, x, func(e format.Event) error {
			lines = append(lines, string(e.Value))
			keys = append(keys, fmt.Sprintf("%c %s", e.Op, e.Key))
			return nil
		})
		require.NoError(t, err)
	})
	require.Equal(t, strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"), lines)
	require.Equal(t, []string{`c {"a":1,"b":"x"}`, `c {"a":2,"b":"y\""}`, `c `, `u {"a":1,"b":"x"}`,
		`d {"a":2,"b":"y\""}`, `m {"prefix":"pfx"}`, `t `}, keys)
}

// tablesOf is a format.Tables of fixed answers, by table name.
type tablesOf map[string]*format.Table

func (m tablesOf) Table(_ context.Context, r *decoding.Relation) (*format.Table, error) {
	return m[r.Name], nil
}

// TestEventsKeys: a row's key is its primary key whatever the replica identity (with Tables),
// an update carries the old row or key the server sent in before, and a change of key is a
// delete of the old key and a create of the new one, linked by headers, as Debezium writes them.
func TestEventsKeys(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	txt := func(s string) decoding.Column { return decoding.Column{Kind: 't', Data: []byte(s)} }
	null := decoding.Column{Kind: 'n'}
	// full: REPLICA IDENTITY FULL with a primary key (id); keyed: the default identity (id);
	// nokey: FULL, no key at all.
	full := &decoding.Relation{RelationID: 10, Namespace: "public", Name: "full", ReplicaIdentity: 'f',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}, {Flags: 1, Name: "v", TypeOID: 25}}}
	keyed := &decoding.Relation{RelationID: 11, Namespace: "public", Name: "keyed", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: 23}, {Name: "v", TypeOID: 25}, {Name: "w", TypeOID: 23}}}
	nokey := &decoding.Relation{RelationID: 12, Namespace: "public", Name: "nokey", ReplicaIdentity: 'f',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "v", TypeOID: 25}}}
	tables := tablesOf{
		"full":  {Key: []string{"id"}, Columns: map[string]format.TableColumn{"id": {NotNull: true}}},
		"keyed": {Key: []string{"id"}, Columns: map[string]format.TableColumn{"id": {NotNull: true}, "v": {NotNull: true, TypeName: "text"}}},
		"nokey": {},
	}
	msgs := []decoding.Message{
		&decoding.Begin{FinalLSN: 0x2F00, CommitTime: at, Xid: 700},
		full, keyed, nokey,
		&decoding.Insert{RelationID: 10, New: decoding.Tuple{txt("1"), txt("a")}},
		&decoding.Update{RelationID: 10, OldKind: 'O', Old: decoding.Tuple{txt("1"), txt("a")}, New: decoding.Tuple{txt("1"), txt("b")}},
		&decoding.Update{RelationID: 10, OldKind: 'O', Old: decoding.Tuple{txt("1"), txt("b")}, New: decoding.Tuple{txt("2"), txt("b")}},
		&decoding.Delete{RelationID: 10, OldKind: 'O', Old: decoding.Tuple{txt("2"), txt("b")}},
		&decoding.Update{RelationID: 11, OldKind: 'K', Old: decoding.Tuple{txt("5"), null, null}, New: decoding.Tuple{txt("-5"), txt("x"), null}},
		&decoding.Update{RelationID: 11, New: decoding.Tuple{txt("-5"), txt("y"), null}},
		&decoding.Insert{RelationID: 12, New: decoding.Tuple{txt("n")}},
		&decoding.Update{RelationID: 12, OldKind: 'O', Old: decoding.Tuple{txt("n")}, New: decoding.Tuple{txt("m")}},
		&decoding.Commit{CommitLSN: 0x2F00, EndLSN: 0x2F30, CommitTime: at},
	}
	type got struct{ Op, Key, Before, After, Headers string }
	var events []got
	ev := format.NewEvents(format.Config{Now: fixedNow, Tables: tables})
	feed(t, msgs, func(x *reorderbuffer.Txn) error {
		_, err := ev.Txn(context.Background(), x, func(e format.Event) error {
			v := parseObject(t, string(e.Value))
			j := func(k string) string {
				b, err := json.Marshal(v[k])
				require.NoError(t, err)
				return string(b)
			}
			var hs []string
			for _, h := range e.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			events = append(events, got{string(e.Op), string(e.Key), j("before"), j("after"), strings.Join(hs, " ")})
			return nil
		})
		return err
	})
	require.Equal(t, []got{
		{"c", `{"id":1}`, `null`, `{"id":1,"v":"a"}`, ""},
		{"u", `{"id":1}`, `{"id":1,"v":"a"}`, `{"id":1,"v":"b"}`, ""},
		{"d", `{"id":1}`, `{"id":1,"v":"b"}`, `null`, `__debezium.newkey={"id":2}`},
		{"c", `{"id":2}`, `null`, `{"id":2,"v":"b"}`, `__debezium.oldkey={"id":1}`},
		{"d", `{"id":2}`, `{"id":2,"v":"b"}`, `null`, ""},
		// The default identity: the old key, its NOT NULL column as Debezium fills it ("").
		{"d", `{"id":5}`, `{"id":5,"v":"","w":null}`, `null`, `__debezium.newkey={"id":-5}`},
		{"c", `{"id":-5}`, `null`, `{"id":-5,"v":"x","w":null}`, `__debezium.oldkey={"id":5}`},
		{"u", `{"id":-5}`, `null`, `{"id":-5,"v":"y","w":null}`, ""},
		{"c", ``, `null`, `{"v":"n"}`, ""},
		{"u", ``, `{"v":"n"}`, `{"v":"m"}`, ""},
	}, events)

	// Without Tables, the key is the replica identity's columns, and the debezium format's
	// lines (one per change: a change of key is an update) carry the old key in before.
	var out bytes.Buffer
	w := format.NewWriter(&out, format.Config{Kind: format.KindDebezium, Now: fixedNow})
	defer w.Close()
	feed(t, msgs, w.WriteTxn)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 8)
	for i, want := range map[int]string{1: `{"id":1,"v":"a"}`, 2: `{"id":1,"v":"b"}`, 4: `{"id":5,"v":null,"w":null}`, 5: `null`} {
		b, err := json.Marshal(parseObject(t, lines[i])["before"])
		require.NoError(t, err)
		require.Equal(t, want, string(b), "line %d", i)
	}
}
