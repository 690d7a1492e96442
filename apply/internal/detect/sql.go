package detect

import (
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply/conflict"
)

// Indexes is what detection needs of a target table: its unique indexes (see ParseIndexes).
type Indexes struct {
	Unique []UniqueIndex
	// OnConflict: inserts may use ON CONFLICT DO NOTHING (the table has unique or exclusion
	// indexes, none deferrable).
	OnConflict bool
	InUnique   []bool // per source column: part of a unique index
	// Count is the number of the table's unique and exclusion indexes; KeyIndex says that one of
	// them is a plain unique index on exactly the replica identity key's columns.
	Count    int
	KeyIndex bool
}

type UniqueIndex struct {
	Name string
	Cols []int // source columns; nil when the index uses a column the source does not send or an expression
}

// UniqueQuery reads the unique and exclusion indexes of a table ($1, its OID): see ParseIndexes.
const UniqueQuery = `SELECT c.relname, i.indimmediate, i.indisunique AND i.indexprs IS NULL AND i.indpred IS NULL,
	coalesce((SELECT pg_catalog.string_agg(a.attname, ',' ORDER BY k.o) FROM pg_catalog.unnest(i.indkey) WITH ORDINALITY k(n, o)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n), '')
FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::oid AND (i.indisunique OR i.indisexclusion) AND i.indisvalid AND i.indislive
ORDER BY c.relname`

// Counted wraps a checked statement so that it returns the number of rows it changed and, when
// none, marks the transaction (pgreorder.missed), which the commit's check reads.
func Counted(sql string) string {
	return "WITH pgr AS (" + sql + " RETURNING 1) SELECT c.n, CASE WHEN c.n = 0 THEN " +
		"pg_catalog.set_config('pgreorder.missed', 'on', true) END FROM (SELECT pg_catalog.count(*) AS n FROM pgr) c"
}

// LocalQuery selects the rows of m that cond (with parameters from $1) names, with what a
// report says of them: xmin, tableoid, ctid, the source columns, and with commit timestamps
// the commit time (microseconds since the epoch) and origin name. With lock the rows are locked
// FOR UPDATE (see Detection.Locks): a local transaction changing one meanwhile is waited for,
// and its version is the one returned and kept until the target transaction ends.
func (d *Detection) LocalQuery(m *Table, cond []byte, lock bool) string {
	var b strings.Builder
	b.WriteString("SELECT r.*")
	if d.TrackTS {
		b.WriteString(`, (pg_catalog.date_part('epoch', ts."timestamp") * 1000000)::int8, o.roname`)
	}
	b.WriteString(" FROM (SELECT xmin AS pgr_xmin, tableoid AS pgr_tableoid, ctid AS pgr_ctid")
	for _, c := range m.Columns {
		b.WriteString(", " + c.Name)
	}
	b.WriteString(" FROM " + m.Name + " WHERE ")
	b.Write(cond)
	if lock {
		b.WriteString(" FOR UPDATE")
	}
	b.WriteString(") r")
	if d.TrackTS {
		b.WriteString(" LEFT JOIN LATERAL pg_catalog.pg_xact_commit_timestamp_origin(r.pgr_xmin) ts ON true" +
			" LEFT JOIN pg_catalog.pg_replication_origin o ON o.roident = ts.roident")
	}
	return b.String()
}

// LocalRow is a row LocalQuery returned.
type LocalRow struct {
	conflict.LocalRow
	TableOID, CTID string
}

func (d *Detection) ParseLocal(m *Table, r [][]byte) LocalRow {
	var l LocalRow
	x, _ := strconv.ParseUint(string(r[0]), 10, 32)
	l.Xid = uint32(x)
	l.TableOID, l.CTID = string(r[1]), string(r[2])
	n := len(m.Columns)
	l.Row = make([]conflict.ColumnValue, n)
	for i := range n {
		l.Row[i] = conflict.ColumnValue{Name: m.Columns[i].Source, Value: TextValue(r[3+i], 0)}
	}
	if d.TrackTS && len(r) >= 5+n {
		if r[3+n] != nil {
			us, _ := strconv.ParseInt(string(r[3+n]), 10, 64)
			l.CommitTime = time.UnixMicro(us).UTC()
		}
		if r[4+n] != nil {
			l.Origin = string(r[4+n])
		}
	}
	return l
}

// TextValue renders a value for a report: text as it is, binary as \x hex, nil for NULL.
func TextValue(v []byte, format int16) *string {
	switch {
	case format == FmtUnchanged:
		s := "unchanged"
		return &s
	case v == nil:
		return nil
	case format == 1:
		s := `\x` + hex.EncodeToString(v)
		return &s
	}
	s := string(v)
	return &s
}

// IdentityOf describes the replica identity op names.
func IdentityOf(m *Table, where []byte, full bool, key [][]byte, formats []int16) []conflict.ColumnValue {
	var out []conflict.ColumnValue
	k := 0
	add := func(i int, s byte) {
		cv := conflict.ColumnValue{Name: m.Columns[i].Source}
		if s == 1 && k < len(key) {
			cv.Value = TextValue(key[k], formats[k])
			k++
		}
		out = append(out, cv)
	}
	if full {
		for i, s := range where {
			if s != 0 {
				add(i, s)
			}
		}
	} else {
		for j, i := range m.Key {
			add(i, where[j])
		}
	}
	return out
}

// RowOf describes a kept source row.
func RowOf(m *Table, row [][]byte, formats []int16) []conflict.ColumnValue {
	out := make([]conflict.ColumnValue, 0, len(row))
	for i, v := range row {
		if formats[i] == FmtUnchanged {
			continue
		}
		out = append(out, conflict.ColumnValue{Name: m.Columns[i].Source, Value: TextValue(v, formats[i])})
	}
	return out
}

// ParseIndexes reads the rows of UniqueQuery for m's target table: inserts may use ON CONFLICT
// DO NOTHING when it has unique or exclusion indexes and none is deferrable; the unique indexes
// of plain source columns (no expression, no predicate, every column sent by the source) are
// looked up when a statement conflicts.
func ParseIndexes(rows [][][]byte, m *Table) *Indexes {
	byName := map[string]int{}
	for i, c := range m.Columns {
		byName[c.Source] = i
	}
	rc := &Indexes{OnConflict: len(rows) > 0, InUnique: make([]bool, len(m.Columns)), Count: len(rows)}
	for _, r := range rows {
		if string(r[1]) != "t" {
			rc.OnConflict = false // deferrable: ON CONFLICT refuses it as an arbiter
		}
		if string(r[2]) != "t" {
			continue // exclusion constraint, expression or partial index: not looked up
		}
		ix := UniqueIndex{Name: string(r[0])}
		for name := range strings.SplitSeq(string(r[3]), ",") {
			i, ok := byName[name]
			if !ok {
				ix.Cols = nil
				break
			}
			ix.Cols = append(ix.Cols, i)
			rc.InUnique[i] = true
		}
		if ix.Cols != nil {
			rc.Unique = append(rc.Unique, ix)
			rc.KeyIndex = rc.KeyIndex || sameColumns(ix.Cols, m.Key)
		}
	}
	return rc
}

// sameColumns reports whether a and b hold the same columns, in any order.
func sameColumns(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		if !slices.Contains(b, c) {
			return false
		}
	}
	return true
}

// CheckedSQL is plain, an INSERT ('I'), UPDATE ('U') or DELETE ('D') statement, as sent with
// detection: Counted, and for an UPDATE or DELETE, when the origins of rows are checked
// (OriginCheck), only changing a row one of the applier's origins changed last; an INSERT into a
// table whose indexes allow it (onConflict, see Indexes) does nothing on a conflict. An INSERT
// that cannot be checked is plain.
func (d *Detection) CheckedSQL(kind byte, plain string, onConflict bool) string {
	switch kind {
	case 'I':
		if onConflict {
			return Counted(plain + " ON CONFLICT DO NOTHING")
		}
	case 'U', 'D':
		return Counted(d.OriginChecked(kind, plain))
	}
	return plain
}

// OriginChecked is the UPDATE or DELETE plain which, when the origins of rows are checked
// (OriginCheck), only changes a row one of the applier's origins changed last; plain otherwise.
func (d *Detection) OriginChecked(kind byte, plain string) string {
	if (kind != 'U' && kind != 'D') || !d.OriginCheck() {
		return plain
	}
	ids := make([]string, len(d.Ours))
	for i, id := range d.Ours {
		ids[i] = "'" + strconv.FormatUint(uint64(id), 10) + "'"
	}
	// A row last changed by a transaction without commit timestamp (frozen, older than the
	// tracking, or this one) counts as the Applier's.
	return plain + " AND COALESCE((pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident, " +
		ids[0] + ") IN (" + strings.Join(ids, ", ") + ")"
}
