package format_test

import (
	"bytes"
	"context"
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
		_, err := ev.Txn(x, func(e format.Event) error {
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
