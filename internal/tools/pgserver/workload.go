package pgserver

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// A Workload is a SQL script for Record, parsed by ParseWorkload. The script is plain SQL
// (statements end with ';'; quotes, dollar quotes and comments are understood) plus directive
// lines, which must stand alone on a line between statements:
//
//	-- setup          what follows runs before the publication and the slots are created
//	-- workload       what follows runs after; without this line the whole script is workload
//	-- session NAME   what follows runs on connection NAME (opened on first use; default "1")
//
// Statements run one at a time, in file order, each on its session's connection, so several
// sessions give a deterministic interleaving of concurrent transactions:
//
//	-- session a
//	BEGIN; INSERT INTO t VALUES (1);
//	-- session b
//	BEGIN; INSERT INTO t VALUES (2); COMMIT;
//	-- session a
//	COMMIT;
//
// psql meta-commands (\set, \gexec, ...) are not supported.
type Workload struct {
	Text     string // the script as given
	Setup    []Step
	Workload []Step
}

// Step is one statement and the session that runs it.
type Step struct {
	Session string
	SQL     string
	Line    int // 1-based line where the statement starts
}

// ErrWorkload is wrapped by every error ParseWorkload returns.
var ErrWorkload = errors.New("pgserver: bad workload")

var directiveRE = regexp.MustCompile(`^\s*--\s*(setup|workload|session\s+(\S+))\s*$`)

// ParseWorkload parses a workload script.
func ParseWorkload(text string) (*Workload, error) {
	w := &Workload{Text: text}
	var (
		pre, setup, work []Step
		section          = "pre"
		sawSetup         bool
		sawWorkload      bool
		session          = "1"
	)
	add := func(st Step) {
		switch section {
		case "pre":
			pre = append(pre, st)
		case "setup":
			setup = append(setup, st)
		default:
			work = append(work, st)
		}
	}
	sc := splitter{src: text}
	for {
		st, directive, err := sc.next()
		if err != nil {
			return nil, err
		}
		switch {
		case directive != nil:
			switch {
			case directive[1] == "setup":
				if sawSetup || sawWorkload {
					return nil, fmt.Errorf("%w: line %d: -- setup must come once, before -- workload", ErrWorkload, sc.line)
				}
				sawSetup, section = true, "setup"
			case directive[1] == "workload":
				if sawWorkload {
					return nil, fmt.Errorf("%w: line %d: second -- workload", ErrWorkload, sc.line)
				}
				sawWorkload, section = true, "workload"
			default:
				session = directive[2]
			}
			continue
		case st.SQL == "":
			if sawSetup && !sawWorkload {
				return nil, fmt.Errorf("%w: -- setup without -- workload", ErrWorkload)
			}
			if sawWorkload {
				w.Setup = append(pre, setup...)
				w.Workload = work
			} else {
				w.Workload = pre
			}
			return w, nil
		}
		st.Session = session
		add(st)
	}
}

// splitter cuts a script into statements and directive lines.
type splitter struct {
	src  string
	pos  int
	line int // line of pos, 1-based once started
}

// next returns the next statement, or a directive line's submatches, or an empty Step at the end.
func (s *splitter) next() (Step, []string, error) {
	if s.line == 0 {
		s.line = 1
	}
	var b strings.Builder
	start := -1 // line where significant text began
	atLineStart := s.pos == 0 || s.src[s.pos-1] == '\n'
	for s.pos < len(s.src) {
		if atLineStart && start < 0 {
			end := strings.IndexByte(s.src[s.pos:], '\n')
			if end < 0 {
				end = len(s.src) - s.pos
			}
			if m := directiveRE.FindStringSubmatch(s.src[s.pos : s.pos+end]); m != nil {
				s.pos += end
				if s.pos < len(s.src) {
					s.pos++ // the newline
				}
				s.line++
				return Step{}, m, nil
			}
		}
		atLineStart = false
		c := s.src[s.pos]
		switch {
		case c == '\n':
			s.line++
			atLineStart = true
			b.WriteByte(c)
			s.pos++
		case c == '-' && strings.HasPrefix(s.src[s.pos:], "--"):
			end := strings.IndexByte(s.src[s.pos:], '\n')
			if end < 0 {
				end = len(s.src) - s.pos
			}
			b.WriteString(s.src[s.pos : s.pos+end])
			s.pos += end
		case c == '/' && strings.HasPrefix(s.src[s.pos:], "/*"):
			if err := s.blockComment(&b); err != nil {
				return Step{}, nil, err
			}
		case c == ';':
			s.pos++
			if start >= 0 {
				return Step{SQL: strings.TrimSpace(b.String()), Line: start}, nil, nil
			}
			b.Reset()
		case c == '\'' || c == '"':
			if start < 0 {
				start = s.line
			}
			escapes := c == '\'' && s.pos > 0 && (s.src[s.pos-1] == 'E' || s.src[s.pos-1] == 'e') &&
				(s.pos < 2 || !isIdentChar(s.src[s.pos-2]))
			if err := s.quoted(&b, c, escapes); err != nil {
				return Step{}, nil, err
			}
		case c == '$' && (s.pos == 0 || !isIdentChar(s.src[s.pos-1])):
			if start < 0 {
				start = s.line
			}
			if err := s.dollarQuoted(&b); err != nil {
				return Step{}, nil, err
			}
		default:
			if start < 0 && c != ' ' && c != '\t' && c != '\r' {
				start = s.line
			}
			b.WriteByte(c)
			s.pos++
		}
	}
	if start >= 0 {
		return Step{SQL: strings.TrimSpace(b.String()), Line: start}, nil, nil
	}
	return Step{}, nil, nil
}

func isIdentChar(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

func (s *splitter) blockComment(b *strings.Builder) error {
	line, depth := s.line, 0
	for s.pos < len(s.src) {
		switch {
		case strings.HasPrefix(s.src[s.pos:], "/*"):
			depth++
			b.WriteString("/*")
			s.pos += 2
		case strings.HasPrefix(s.src[s.pos:], "*/"):
			depth--
			b.WriteString("*/")
			s.pos += 2
			if depth == 0 {
				return nil
			}
		default:
			if s.src[s.pos] == '\n' {
				s.line++
			}
			b.WriteByte(s.src[s.pos])
			s.pos++
		}
	}
	return fmt.Errorf("%w: line %d: unterminated /* comment", ErrWorkload, line)
}

func (s *splitter) quoted(b *strings.Builder, q byte, escapes bool) error {
	line := s.line
	b.WriteByte(q)
	s.pos++
	for s.pos < len(s.src) {
		c := s.src[s.pos]
		b.WriteByte(c)
		s.pos++
		switch {
		case c == '\n':
			s.line++
		case escapes && c == '\\' && s.pos < len(s.src):
			if s.src[s.pos] == '\n' {
				s.line++
			}
			b.WriteByte(s.src[s.pos])
			s.pos++
		case c == q:
			if s.pos < len(s.src) && s.src[s.pos] == q { // doubled quote
				b.WriteByte(q)
				s.pos++
				continue
			}
			return nil
		}
	}
	return fmt.Errorf("%w: line %d: unterminated %c quote", ErrWorkload, line, q)
}

var dollarTagRE = regexp.MustCompile(`^\$([A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*)?\$`)

func (s *splitter) dollarQuoted(b *strings.Builder) error {
	tag := dollarTagRE.FindString(s.src[s.pos:])
	if tag == "" { // $1 or a lone $: ordinary text
		b.WriteByte('$')
		s.pos++
		return nil
	}
	line := s.line
	b.WriteString(tag)
	s.pos += len(tag)
	end := strings.Index(s.src[s.pos:], tag)
	if end < 0 {
		return fmt.Errorf("%w: line %d: unterminated %s quote", ErrWorkload, line, tag)
	}
	body := s.src[s.pos : s.pos+end+len(tag)]
	s.line += strings.Count(body, "\n")
	b.WriteString(body)
	s.pos += len(body)
	return nil
}
