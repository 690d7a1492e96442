package format

import (
	"encoding/json"
	"math/big"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// FuzzNumericText: reading a binary numeric never panics, and what it reads is the value pgtype
// reads, with the display scale the format says.
func FuzzNumericText(f *testing.F) {
	m := pgtype.NewMap()
	for _, s := range []string{"0", "0.000", "-0.001", "1.500", "123456789012345678901234567890.123456789", "NaN",
		"Infinity", "-Infinity", "10000", "0.00001", "-99999999.9999"} {
		var n pgtype.Numeric
		if err := n.Scan(s); err != nil {
			f.Fatal(err)
		}
		b, err := m.Encode(pgtype.NumericOID, pgtype.BinaryFormatCode, n, nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		out, err := appendNumericText(nil, src)
		if err != nil {
			return
		}
		var text string
		if err := json.Unmarshal(out, &text); err != nil {
			t.Fatalf("%x: %s is not a JSON string", src, out)
		}
		var n pgtype.Numeric
		if err := m.Scan(pgtype.NumericOID, pgtype.BinaryFormatCode, src, &n); err != nil {
			return
		}
		switch {
		case n.NaN:
			if text != "NaN" {
				t.Fatalf("%x: %s, pgtype: NaN", src, text)
			}
		case n.InfinityModifier != pgtype.Finite:
			if want := map[pgtype.InfinityModifier]string{pgtype.Infinity: "Infinity", pgtype.NegativeInfinity: "-Infinity"}[n.InfinityModifier]; text != want {
				t.Fatalf("%x: %s, pgtype: %s", src, text, want)
			}
		default:
			ours, ok := new(big.Rat).SetString(text)
			if !ok {
				t.Fatalf("%x: %q is not a number", src, text)
			}
			theirs := new(big.Rat).SetInt(n.Int)
			p := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(n.Exp, -n.Exp))), nil))
			if n.Exp >= 0 {
				theirs.Mul(theirs, p)
			} else {
				theirs.Quo(theirs, p)
			}
			if ours.Cmp(theirs) != 0 {
				t.Fatalf("%x: %s, pgtype: %s", src, text, theirs.FloatString(20))
			}
		}
	})
}
