package pgvalue_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The table of many types the tests stream; big is stored out of line, so an update that does
// not touch it sends it as an unchanged TOASTed value.
const typedSetup = `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE TABLE typed (
	id int PRIMARY KEY, i2 int2, i4 int4, i8 int8, num numeric, num_s numeric(10,3), f4 float4, f8 float8,
	t text, vc varchar(10), b bytea, bo bool, d date, ts timestamp, tstz timestamptz, iv interval,
	u uuid, j json, jb jsonb, ai int4[], at text[], m mood, dom posint, big text);
ALTER TABLE typed ALTER big SET STORAGE EXTERNAL;
CREATE PUBLICATION pub FOR TABLE typed;
SELECT pg_create_logical_replication_slot('text_slot', 'pgoutput');
SELECT pg_create_logical_replication_slot('binary_slot', 'pgoutput');`

const typedWorkload = `
INSERT INTO typed VALUES (1, 32767, 2147483647, 9223372036854775807,
	'123456789012345678901234567890.123456789', 1.5, '3.4028235e38', '1.7976931348623157e308',
	E'h\u00e9llo "w\u00f6rld" \\ \U0001F600', 'abc', '\x00ff10', true, '2024-02-29',
	'2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789012+02', '1 year 2 mons 3 days 04:05:06.789',
	'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a":[1,2,{"b":null}],"c":"d"}', '{"x": 1.5, "y": [true, false]}',
	'{1,NULL,3}', '{"a b","c\"d",NULL}', 'happy', 7, repeat('x', 10000));
INSERT INTO typed VALUES (2, -32768, -2147483648, -9223372036854775808, 'NaN', -0.001, '-Infinity', 'NaN',
	'', '', '', false, 'infinity', '-infinity', 'infinity', '-1 days -00:00:01',
	'00000000-0000-0000-0000-000000000000', 'null', '[]', '{}', '{}', 'sad', 1, 'small');
INSERT INTO typed VALUES (3, 0, 0, 0, 'Infinity', 0, '1.17549435e-38', '5e-324',
	'line1
line2	tab', 'x', '\x', true, '1970-01-01', '1970-01-01 00:00:00', '1999-12-31 23:59:59.999999-08', '0',
	'ffffffff-ffff-ffff-ffff-ffffffffffff', '"s"', '{"k": {"n": [1, 2.5e10]}}', '{{1,2},{3,4}}', '{"{}"}', 'ok', 2147483647, NULL);
INSERT INTO typed (id) VALUES (4);
UPDATE typed SET i4 = 5 WHERE id = 1;
DELETE FROM typed WHERE id = 2;`

// peek reads a slot's messages with the SQL interface, binary column values or not.
func peek(t *testing.T, ctx context.Context, conn *pgx.Conn, slot string, binary bool) []capture {
	rows, err := conn.Query(ctx, `SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '2', 'publication_names', 'pub', 'binary', $2)`, slot, fmt.Sprint(binary))
	require.NoError(t, err)
	defer rows.Close()
	var recs []capture
	for rows.Next() {
		var lsn string
		var data []byte
		require.NoError(t, rows.Scan(&lsn, &data))
		l, err := decoding.ParseLSN(lsn)
		require.NoError(t, err)
		recs = append(recs, capture{l, data})
	}
	require.NoError(t, rows.Err())
	return recs
}

type capture struct {
	lsn  decoding.LSN
	data []byte
}

// decoded is what the tests keep of one column of one change.
type decoded struct {
	name, typeName, typeSchema string
	key, null, unchanged       bool
	kind                       byte
	value                      any
	err                        error
}

type change struct {
	op       decoding.MessageType
	relation string
	identity byte
	old, new []decoded
}

// decodeAll reorders the captured messages and decodes every change with dec.
func decodeAll(t *testing.T, recs []capture, dec *pgvalue.Decoder) []change {
	b, err := reorderbuffer.New(reorderbuffer.Config{Dir: t.TempDir(), WorkMem: 64 << 10})
	require.NoError(t, err)
	defer b.Close()
	var out []change
	row := func(r pgvalue.Row) []decoded {
		var cols []decoded
		for c := range r.Columns() {
			v, err := c.Value()
			cols = append(cols, decoded{name: c.Name, typeName: c.TypeName(), typeSchema: c.TypeSchema(),
				key: c.Key, null: c.Null(), unchanged: c.Unchanged(), kind: c.Kind, value: v, err: err})
		}
		return cols
	}
	for _, r := range recs {
		require.NoError(t, b.Add(r.lsn, r.data))
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			for m, err := range x.Changes() {
				require.NoError(t, err)
				ch, ok, err := dec.Change(m.Schema, m.Msg)
				require.NoError(t, err)
				if !ok {
					continue
				}
				c := change{op: ch.Op, relation: ch.Relation.Namespace + "." + ch.Relation.Name,
					identity: ch.Relation.ReplicaIdentity, old: row(ch.Old), new: row(ch.New)}
				out = append(out, c)
			}
			require.NoError(t, b.Ack(x))
		}
	}
	return out
}

// selectRows returns what pgx gives for the table's rows, by id, as Rows.Values decodes them.
func selectRows(t *testing.T, ctx context.Context, conn *pgx.Conn) map[int32]map[string]any {
	rows, err := conn.Query(ctx, `SELECT * FROM typed ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[int32]map[string]any{}
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		m := map[string]any{}
		for i, fd := range rows.FieldDescriptions() {
			m[fd.Name] = vals[i]
		}
		out[m["id"].(int32)] = m
	}
	require.NoError(t, rows.Err())
	return out
}

// TestAgainstSelect streams a table of many types in the text and in the binary format and
// checks that every decoded value equals what pgx returns for the same row with a SELECT.
func TestAgainstSelect(t *testing.T) {
	for _, major := range pgtest.Majors(t) {
		if major != 15 && major != 18 {
			continue
		}
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			conn, err := pgx.Connect(ctx, srv.ConnString(db))
			require.NoError(t, err)
			defer conn.Close(ctx)
			for _, sql := range strings.Split(typedSetup, ";\n") {
				_, err = conn.Exec(ctx, sql)
				require.NoError(t, err, sql)
			}
			for _, sql := range strings.Split(typedWorkload, ";\n") {
				_, err = conn.Exec(ctx, sql)
				require.NoError(t, err, sql)
			}
			// Rows 1 and 3 as they are now; row 2 as it was before the delete (re-inserted in a
			// rolled-back transaction to read it).
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `INSERT INTO typed VALUES (2, -32768, -2147483648, -9223372036854775808, 'NaN', -0.001,
				'-Infinity', 'NaN', '', '', '', false, 'infinity', '-infinity', 'infinity', '-1 days -00:00:01',
				'00000000-0000-0000-0000-000000000000', 'null', '[]', '{}', '{}', 'sad', 1, 'small')`)
			require.NoError(t, err)
			plain := selectRows(t, ctx, conn)
			// The same with the enum and domain types loaded into pgx's map, as pgx users do.
			mood, err := conn.LoadType(ctx, "mood")
			require.NoError(t, err)
			conn.TypeMap().RegisterType(mood)
			loaded := selectRows(t, ctx, conn)
			require.NoError(t, tx.Rollback(ctx))

			textRecs := peek(t, ctx, conn, "text_slot", false)
			binRecs := peek(t, ctx, conn, "binary_slot", true)
			withMood := pgtype.NewMap()
			withMood.RegisterType(mood)
			for _, tc := range []struct {
				name   string
				recs   []capture
				m      *pgtype.Map
				want   map[int32]map[string]any
				binary bool
			}{
				{"text", textRecs, nil, plain, false},
				{"binary", binRecs, nil, plain, true},
				{"text, enum registered", textRecs, withMood, loaded, false},
				{"binary, enum registered", binRecs, withMood, loaded, true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					changes := decodeAll(t, tc.recs, pgvalue.NewDecoder(tc.m))
					require.Len(t, changes, 6)
					for i, ch := range changes {
						require.Equal(t, "public.typed", ch.relation)
						require.Equal(t, byte('d'), ch.identity)
						wantOp := []decoding.MessageType{'I', 'I', 'I', 'I', 'U', 'D'}[i]
						require.Equal(t, wantOp, ch.op, "change %d", i)
						cols := ch.new
						if ch.op == decoding.MsgDelete {
							cols = ch.old
							require.Empty(t, ch.new)
						}
						require.Len(t, cols, 24)
						id := cols[0].value.(int32)
						want := tc.want[id]
						require.NotNil(t, want, "row %d", id)
						for _, c := range cols {
							if c.unchanged {
								require.ErrorIs(t, c.err, pgvalue.ErrUnchanged)
							} else {
								require.NoError(t, c.err, c.name)
							}
							if !c.null && !c.unchanged {
								require.Equal(t, map[bool]byte{false: 't', true: 'b'}[tc.binary], c.kind, "format of %s", c.name)
							}
							switch {
							case c.name == "i4" && id == 1: // updated from the maximum to 5
								require.Equal(t, map[decoding.MessageType]any{'I': int32(math.MaxInt32), 'U': int32(5)}[ch.op], c.value)
							case ch.op == decoding.MsgUpdate && c.name == "big":
								require.True(t, c.unchanged, "big is an unchanged TOASTed value")
								require.Nil(t, c.value)
							case ch.op == decoding.MsgDelete && c.name != "id":
								require.True(t, c.null, "%s: a delete sends the key only", c.name)
							case tc.binary && tc.m == nil && c.name == "m" && want["m"] != nil:
								// pgx too returns binary data of a type it does not know as bytes.
								require.Equal(t, []byte(want["m"].(string)), c.value)
							default:
								require.True(t, same(c.value, want[c.name]), "row %d column %s: decoded %#v, SELECT gave %#v",
									id, c.name, c.value, want[c.name])
							}
						}
						// Names, types and the key.
						names := map[string]decoded{}
						for _, c := range cols {
							names[c.name] = c
						}
						require.True(t, names["id"].key)
						require.False(t, names["i4"].key)
						for col, typ := range map[string]string{"id": "int4", "i2": "int2", "i8": "int8", "num": "numeric",
							"f4": "float4", "b": "bytea", "tstz": "timestamptz", "iv": "interval", "u": "uuid", "jb": "jsonb",
							"ai": "_int4", "at": "_text", "vc": "varchar", "m": "mood",
							"dom": "int4"} { // a domain: the server names its base type
							require.Equal(t, typ, names[col].typeName, col)
						}
						require.Equal(t, "public", names["m"].typeSchema)
						require.Equal(t, "pg_catalog", names["i8"].typeSchema)
					}
				})
			}
		})
	}
}

// same compares a decoded value with pgx's: time.Time by instant, NaN equal to NaN, numerics by
// value (the text and binary formats can scale them differently), containers element by element.
func same(a, b any) bool {
	switch a := a.(type) {
	case time.Time:
		bt, ok := b.(time.Time)
		return ok && a.Equal(bt)
	case float32:
		bf, ok := b.(float32)
		return ok && (a == bf && math.Signbit(float64(a)) == math.Signbit(float64(bf)) || a != a && bf != bf)
	case float64:
		bf, ok := b.(float64)
		return ok && (a == bf && math.Signbit(a) == math.Signbit(bf) || a != a && bf != bf)
	case pgtype.Numeric:
		bn, ok := b.(pgtype.Numeric)
		if !ok || a.Valid != bn.Valid || a.NaN != bn.NaN || a.InfinityModifier != bn.InfinityModifier {
			return false
		}
		if a.NaN || a.InfinityModifier != pgtype.Finite || !a.Valid {
			return true
		}
		return rat(a).Cmp(rat(bn)) == 0
	case []any:
		bs, ok := b.([]any)
		if !ok || len(a) != len(bs) {
			return false
		}
		for i := range a {
			if !same(a[i], bs[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return false
		}
		for k, v := range a {
			if w, ok := bm[k]; !ok || !same(v, w) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func rat(n pgtype.Numeric) *big.Rat {
	r := new(big.Rat).SetInt(n.Int)
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(n.Exp, -n.Exp))), nil)
	if n.Exp >= 0 {
		return r.Mul(r, new(big.Rat).SetInt(p))
	}
	return r.Quo(r, new(big.Rat).SetInt(p))
}

// TestZeroAllocs: reading names, kinds and raw bytes of every column allocates nothing.
func TestZeroAllocs(t *testing.T) {
	b, txn := committed(
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: pgtype.Int4OID}, {Name: "v", TypeOID: pgtype.TextOID}}},
		&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("1")}, {Kind: 't', Data: []byte("x")}}},
	)
	defer b.Close()
	dec := pgvalue.NewDecoder(nil)
	var ins decoding.Message
	rels := testSchema{} // the schema at the end of the transaction
	for c, err := range txn.Changes() {
		require.NoError(t, err)
		rels.add(c.Msg)
		if m := c.Msg; m.Type() == decoding.MsgInsert {
			cp := *m.(*decoding.Insert)
			cp.New = append(decoding.Tuple(nil), cp.New...)
			ins = &cp
		}
	}
	require.NotNil(t, ins)
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		ch, ok, err := dec.Change(rels, ins)
		if err != nil || !ok {
			panic(err)
		}
		for c := range ch.New.Columns() {
			n += len(c.Name) + len(c.Data) + int(c.TypeOID) + len(c.TypeName())
			if c.Key || c.Null() || c.Unchanged() {
				n++
			}
		}
	})
	require.Zero(t, allocs)
	require.NotZero(t, n)
}

func TestErrors(t *testing.T) {
	b, txn := committed(
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t",
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "id", TypeOID: pgtype.Int4OID}}},
	)
	defer b.Close()
	schema := testSchema{} // the schema at the end of the transaction
	for c, err := range txn.Changes() {
		require.NoError(t, err)
		schema.add(c.Msg)
	}
	dec := pgvalue.NewDecoder(nil)
	_, _, err := dec.Change(schema, &decoding.Insert{RelationID: 2, New: decoding.Tuple{{Kind: 'n'}}})
	require.ErrorIs(t, err, pgvalue.ErrUnknownRelation)
	_, _, err = dec.Change(schema, &decoding.Truncate{RelationIDs: []uint32{1, 2}})
	require.ErrorIs(t, err, pgvalue.ErrUnknownRelation)
	_, _, err = dec.Change(schema, &decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 'n'}, {Kind: 'n'}}})
	require.ErrorIs(t, err, pgvalue.ErrTupleShape)
	_, ok, err := dec.Change(schema, &decoding.LogicalMessage{Prefix: "p"})
	require.NoError(t, err)
	require.False(t, ok)

	ch, ok, err := dec.Change(schema, &decoding.Update{RelationID: 1, New: decoding.Tuple{{Kind: 'b', Data: []byte{1, 2}}}})
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, ch.Old.Present())
	_, err = ch.New.Column(0).Value()
	var ve *pgvalue.ValueError
	require.ErrorAs(t, err, &ve, "two bytes are not a binary int4")
	require.Equal(t, "id", ve.Column)

	ch, _, err = dec.Change(schema, &decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 'u'}}})
	require.NoError(t, err)
	_, err = ch.New.Column(0).Value()
	require.ErrorIs(t, err, pgvalue.ErrUnchanged)
	var v int32
	require.ErrorIs(t, ch.New.Column(0).Scan(&v), pgvalue.ErrUnchanged)

	// Values: every column but the unchanged one, NULL as nil.
	b3, txn3 := committed(
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "t", Columns: []decoding.RelationColumn{
			{Flags: 1, Name: "id", TypeOID: pgtype.Int4OID}, {Name: "n", TypeOID: pgtype.TextOID}, {Name: "big", TypeOID: pgtype.TextOID}}},
		&decoding.Update{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("3")}, {Kind: 'n'}, {Kind: 'u'}}},
	)
	defer b3.Close()
	for ch, err := range dec.Changes(txn3) {
		require.NoError(t, err)
		vals, err := ch.New.Values()
		require.NoError(t, err)
		require.Equal(t, map[string]any{"id": int32(3), "n": nil}, vals)
		var s *string
		n, ok := ch.New.Lookup("n")
		require.True(t, ok)
		require.NoError(t, n.Scan(&s), "NULL into a pointer")
		require.Nil(t, s)
		_, ok = ch.New.Lookup("nope")
		require.False(t, ok)
	}

	// The zero Column neither panics nor decodes.
	var zero pgvalue.Column
	require.Equal(t, "", zero.TypeName())
	require.Error(t, zero.Scan(&v))

	ch, _, err = dec.Change(schema, &decoding.Truncate{Options: decoding.TruncateCascade, RelationIDs: []uint32{1}})
	require.NoError(t, err)
	require.Equal(t, decoding.MsgTruncate, ch.Op)
	require.True(t, ch.Cascade)
	require.False(t, ch.RestartIdentity)
	require.Len(t, ch.Relations, 1)
}

// TestChanges: the iterator yields the row changes and truncates only, named by String.
func TestChanges(t *testing.T) {
	b, txn := committed(
		&decoding.Relation{RelationID: 1, Namespace: "public", Name: "a", Columns: []decoding.RelationColumn{{Name: "id", TypeOID: pgtype.Int4OID}}},
		&decoding.Relation{RelationID: 2, Name: "b", Columns: []decoding.RelationColumn{{Name: "id", TypeOID: pgtype.Int4OID}}},
		&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("1")}}},
		&decoding.LogicalMessage{Flags: 1, Prefix: "p", Content: []byte("c")},
		&decoding.Delete{RelationID: 2, OldKind: 'K', Old: decoding.Tuple{{Kind: 't', Data: []byte("2")}}},
		&decoding.Truncate{RelationIDs: []uint32{1, 2}},
	)
	defer b.Close()
	var got []string
	for ch, err := range pgvalue.NewDecoder(nil).Changes(txn) {
		require.NoError(t, err)
		got = append(got, ch.String())
	}
	require.Equal(t, []string{"Insert public.a", "Delete pg_catalog.b", "Truncate public.a, pg_catalog.b"}, got)

	b2, txn2 := committed(&decoding.Insert{RelationID: 9, New: decoding.Tuple{{Kind: 'n'}}})
	defer b2.Close()
	n := 0
	for _, err := range pgvalue.NewDecoder(nil).Changes(txn2) {
		require.ErrorIs(t, err, pgvalue.ErrUnknownRelation)
		n++
	}
	require.Equal(t, 1, n, "iteration stops after the error")
}

// testSchema is a decoding.Schema of the relations a test's stream described last.
type testSchema map[uint32]*decoding.Relation

func (s testSchema) add(m decoding.Message) {
	if r, ok := m.(*decoding.Relation); ok {
		s[r.RelationID] = r
	}
}

func (s testSchema) Relation(id uint32) (*decoding.Relation, bool) { r, ok := s[id]; return r, ok }
func (s testSchema) Type(uint32) (*decoding.DataType, bool)        { return nil, false }
