package decoding

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
)

// LSN is a position in PostgreSQL's write-ahead log. It prints as PostgreSQL prints pg_lsn
// values: two hexadecimal halves separated by a slash ("16/B374D848").
type LSN uint64

// String formats l as PostgreSQL does, e.g. "0/16B3748".
func (l LSN) String() string {
	var b [17]byte
	return string(l.AppendText(b[:0]))
}

// AppendText appends the text form of l (as String) to b.
func (l LSN) AppendText(b []byte) []byte {
	b = appendUpperHex(b, uint32(uint64(l)>>32))
	b = append(b, '/')
	return appendUpperHex(b, uint32(l))
}

// MarshalText implements encoding.TextMarshaler with the text form of String.
func (l LSN) MarshalText() ([]byte, error) { return l.AppendText(nil), nil }

// UnmarshalText implements encoding.TextUnmarshaler, accepting what ParseLSN accepts.
func (l *LSN) UnmarshalText(text []byte) error {
	v, err := ParseLSN(string(text))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

func appendUpperHex(b []byte, v uint32) []byte {
	const digits = "0123456789ABCDEF"
	if v == 0 {
		return append(b, '0')
	}
	var tmp [8]byte
	i := len(tmp)
	for v != 0 {
		i--
		tmp[i] = digits[v&0xF]
		v >>= 4
	}
	return append(b, tmp[i:]...)
}

// ParseLSN parses a position written as PostgreSQL writes a pg_lsn: two hexadecimal numbers of
// at most 8 digits each, separated by a slash. Upper and lower case digits are accepted.
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || hi == "" || lo == "" || len(hi) > 8 || len(lo) > 8 {
		return 0, fmt.Errorf("decoding: invalid LSN %q (want two hexadecimal halves, e.g. 0/16B3748)", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("decoding: invalid LSN %q (want two hexadecimal halves, e.g. 0/16B3748)", s)
	}
	return LSN(h<<32 | l), nil
}

// Scan implements database/sql's Scanner for a pg_lsn or text value, so that an LSN can be read
// from a query (as pglogrepl's LSN can).
func (l *LSN) Scan(src any) error {
	switch v := src.(type) {
	case string:
		return l.UnmarshalText([]byte(v))
	case []byte:
		return l.UnmarshalText(v)
	case nil:
		return fmt.Errorf("decoding: cannot scan NULL into an LSN")
	}
	return fmt.Errorf("decoding: cannot scan %T into an LSN", src)
}

// Value implements database/sql/driver's Valuer: the text form, which PostgreSQL reads as a
// pg_lsn.
func (l LSN) Value() (driver.Value, error) { return l.String(), nil }
