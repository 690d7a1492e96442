package format

import (
	"encoding/base64"
	"math/big"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

// TestTwosComplement: Kafka Connect's Decimal holds Java's BigInteger.toByteArray: the shortest
// big-endian two's complement.
func TestTwosComplement(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string // base64
	}{
		{0, "AA=="}, {1, "AQ=="}, {127, "fw=="}, {128, "AIA="}, {255, "AP8="}, {256, "AQA="},
		{-1, "/w=="}, {-128, "gA=="}, {-129, "/38="}, {-50, "zg=="}, {12345, "MDk="}, {150, "AJY="},
	} {
		require.Equal(t, c.want, base64.StdEncoding.EncodeToString(twosComplement(big.NewInt(c.n))), "%d", c.n)
	}
}

func TestRescale(t *testing.T) {
	for _, c := range []struct {
		n        int64
		from, to int
		want     int64
	}{
		{15, 1, 2, 150}, {150, 2, 2, 150}, {125, 2, 1, 12}, {135, 2, 1, 14}, {-125, 2, 1, -12}, {-135, 2, 1, -14}, {126, 2, 1, 13},
	} {
		require.Equal(t, c.want, rescale(big.NewInt(c.n), c.from, c.to).Int64(), "%d at %d to %d", c.n, c.from, c.to)
	}
}

// TestMicroDuration: Debezium's MicroDuration, as its captures show it.
func TestMicroDuration(t *testing.T) {
	for _, c := range []struct {
		iv   pgtype.Interval
		want int64
	}{
		{pgtype.Interval{Months: 14, Days: 3, Microseconds: (4*3600+5*60+6)*1e6 + 789000}, 37091106789000},
		{pgtype.Interval{Days: -1, Microseconds: 1e6}, -86399000000},
		{pgtype.Interval{Months: 1}, 2629800000000},
		{pgtype.Interval{Months: -13, Days: 1}, -34101000000000},
		{pgtype.Interval{Microseconds: 1500000}, 1500000},
		{pgtype.Interval{}, 0},
	} {
		require.Equal(t, c.want, microDuration(c.iv), "%+v", c.iv)
	}
}

// TestZoned: io.debezium.time.ZonedTimestamp has exactly the column's precision in digits.
func TestZoned(t *testing.T) {
	at := time.Date(2024, 2, 29, 12, 34, 56, 780000000, time.UTC)
	require.Equal(t, "2024-02-29T12:34:56.780000Z", string(appendZoned(nil, at, 6)))
	require.Equal(t, "2024-02-29T12:34:56.780Z", string(appendZoned(nil, at, 3)))
	require.Equal(t, "2024-02-29T12:34:56.78Z", string(appendZoned(nil, at, 0)))
	require.Equal(t, "2024-02-29T12:34:56Z", string(appendZoned(nil, at.Truncate(time.Second), 0)))
}

// TestDefaultLiteral: defaults are read off the expression, never evaluated, as Debezium does.
func TestDefaultLiteral(t *testing.T) {
	for _, c := range []struct {
		col  TableColumn
		want string
		ok   bool
	}{
		{TableColumn{Default: "'x'::text", TypeName: "text"}, "x", true},
		{TableColumn{Default: "7", TypeName: "int4"}, "7", true},
		{TableColumn{Default: "'-1'::integer", TypeName: "int4"}, "-1", true},
		{TableColumn{Default: "nextval('t_id_seq'::regclass)", TypeName: "int4"}, "0", true},
		{TableColumn{Default: "md5('x'::text)", TypeName: "text"}, "", true},
		{TableColumn{Default: "(now())::text", TypeName: "text"}, "", true},
		{TableColumn{Default: "CURRENT_TIMESTAMP", TypeName: "timestamptz"}, "1970-01-01", true},
		{TableColumn{Default: "NULL::text", TypeName: "text"}, "", false},
		{TableColumn{Default: "'\\x01'::bytea", TypeName: "bytea"}, "", false},
		{TableColumn{Default: "'ok'::mood", TypeName: "mood", EnumLabels: []string{"ok"}}, "ok", true},
		{TableColumn{Default: "'ok'::other", TypeName: "mood", EnumLabels: []string{"ok"}}, "", false},
		{TableColumn{Default: "'ok'::public.mood", TypeName: "mood", EnumLabels: []string{"ok"}}, "ok", true},
		{TableColumn{Default: `'ok'::"my schema".mood`, TypeName: "mood", EnumLabels: []string{"ok"}}, "ok", true},
		{TableColumn{TypeName: "text"}, "", false},
	} {
		got, ok := defaultLiteral(c.col)
		require.Equal(t, c.ok, ok, "%+v", c.col)
		require.Equal(t, c.want, got, "%+v", c.col)
	}
}
