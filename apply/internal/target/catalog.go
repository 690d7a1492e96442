package target

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Relation is one description of a source relation, as a Relation message gave it, with the
// names of the user-defined types its columns use. Equal descriptions share one Relation (see
// Registry), so that what is derived from it (the target mapping, prepared statements) is made
// once per description, not once per transaction that describes the relation again.
type Relation struct {
	ID       uint32             // index in the Registry (see Get)
	Rel      *decoding.Relation // never modified
	srcTypes []string           // per column: "namespace.name" of a user-defined type the stream described, else ""

	mu  sync.Mutex
	m   *Table // the target mapping, once made
	err error  // why the target table cannot take the relation's changes, once known
}

// qualifiedSource is the source relation's quoted, qualified name.
func (ri *Relation) qualifiedSource() string {
	ns := ri.Rel.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	return pgsession.QuoteQualified(ns, ri.Rel.Name)
}

// Registry gives Relations to the leader (who resolves relations while reading transactions) and
// to workers (who get their index in queued records). Lookups by index may come from any
// goroutine; intern is the leader's.
type Registry struct {
	mu    sync.RWMutex
	infos []*Relation

	// Leader only.
	byPtr map[*decoding.Relation]*Relation
	byKey map[string]*Relation
	key   []byte
}

func NewRegistry() *Registry {
	return &Registry{byPtr: map[*decoding.Relation]*Relation{}, byKey: map[string]*Relation{}}
}

// Get returns the Relation with index id.
func (r *Registry) Get(id uint32) *Relation {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.infos[id]
}

// typeResolver resolves the stream's descriptions of user-defined types: a change's
// decoding.Schema, or a snapshot table.
type typeResolver interface {
	Type(oid uint32) (*decoding.DataType, bool)
}

// Intern returns the Relation for rel. Relation descriptions from the buffer are never modified,
// so a pointer seen before maps to the same Relation; a new pointer with an equal description too.
func (r *Registry) Intern(rel *decoding.Relation, types typeResolver) *Relation {
	if ri := r.byPtr[rel]; ri != nil {
		return ri
	}
	srcTypes := make([]string, len(rel.Columns))
	for i, c := range rel.Columns {
		if c.TypeOID >= firstNormalOID && types != nil {
			if t, ok := types.Type(c.TypeOID); ok {
				ns := t.Namespace
				if ns == "" {
					ns = "pg_catalog"
				}
				srcTypes[i] = ns + "." + t.Name
			}
		}
	}
	k := r.key[:0]
	k = strconv.AppendUint(k, uint64(rel.RelationID), 10)
	k = append(k, 0)
	k = append(k, rel.Namespace...)
	k = append(k, 0)
	k = append(k, rel.Name...)
	k = append(k, 0, rel.ReplicaIdentity)
	for i, c := range rel.Columns {
		k = append(k, 0, c.Flags)
		k = strconv.AppendUint(k, uint64(c.TypeOID), 10)
		k = append(k, ':')
		k = strconv.AppendInt(k, int64(c.TypeMod), 10)
		k = append(k, ':')
		k = append(k, c.Name...)
		k = append(k, 0)
		k = append(k, srcTypes[i]...)
	}
	r.key = k
	ri := r.byKey[string(k)]
	if ri == nil {
		r.mu.Lock()
		ri = &Relation{ID: uint32(len(r.infos)), Rel: rel, srcTypes: srcTypes}
		r.infos = append(r.infos, ri)
		r.mu.Unlock()
		r.byKey[string(k)] = ri
	}
	if len(r.byPtr) >= 4096 { // streamed transactions describe their relations again: forget old pointers
		clear(r.byPtr)
	}
	r.byPtr[rel] = ri
	return ri
}

// Equality says how the target compares the values of source column i (an index into the
// relation's columns): by the equality of the type baseOID (the column's type, through domains)
// and, for text types, of a collation that is nondeterministic when nondet is set (values that
// differ may be equal). ok is false when i is not a column.
func (m *Table) Equality(i int) (baseOID uint32, nondet, ok bool) {
	if i < 0 || i >= len(m.cols) {
		return 0, false, false
	}
	c := m.cols[i]
	b := c.baseOID
	if b == 0 {
		b = c.typeOID
	}
	return b, c.nondet, true
}

// firstNormalOID is PostgreSQL's FirstNormalObjectId: OIDs below it are built in, the same on
// every server of a major version.
const firstNormalOID = 16384

// Table is how a source relation's changes are written to its target table.
type Table struct {
	detect.Table // Name is the target table's, quoted and qualified
	info         *Relation
	Partitioned  bool
	cols         []colMap // per source column
	idErr        error    // why UPDATE and DELETE cannot identify rows, if they cannot
	// fullSource: the source relation is REPLICA IDENTITY FULL, so its updates and deletes carry
	// the whole old row. Its rows are found by the target's replica identity index or primary key
	// (Key) when the target has one made of source columns, else by the whole old row (Full).
	fullSource bool
	Triggers   bool   // triggers that fire for the apply sessions' role (foreign keys included)
	rules      bool   // the table has rules
	copyCols   string // "(a, b, c)": the source columns, for INSERT and COPY
	// insertCols is copyCols for INSERT, with OVERRIDING SYSTEM VALUE when a column written is
	// GENERATED ALWAYS AS IDENTITY on the target: the source's values are written, as
	// PostgreSQL's subscriber writes them (COPY writes such columns as they are).
	insertCols string
}

// colMap is the target column a source column is written to.
type colMap struct {
	name    string // quoted
	typeOID uint32 // the target column's type
	typ     string // the target column's type, as format_type names it (for errors)
	chars   int    // the length limit of a character varying(n) or character(n) column, else 0
	// textEq: the type has no default equality operator (json, xml, geometric types, composite
	// types, domains and arrays of those): a FULL identity compares its text output instead.
	textEq bool
	// notNull: the target column is NOT NULL, so a FULL identity compares it with "=" alone.
	notNull bool
	// baseOID is the column's type through domains; nondet says its collation is
	// nondeterministic (Table.Equality).
	baseOID uint32
	nondet  bool
	// The array type of the column's type (0 for none: the type is itself an array) and its
	// elements' delimiter in an array's text, for set statements (see coalesce.go).
	arrayOID uint32
	delim    byte
}

// target table catalog queries. They read pg_catalog only, schema-qualified, so no search_path
// can redirect them.
const (
	relationQuery = `SELECT c.oid, c.relkind, c.relhasrules,
	(SELECT count(*) FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid AND t.tgenabled = ANY ($3::"char"[])),
	(SELECT i.indkey::text FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisvalid AND i.indisunique
		AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END LIMIT 1)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`

	// columnsQuery also says, per column, whether its type has a default equality operator
	// usable as "=" (a default btree or hash operator class of the type or of a type it is
	// implicitly binary coercible to, through domains and array elements; enums and ranges have
	// one; composite types count as without), the type's base type through domains (the stream
	// describes a domain by its base type's name), and whether the column's collation is
	// nondeterministic (PostgreSQL 12+: read through to_jsonb, which older servers lack the
	// column for).
	columnsQuery = `SELECT a.attnum, a.attname, a.atttypid, a.attgenerated <> '',
	pg_catalog.format_type(a.atttypid, a.atttypmod), tn.nspname || '.' || t.typname,
	(WITH RECURSIVE e(oid, n) AS (
		SELECT a.atttypid, 0
		UNION ALL
		SELECT CASE WHEN et.typtype = 'd' THEN et.typbasetype ELSE et.typelem END, e.n + 1
		FROM e JOIN pg_catalog.pg_type et ON et.oid = e.oid
		WHERE e.n < 64 AND (et.typtype = 'd' OR (et.typcategory = 'A' AND et.typelem <> 0 AND et.typlen = -1)))
	SELECT et.typtype IN ('e', 'r', 'm') OR EXISTS (SELECT FROM pg_catalog.pg_opclass oc
		JOIN pg_catalog.pg_am am ON am.oid = oc.opcmethod
		WHERE oc.opcdefault AND am.amname IN ('btree', 'hash') AND (oc.opcintype = et.oid OR EXISTS (SELECT
			FROM pg_catalog.pg_cast c WHERE c.castsource = et.oid AND c.casttarget = oc.opcintype AND c.castmethod = 'b'
			AND c.castcontext = 'i')))
	FROM e JOIN pg_catalog.pg_type et ON et.oid = e.oid ORDER BY e.n DESC LIMIT 1),
	(WITH RECURSIVE d(oid, n) AS (
		SELECT a.atttypid, 0
		UNION ALL
		SELECT dt.typbasetype, d.n + 1 FROM d JOIN pg_catalog.pg_type dt ON dt.oid = d.oid
		WHERE d.n < 64 AND dt.typtype = 'd')
	SELECT bt.oid::text || ' ' || bn.nspname || '.' || bt.typname FROM d
		JOIN pg_catalog.pg_type bt ON bt.oid = d.oid JOIN pg_catalog.pg_namespace bn ON bn.oid = bt.typnamespace
	ORDER BY d.n DESC LIMIT 1),
	CASE WHEN a.atttypid IN (1042, 1043) AND a.atttypmod >= 4 THEN a.atttypmod - 4 ELSE 0 END,
	t.typarray, t.typdelim, a.attidentity = 'a', a.attnotnull,
	COALESCE((SELECT pg_catalog.to_jsonb(co) ->> 'collisdeterministic' = 'false'
		FROM pg_catalog.pg_collation co WHERE co.oid = a.attcollation), false)
FROM pg_catalog.pg_attribute a
	JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
	JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`
)

// mapping returns the target mapping of ri, reading the target's catalog through conn the first
// time. An error that concerns the table (missing, other columns) is remembered: every change
// of the relation fails the same way.
func (ri *Relation) mapping(ctx context.Context, conn *pgconn.PgConn, replicaRole, binary bool) (*Table, error) {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if ri.m != nil || ri.err != nil {
		return ri.m, ri.err
	}
	m, err := loadMapping(ctx, conn, ri, replicaRole, binary)
	if err != nil {
		if _, ok := err.(*ChangeError); ok {
			ri.err = err
		}
		return nil, err
	}
	ri.m = m
	return m, nil
}

func loadMapping(ctx context.Context, conn *pgconn.PgConn, ri *Relation, replicaRole, binary bool) (*Table, error) {
	rel := ri.Rel
	ns := rel.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	name := ri.qualifiedSource()
	fail := func(kind Kind, format string, args ...any) error {
		return &ChangeError{Kind: kind, Relation: name, Err: fmt.Errorf(format, args...)}
	}
	// Triggers fire in session_replication_role "replica" when enabled REPLICA or ALWAYS, in
	// "origin" when enabled ORIGIN (the default, and foreign keys' internal triggers) or ALWAYS.
	fire := "{O,A}"
	if replicaRole {
		fire = "{R,A}"
	}
	rows, err := Query(ctx, conn, relationQuery, ns, rel.Name, fire)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, &ChangeError{Kind: KindMissingTable, Relation: name, Err: &NoTableError{Table: name}}
	}
	r := rows[0]
	oid, _ := strconv.ParseUint(string(r[0]), 10, 32)
	m := &Table{Table: detect.Table{Name: name, OID: uint32(oid), Full: rel.ReplicaIdentity == 'f'}, info: ri,
		Partitioned: string(r[1]) == "p", rules: string(r[2]) == "t", Triggers: string(r[3]) != "0"}
	identity := string(r[4]) // attnums of the target's replica identity index or primary key, or ""

	cols, err := Query(ctx, conn, columnsQuery, string(r[0]))
	if err != nil {
		return nil, err
	}
	type targetCol struct {
		attnum    string
		typeOID   uint32
		generated bool
		always    bool // GENERATED ALWAYS AS IDENTITY
		format    string
		qualified string
		hasEq     bool
		notNull   bool
		nondet    bool // a nondeterministic collation
		chars     int
		arrayOID  uint32
		delim     byte
		baseOID   uint32 // through domains
		base      string // through domains, qualified
	}
	byName := make(map[string]targetCol, len(cols))
	byNum := make(map[string]string, len(cols))
	for _, c := range cols {
		t, _ := strconv.ParseUint(string(c[2]), 10, 32)
		tc := targetCol{attnum: string(c[0]), typeOID: uint32(t), generated: string(c[3]) == "t",
			format: string(c[4]), qualified: string(c[5]), hasEq: string(c[6]) == "t", always: string(c[11]) == "t",
			notNull: string(c[12]) == "t", nondet: string(c[13]) == "t"}
		tc.chars, _ = strconv.Atoi(string(c[8]))
		if a, err := strconv.ParseUint(string(c[9]), 10, 32); err == nil && len(c[10]) == 1 {
			tc.arrayOID, tc.delim = uint32(a), c[10][0]
		}
		if oid, name, ok := strings.Cut(string(c[7]), " "); ok {
			b, _ := strconv.ParseUint(oid, 10, 32)
			tc.baseOID, tc.base = uint32(b), name
		}
		byName[string(c[1])] = tc
		byNum[string(c[0])] = string(c[1])
	}
	m.cols = make([]colMap, len(rel.Columns))
	m.Columns = make([]detect.Column, len(rel.Columns))
	var names []string
	overriding := false
	for i, sc := range rel.Columns {
		tc, ok := byName[sc.Name]
		switch {
		case !ok:
			return nil, &ChangeError{Kind: KindSchemaMismatch, Relation: name, Err: &MissingColumnError{Table: name, Column: sc.Name}}
		case tc.generated:
			return nil, fail(KindSchemaMismatch, "column %q is generated on the target", sc.Name)
		case binary && !sameType(sc.TypeOID, ri.srcTypes[i], tc.typeOID, tc.qualified) &&
			!sameType(sc.TypeOID, ri.srcTypes[i], tc.baseOID, tc.base):
			return nil, fail(KindSchemaMismatch, "column %q has type %s on the target and another type (OID %d) on the source: "+
				"binary values need the same type", sc.Name, tc.format, sc.TypeOID)
		}
		m.cols[i] = colMap{name: pgsession.QuoteIdent(sc.Name), typeOID: tc.typeOID, typ: tc.format, chars: tc.chars, textEq: !tc.hasEq, notNull: tc.notNull,
			arrayOID: tc.arrayOID, delim: tc.delim, baseOID: tc.baseOID, nondet: tc.nondet}
		m.Columns[i] = detect.Column{Source: sc.Name, Name: m.cols[i].name, TypeOID: tc.typeOID}
		names = append(names, m.cols[i].name)
		overriding = overriding || tc.always
		if sc.IsKey() {
			m.Key = append(m.Key, i)
		}
	}
	m.copyCols = "(" + strings.Join(names, ", ") + ")"
	m.insertCols = m.copyCols
	if overriding {
		m.insertCols += " OVERRIDING SYSTEM VALUE"
	}

	// UPDATE and DELETE find their row by the source's key, which the target must index uniquely.
	// A REPLICA IDENTITY FULL relation sends the whole old row. Its row is found as PostgreSQL's
	// subscriber finds it: by the target's replica identity index or primary key when the target
	// has one whose columns the source sends (nothing else of the old row is compared: a row
	// changed on the target in another column is still the row), else by the whole old row.
	m.fullSource = m.Full
	switch {
	case m.Full:
		if key := identityKey(identity, byNum, rel); key != nil {
			m.Key, m.Full = key, false
		}
	case len(m.Key) == 0:
		m.idErr = fail(KindNoReplicaIdentity, "the source relation has no replica identity key (replica identity %q) "+
			"and is not REPLICA IDENTITY FULL", string(rune(rel.ReplicaIdentity)))
	case identity == "":
		m.idErr = fail(KindNoReplicaIdentity, "the target table has neither a primary key nor a replica identity index, "+
			"and the source relation is not REPLICA IDENTITY FULL")
	default:
		keys := map[string]bool{}
		for _, i := range m.Key {
			keys[rel.Columns[i].Name] = true
		}
		for num := range strings.FieldsSeq(identity) {
			if col := byNum[num]; !keys[col] {
				m.idErr = fail(KindNoReplicaIdentity, "column %q of the target's identity index is not part of the source's "+
					"replica identity key", col)
				break
			}
		}
	}
	return m, nil
}

// identityKey returns the source columns, in source order, of the target's replica identity
// index or primary key (identity: its attnums, byNum: target column names by attnum), or nil
// when there is none or one of its columns is not a source column of rel.
func identityKey(identity string, byNum map[string]string, rel *decoding.Relation) []int {
	var key []int
	for num := range strings.FieldsSeq(identity) {
		name, ok := byNum[num]
		i := slices.IndexFunc(rel.Columns, func(c decoding.RelationColumn) bool { return c.Name == name })
		if !ok || i < 0 {
			return nil
		}
		key = append(key, i)
	}
	slices.Sort(key)
	return key
}

// sameType reports whether a source column's type is the target column's: the same OID for a
// built-in type, the same qualified name for a user-defined one (when the stream described it).
// The target's type is also tried through its domains: a domain's binary format is its base
// type's, and the stream describes a source domain by its base type's name.
func sameType(srcOID uint32, srcName string, dstOID uint32, dstName string) bool {
	if srcOID < firstNormalOID {
		return srcOID == dstOID
	}
	return srcName == "" || srcName == dstName
}

// Query runs sql with text parameters and returns the rows as text.
func Query(ctx context.Context, conn *pgconn.PgConn, sql string, args ...string) ([][][]byte, error) {
	params := make([][]byte, len(args))
	for i, a := range args {
		params[i] = []byte(a)
	}
	res := conn.ExecParams(ctx, sql, params, nil, nil, nil).Read()
	return res.Rows, res.Err
}

// ParseQualified splits "table" or "schema.table" (each part plain or double-quoted) into its
// parts.
func ParseQualified(s string) ([]string, error) {
	var parts []string
	for len(s) > 0 {
		var part string
		if s[0] == '"' {
			i := 1
			for {
				j := strings.IndexByte(s[i:], '"')
				if j < 0 {
					return nil, fmt.Errorf("unterminated quoted identifier in %q", s)
				}
				part += s[i : i+j]
				i += j + 1
				if i < len(s) && s[i] == '"' {
					part += `"`
					i++
					continue
				}
				break
			}
			s = s[i:]
		} else {
			j := strings.IndexByte(s, '.')
			if j < 0 {
				j = len(s)
			}
			part, s = strings.ToLower(s[:j]), s[j:] // unquoted names fold to lower case
		}
		if part == "" {
			return nil, fmt.Errorf("empty identifier")
		}
		parts = append(parts, part)
		if len(s) > 0 {
			if s[0] != '.' || len(s) == 1 {
				return nil, fmt.Errorf("invalid name")
			}
			s = s[1:]
		}
	}
	if len(parts) == 0 || len(parts) > 2 {
		return nil, fmt.Errorf("want table or schema.table")
	}
	return parts, nil
}
