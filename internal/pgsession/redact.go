package pgsession

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// mask replaces a password in what RedactConnString returns.
const mask = "xxxxx"

// secretKeys are the connection parameters whose values RedactConnString hides.
var secretKeys = []string{"password", "sslpassword"}

func isSecret(key string) bool {
	for _, k := range secretKeys {
		if strings.EqualFold(key, k) {
			return true
		}
	}
	return false
}

// RedactConnString returns the connection string dsn with its passwords replaced by "xxxxx", to be printed:
// in the keyword/value form, the value of every password and sslpassword keyword, however it is
// spaced and quoted ("password = 'it”s'", "password='a\' b'"); in the URL form
// (postgres://user:password@host/db?password=...), the password of the user information and of
// the query. What follows a syntax error in the keyword/value form, which libpq would not parse
// either, is replaced whole, since where a value ends is then unknown.
func RedactConnString(dsn string) string {
	out, _ := redact(dsn)
	return out
}

// redact returns RedactConnString(dsn) and the passwords it hid, as written and as meant (unquoted).
func redact(dsn string) (string, []string) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return redactURL(dsn)
	}
	var b strings.Builder
	var secrets []string
	s := dsn
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' }
	skip := func() {
		i := 0
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		b.WriteString(s[:i])
		s = s[i:]
	}
	for {
		skip()
		if s == "" {
			return b.String(), secrets
		}
		i := 0
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[:i]
		b.WriteString(key)
		s = s[i:]
		skip()
		if s == "" || s[0] != '=' { // libpq: missing "=" after the keyword
			if s != "" {
				b.WriteString(mask)
			}
			return b.String(), append(secrets, s)
		}
		b.WriteByte('=')
		s = s[1:]
		skip()
		// The value: quoted (to the next unescaped quote) or up to the next space; a backslash
		// escapes the character after it in both.
		var val strings.Builder
		i = 0
		quoted := s != "" && s[0] == '\''
		if quoted {
			i = 1
		}
		closed := !quoted
		for i < len(s) {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				val.WriteByte(s[i+1])
				i += 2
				continue
			}
			if quoted && c == '\'' {
				i++
				closed = true
				break
			}
			if !quoted && isSpace(c) {
				break
			}
			val.WriteByte(c)
			i++
		}
		raw := s[:i]
		s = s[i:]
		if !closed { // an unterminated quote: libpq refuses the string, and the value may be anything after it
			b.WriteString(mask)
			return b.String(), append(secrets, raw)
		}
		if isSecret(key) {
			b.WriteString(mask)
			secrets = append(secrets, raw, val.String())
		} else {
			b.WriteString(raw)
		}
	}
}

// redactURL is redact for the URL form: the password of the user information is what follows the
// first ':' before the last '@' ahead of the query, and the query's password parameters.
func redactURL(dsn string) (string, []string) {
	scheme, rest, _ := strings.Cut(dsn, "://")
	var secrets []string
	var b strings.Builder
	b.WriteString(scheme + "://")
	query := ""
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		rest, query = rest[:q], rest[q+1:]
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user, pw, ok := strings.Cut(rest[:at], ":")
		b.WriteString(user)
		if ok {
			b.WriteString(":" + mask)
			secrets = append(secrets, pw)
			if u, err := url.PathUnescape(pw); err == nil {
				secrets = append(secrets, u)
			}
		}
		rest = rest[at:]
	}
	b.WriteString(rest)
	if query != "" || strings.Contains(dsn, "?") {
		b.WriteByte('?')
		for i, param := range strings.Split(query, "&") {
			if i > 0 {
				b.WriteByte('&')
			}
			k, v, ok := strings.Cut(param, "=")
			if uk, err := url.QueryUnescape(k); err == nil {
				k = uk
			}
			if ok && isSecret(k) {
				b.WriteString(param[:strings.IndexByte(param, '=')+1] + mask)
				secrets = append(secrets, v)
				if u, err := url.QueryUnescape(v); err == nil {
					secrets = append(secrets, u)
				}
				continue
			}
			b.WriteString(param)
		}
	}
	return b.String(), secrets
}

// RedactConnError returns err, an error about the connection string dsn, with every password of dsn
// hidden from its message, whatever the message quotes of dsn and however: the connection string
// it quotes is replaced by RedactConnString's, and then any password of dsn (three characters or longer)
// still in it. It unwraps to err, or, when err holds a *pgconn.ParseConfigError (as
// pgconn.ParseConfig's errors are), to a copy of that whose ConnString is redacted.
func RedactConnError(err error, dsn string) error {
	if err == nil {
		return nil
	}
	red, secrets := redact(dsn)
	msg := err.Error()
	inner := err
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		cp := *pe
		cp.ConnString = RedactConnString(pe.ConnString)
		msg = strings.Replace(msg, pe.Error(), cp.Error(), 1)
		inner = &cp
	}
	msg = strings.ReplaceAll(msg, dsn, red)
	for _, s := range secrets {
		if len(s) >= 3 {
			msg = strings.ReplaceAll(msg, s, mask)
		}
	}
	return &redactedError{msg: msg, err: inner}
}

// redactedError is an error whose message was redacted.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// TidyConnectError returns msg, the message of err (or one that quotes it), with the part that a
// *pgconn.ConnectError in err wrote rewritten on one line: pgconn tries with TLS and then
// without (sslmode=prefer) and reports both attempts; a server that refused TLS is left out when
// the attempt without it failed for a reason of its own (a password, a database), which then
// comes first.
func TidyConnectError(msg string, err error) string {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return msg
	}
	return strings.Replace(msg, ce.Error(), connectText(ce), 1)
}

func connectText(e *pgconn.ConnectError) string {
	oneLine := strings.ReplaceAll(e.Error(), "\n\t", "; ")
	joined, ok := e.Unwrap().(interface{ Unwrap() []error })
	if !ok || e.Config == nil {
		return oneLine
	}
	var kept []string
	for _, x := range joined.Unwrap() {
		if !strings.Contains(x.Error(), "server refused TLS connection") {
			kept = append(kept, x.Error())
		}
	}
	if len(kept) == 0 {
		return oneLine
	}
	return fmt.Sprintf("failed to connect to `user=%s database=%s`: ", e.Config.User, e.Config.Database) + strings.Join(kept, "; ")
}
