package pgsession

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestQuote(t *testing.T) {
	for _, tt := range []struct {
		name, got, want string
	}{
		{"ident", QuoteIdent("t"), `"t"`},
		{"ident, letter case kept", QuoteIdent("My Table"), `"My Table"`},
		{"ident, quote doubled", QuoteIdent(`x"; DROP TABLE t; --`), `"x""; DROP TABLE t; --"`},
		{"ident, empty", QuoteIdent(""), `""`},
		{"qualified", QuoteQualified("public", "Pos Ition"), `"public"."Pos Ition"`},
		{"qualified, one part", QuoteQualified(`a.b`), `"a.b"`},
		{"qualified, quotes", QuoteQualified(`My "Sch"`, "t"), `"My ""Sch"""."t"`},
		{"literal", QuoteLiteral("a"), `'a'`},
		{"literal, quote doubled", QuoteLiteral("it's"), `'it''s'`},
		{"literal, backslash", QuoteLiteral(`a\b`), `E'a\\b'`},
		{"literal, both", QuoteLiteral(`x\'y`), `E'x\\''y'`},
		{"literal, empty", QuoteLiteral(""), `''`},
		{"command literal", QuoteCommandLiteral(`"a","b"`), `'"a","b"'`},
		{"command literal, quote", QuoteCommandLiteral("it's"), `'it''s'`},
		{"command literal, backslash as it is", QuoteCommandLiteral(`a\b`), `'a\b'`},
		{"display, plain", DisplayIdent("orders_2024"), `orders_2024`},
		{"display, underscore first", DisplayIdent("_x"), `_x`},
		{"display, digit first", DisplayIdent("1x"), `"1x"`},
		{"display, upper case", DisplayIdent("Orders"), `"Orders"`},
		{"display, space", DisplayIdent("my table"), `"my table"`},
		{"display, quote", DisplayIdent(`a"b`), `"a""b"`},
		{"display, empty", DisplayIdent(""), `""`},
		{"text array", QuoteTextArray([]string{"a", `b"c`, `d\e`, "f,g h", ""}), `{"a","b\"c","d\\e","f,g h",""}`},
		{"text array, none", QuoteTextArray(nil), `{}`},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, tt.got, tt.want)
		}
	}
}

// TestTransientSQLState is the table of transient SQLSTATEs, which replication's Retryable and
// apply's retry decision share.
func TestTransientSQLState(t *testing.T) {
	for code, want := range map[string]bool{
		"08000": true, "08003": true, "08006": true, "08001": true, "08004": true, "08P01": true,
		"53000": true, "53100": true, "53200": true, "53300": true, "53400": true,
		"57P01": true, "57P02": true, "57P03": true, "57P05": true, "57014": true,
		"57000": false, "57P04": false, // operator_intervention in general, database_dropped
		"25P03": true, "25P04": true, "25P02": false, "25001": false,
		"40001": true, "40P01": true, "40000": false, "40002": false, "40003": false,
		"55P03": true, "55006": true, "55000": false, "55P02": false,
		"58000": true, "58030": true, "58P01": false, "58P02": false,
		"42704": false, "42P01": false, "28P01": false, "3D000": false, "23505": false, "22P02": false,
		"XX000": false, "XX001": false, "": false,
	} {
		if got := TransientSQLState(code); got != want {
			t.Errorf("TransientSQLState(%q) = %v, want %v", code, got, want)
		}
	}
}

func TestCode(t *testing.T) {
	pgErr := &pgconn.PgError{Code: "23505"}
	for _, tt := range []struct {
		err  error
		code string
	}{
		{pgErr, "23505"},
		{fmt.Errorf("x: %w", pgErr), "23505"},
		{fmt.Errorf("x: %w", &pgconn.PgError{}), ""},
		{fmt.Errorf("x: %v", pgErr), ""}, // not wrapped
		{nil, ""},
	} {
		if got := Code(tt.err); got != tt.code {
			t.Errorf("Code(%v) = %q, want %q", tt.err, got, tt.code)
		}
		if tt.code != "" && (!IsCode(tt.err, tt.code) || IsCode(tt.err, "23503")) {
			t.Errorf("IsCode(%v, %q) wrong", tt.err, tt.code)
		}
	}
	if IsCode(nil, "") || IsCode(fmt.Errorf("x"), "") {
		t.Error("IsCode of an error that is not the server's")
	}
}

func TestScanBackend(t *testing.T) {
	for _, tt := range []struct {
		row  []string
		ok   bool
		text string
	}{
		{[]string{"42", "app", "cdc", "10.0.0.1", "host.example", "2024-03-04 05:06:07+00", "idle"}, true,
			`pid 42, application_name "app", user cdc, client 10.0.0.1 (host.example), connected 2024-03-04 05:06:07+00, idle`},
		{[]string{"42", "", "", "", "", "2024-03-04 05:06:07+00", ""}, true, "pid 42, local client, connected 2024-03-04 05:06:07+00"},
		{[]string{"7", "", "", "10.0.0.2", "", "", "active"}, true, "pid 7, client 10.0.0.2, active"},
		{[]string{"x", "", "", "", "", "", ""}, false, ""},
		{[]string{"42"}, false, ""},
	} {
		b, ok := ScanBackend(tt.row)
		if ok != tt.ok || ok && b.String() != tt.text {
			t.Errorf("ScanBackend(%q) = %q, %v; want %q, %v", tt.row, b, ok, tt.text, tt.ok)
		}
	}
}
