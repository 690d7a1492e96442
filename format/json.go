package format

import (
	"encoding/base64"
	"io"
	"strconv"
	"unicode/utf8"
)

// flushAt is the size at which the encoder hands its bytes to the sink: a value of any size is
// written in pieces of about this size.
const flushAt = 64 << 10

// How str treats bytes that are not UTF-8.
const (
	invalidReplace = iota // as U+FFFD, as encoding/json does
	invalidEscape         // as \xNN, with '\' written as \\ (EscapeName)
)

// encoder builds JSON in buf and hands it to w in pieces. The first write error sticks.
type encoder struct {
	buf []byte
	w   io.Writer
	err error
}

func (e *encoder) flush() {
	if len(e.buf) == 0 {
		return
	}
	if e.err == nil {
		_, e.err = e.w.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

func (e *encoder) maybeFlush() {
	if len(e.buf) >= flushAt {
		e.flush()
	}
}

func (e *encoder) raw(s string) { e.buf = append(e.buf, s...) }

func (e *encoder) byte(c byte) { e.buf = append(e.buf, c) }

func (e *encoder) int(v int64) { e.buf = strconv.AppendInt(e.buf, v, 10) }

func (e *encoder) uint(v uint64) { e.buf = strconv.AppendUint(e.buf, v, 10) }

func (e *encoder) bool(v bool) { e.buf = strconv.AppendBool(e.buf, v) }

// name writes a name (of a schema, table, column, message prefix...) as a JSON string, escaped
// as EscapeName does.
func (e *encoder) name(s string) {
	e.buf = append(e.buf, '"')
	e.nameBody(s)
	e.buf = append(e.buf, '"')
}

// nameBody writes the inside of the JSON string of name(s).
func (e *encoder) nameBody(s string) {
	if nameVerbatim(s) {
		strBody(e, s, invalidReplace) // nothing to replace
		return
	}
	strBody(e, s, invalidEscape)
}

// base64 writes data as a base64 JSON string.
func (e *encoder) base64(data []byte) {
	e.buf = append(e.buf, '"')
	for len(data) > 0 {
		n := min(len(data), 3*flushAt/4)
		e.buf = base64.StdEncoding.AppendEncode(e.buf, data[:n])
		data = data[n:]
		e.maybeFlush()
	}
	e.buf = append(e.buf, '"')
}

const hexDigits = "0123456789abcdef"

// safe[c] is true for the ASCII bytes a JSON string holds as they are.
var safe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str writes s as a JSON string, in pieces if it is large. It leaves <, > and & alone (the output
// is not HTML) and escapes U+2028 and U+2029 as encoding/json does.
func str[S ~string | ~[]byte](e *encoder, s S, invalid int) {
	e.buf = append(e.buf, '"')
	strBody(e, s, invalid)
	e.buf = append(e.buf, '"')
}

// strBody writes the inside of str's JSON string.
func strBody[S ~string | ~[]byte](e *encoder, s S, invalid int) {
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c < utf8.RuneSelf && safe[c]:
			j := i + 1
			for j < len(s) && j-i < flushAt && s[j] < utf8.RuneSelf && safe[s[j]] {
				j++
			}
			e.buf = append(e.buf, s[i:j]...)
			i = j
		case c < utf8.RuneSelf:
			switch {
			case c == '\\' && invalid == invalidEscape:
				e.buf = append(e.buf, `\\\\`...)
			case c == '"' || c == '\\':
				e.buf = append(e.buf, '\\', c)
			case c == '\n':
				e.buf = append(e.buf, '\\', 'n')
			case c == '\r':
				e.buf = append(e.buf, '\\', 'r')
			case c == '\t':
				e.buf = append(e.buf, '\\', 't')
			default:
				e.buf = append(e.buf, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
		default:
			r, size := decodeRune(s[i:])
			switch {
			case r == utf8.RuneError && size == 1 && invalid == invalidEscape:
				e.buf = append(e.buf, '\\', '\\', 'x', hexDigits[c>>4], hexDigits[c&0xF])
			case r == utf8.RuneError && size == 1:
				e.buf = append(e.buf, `\ufffd`...)
			case r == '\u2028' || r == '\u2029':
				e.buf = append(e.buf, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			default:
				e.buf = append(e.buf, s[i:i+size]...)
			}
			i += size
		}
		e.maybeFlush()
	}
}

func decodeRune[S ~string | ~[]byte](s S) (rune, int) {
	var b [utf8.UTFMax]byte
	n := copy(b[:], s[:min(len(s), utf8.UTFMax)])
	return utf8.DecodeRune(b[:n])
}

func (e *encoder) str(s string, invalid int) { str(e, s, invalid) }

func (e *encoder) bytes(s []byte, invalid int) { str(e, s, invalid) }

// nameVerbatim reports whether EscapeName leaves s as it is.
func nameVerbatim(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			return false
		}
	}
	return utf8.ValidString(s)
}

// EscapeName returns the form in which the output formats print a name PostgreSQL sent (a
// schema, table, column, type or message prefix, a GID): a name that is valid UTF-8 without a
// backslash as it is; any other with each backslash doubled and each byte that is not part of
// valid UTF-8 written as \xNN (two lowercase hex digits). The mapping is injective, so distinct
// names stay distinct, and UnescapeName inverts it.
func EscapeName(s string) string {
	if nameVerbatim(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		c := s[i]
		if c == '\\' {
			b = append(b, '\\', '\\')
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, '\\', 'x', hexDigits[c>>4], hexDigits[c&0xF])
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return string(b)
}

// UnescapeName inverts EscapeName. It reports false for a string EscapeName cannot return.
func UnescapeName(s string) (string, bool) {
	if !utf8.ValidString(s) {
		return "", false
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b = append(b, s[i])
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			b = append(b, '\\')
			i++
		case i+3 < len(s) && s[i+1] == 'x' && isHex(s[i+2]) && isHex(s[i+3]):
			h, _ := strconv.ParseUint(s[i+2:i+4], 16, 8)
			b = append(b, byte(h))
			i += 3
		default:
			return "", false
		}
	}
	out := string(b)
	if EscapeName(out) != s { // e.g. an escaped byte that is part of valid UTF-8
		return "", false
	}
	return out, true
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }
