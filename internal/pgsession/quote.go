package pgsession

import "strings"

// QuoteIdent quotes s as an SQL identifier: double-quoted, a double quote doubled. The name is
// taken as it is, letter case included. It is also how a name reads in a list that PostgreSQL
// splits with SplitIdentifierString (pgoutput's publication_names).
func QuoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// QuoteQualified quotes each part of a name (QuoteIdent) and joins them with dots: a schema and
// a table, say.
func QuoteQualified(parts ...string) string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = QuoteIdent(p)
	}
	return strings.Join(out, ".")
}

// QuoteLiteral quotes s as an SQL string literal that reads the same whatever
// standard_conforming_strings says (every connection of this package pins it on; a statement
// may be stored, as a trigger's arguments are, or pasted elsewhere): single-quoted with a single
// quote doubled, and with a backslash, an escape string (E'...') with backslashes doubled.
func QuoteLiteral(s string) string {
	if strings.Contains(s, `\`) {
		return `E'` + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + `'`
	}
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}

// QuoteCommandLiteral quotes s as a string literal of a replication command (the options of
// START_REPLICATION): single-quoted, a single quote doubled. The walsender's grammar has no
// escape strings, and a backslash is an ordinary character there.
func QuoteCommandLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// DisplayIdent returns s as a message shows a name: as it is when it is a plain lower-case name
// (a letter or an underscore, then letters, digits and underscores), else quoted (QuoteIdent),
// so that it reads back as one name.
func DisplayIdent(s string) string {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return QuoteIdent(s)
		}
	}
	if s == "" {
		return QuoteIdent(s)
	}
	return s
}

// QuoteTextArray returns the text form of a text[] holding ss, to be sent as a parameter (or
// quoted as a literal): each element double-quoted, with a backslash before a double quote or a
// backslash.
func QuoteTextArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(r.Replace(s))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
