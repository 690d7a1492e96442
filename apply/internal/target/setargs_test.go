package target

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestColumnArray sends the arrays of set statements to real servers and reads their elements
// back: those that columnArray sends in the binary format must mean to the server what their
// text does, and a value the binary form cannot carry (an integer out of the column's range, a
// text array_in reads but an integer parse does not) goes as text, so that the server reads it
// (or refuses it) as before.
func TestColumnArray(t *testing.T) {
	null := (*string)(nil)
	s := func(v string) *string { return &v }
	cases := []struct {
		name     string
		arrayOID uint32
		values   []*string
		format   int16
		want     []*string // nil: the values themselves
		refused  bool      // the server refuses the array
	}{
		{"int2", pgtype.Int2ArrayOID, []*string{s("0"), s("-32768"), s("32767"), null}, 1, nil, false},
		{"int2 out of range", pgtype.Int2ArrayOID, []*string{s("1"), s("40000")}, 0, nil, true},
		{"int4", pgtype.Int4ArrayOID, []*string{s("-2147483648"), s("2147483647"), s("+7"), s("007"), null}, 1,
			[]*string{s("-2147483648"), s("2147483647"), s("7"), s("7"), null}, false},
		{"int4 spaces", pgtype.Int4ArrayOID, []*string{s(" 5 "), s("6")}, 0, []*string{s("5"), s("6")}, false},
		{"int4 not a number", pgtype.Int4ArrayOID, []*string{s("x")}, 0, nil, true},
		{"int8", pgtype.Int8ArrayOID, []*string{s("-9223372036854775808"), s("9223372036854775807"), null, s("0")}, 1, nil, false},
		{"text", pgtype.TextArrayOID, []*string{s(""), s(`q"uote`), s(`back\slash`), s("com,ma"), s("{brace}"), s("NULL"), s(" spaced "), s("ü"), null}, 1, nil, false},
		{"varchar", pgtype.VarcharArrayOID, []*string{s("a"), null, s(`"`)}, 1, nil, false},
		{"bpchar", pgtype.BPCharArrayOID, []*string{s("ab   "), s("c"), null}, 1, nil, false},
		{"numeric, as text", pgtype.NumericArrayOID, []*string{s("1.50"), null, s("-2")}, 0, nil, false},
		{"no nulls", pgtype.TextArrayOID, []*string{s("x")}, 1, nil, false},
	}
	pgtest.EachMajor(t, pgtest.Majors(t), func(t *testing.T, srv *Server) {
		ctx := pgtest.Context(t, time.Minute)
		conn, err := pgconn.Connect(ctx, srv.ConnString(pgtest.NewDatabase(t, srv)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				rows := make([]decoding.Tuple, len(tc.values))
				for i, v := range tc.values {
					rows[i] = decoding.Tuple{{Kind: decoding.ColumnNull}}
					if v != nil {
						rows[i] = decoding.Tuple{{Kind: decoding.ColumnText, Data: []byte(*v)}}
					}
				}
				m := &Table{cols: []colMap{{arrayOID: tc.arrayOID, delim: ','}}}
				b, f := columnArray(m, rows, 0)
				if f != tc.format {
					t.Fatalf("format %d, want %d", f, tc.format)
				}
				res := conn.ExecParams(ctx, "SELECT x FROM pg_catalog.unnest($1) WITH ORDINALITY AS u(x, i) ORDER BY i",
					[][]byte{b}, []uint32{tc.arrayOID}, []int16{f}, nil).Read()
				if tc.refused {
					if res.Err == nil {
						t.Fatalf("the server read %d elements, want an error", len(res.Rows))
					}
					return
				}
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				want := tc.want
				if want == nil {
					want = tc.values
				}
				if len(res.Rows) != len(want) {
					t.Fatalf("%d elements, want %d", len(res.Rows), len(want))
				}
				for i, r := range res.Rows {
					if got, w := show(r[0]), show(want[i]); got != w {
						t.Errorf("element %d: %s, want %s", i+1, got, w)
					}
				}
			})
		}
	})
}

// show prints a value or NULL, for comparisons and messages.
func show[T []byte | *string](v T) string {
	switch v := any(v).(type) {
	case []byte:
		if v == nil {
			return "NULL"
		}
		return fmt.Sprintf("%q", v)
	case *string:
		if v == nil {
			return "NULL"
		}
		return fmt.Sprintf("%q", *v)
	}
	return ""
}
