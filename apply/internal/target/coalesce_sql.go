package target

import (
	"slices"
	"strconv"
	"strings"

	"github.com/pgreorder/pgreorder/decoding"
)

// Coalescing (see coalesce.go): the set statements of a table and their value arrays.

// queueTableSets queues nt's set statements: the check that keys inserted and deleted again
// are absent, the deletes, the updates and the inserts.
func (t *Conn) queueTableSets(nt *netTable, rows *rowCounts) {
	m := nt.m
	for _, h := range nt.log {
		switch h.op {
		case 'I':
			rows.inserts++
		case 'U':
			rows.updates++
		case 'D':
			rows.deletes++
		}
	}
	var probe, delKeys, updOld, upd, ins []decoding.Tuple
	for i := range nt.rows {
		r := &nt.rows[i]
		if !nt.keyed {
			ins = append(ins, r.row)
			continue
		}
		switch {
		case r.first == 'I' && r.row == nil:
			probe = append(probe, r.key)
		case r.first == 'U' && !r.del && r.row != nil:
			updOld, upd = append(updOld, r.key), append(upd, r.row)
		}
		if r.first != 'I' && (r.row == nil || r.del) {
			delKeys = append(delKeys, r.key)
		}
		if r.row != nil && (r.first == 'I' || r.del) {
			ins = append(ins, r.row)
		}
	}
	nk := len(nt.key)
	if len(probe) > 0 {
		t.queueSet(m, "SP", keyArrays(m, nt.key, probe), func() string {
			return "SELECT 1 / (NOT EXISTS (SELECT FROM " + m.Name + " AS pgr_t, " + unnest(1, nk) + " AS v(" + aliases(1, nk) + ") WHERE " + keyMatch(m, nt.key) + "))::int"
		})
	}
	// A keyed table's rows are named by the key; a FULL table's by the whole old row.
	named := func(rows []decoding.Tuple) setArgs {
		if nt.full {
			return allArrays(m, rows)
		}
		return keyArrays(m, nt.key, rows)
	}
	if len(delKeys) > 0 {
		t.queueSet(m, "SD", named(delKeys), func() string { return setDeleteSQL(m, nt.key, nt.full, t.originMatch()) })
	}
	if set := setColumns(m, nt.key, nt.full); len(upd) > 0 && len(set) > 0 { // a table of only the key has nothing to write
		old := upd
		if nt.full {
			old = updOld
		}
		args := named(old)
		for _, c := range set {
			args.add(m, upd, c)
		}
		t.queueSet(m, "SU", args, func() string { return setUpdateSQL(m, nt.key, nt.full, t.originMatch()) })
	}

	if len(ins) > 0 {
		t.queueSet(m, "SI", allArrays(m, ins), func() string {
			return asserted("INSERT INTO " + m.Name + " " + m.insertCols + " SELECT * FROM " +
				unnest(1, len(m.cols)) + " ON CONFLICT DO NOTHING")
		})
	}
}

// setDeleteSQL is the set statement that deletes rows of m named by the key columns key (with
// full, by every column of the old row) in the arrays from $1 on; origin is originMatch's.
func setDeleteSQL(m *Table, key []int, full bool, origin string) string {
	n, match := len(key), keyMatch(m, key)
	if full {
		n, match = len(m.cols), fullMatch(m)
	}
	return asserted("DELETE FROM " + m.Name + " AS pgr_t USING " + unnest(1, n) + " AS v(" + aliases(1, n) + ") WHERE " + match + origin)
}

// setColumns returns the columns an update's set statement writes: those not in key, whose
// values stay, or with full every column, as row by row.
func setColumns(m *Table, key []int, full bool) []int {
	if !full {
		return nonKey(m, key)
	}
	set := make([]int, len(m.cols))
	for c := range set {
		set[c] = c
	}
	return set
}

// setUpdateSQL is the set statement that updates rows of m: named as setDeleteSQL names them,
// then the arrays of the new values of the columns setColumns returns.
func setUpdateSQL(m *Table, key []int, full bool, origin string) string {
	from, match := len(key), keyMatch(m, key)
	if full {
		from, match = len(m.cols), fullMatch(m)
	}
	set := setColumns(m, key, full)
	var b strings.Builder
	b.WriteString("UPDATE " + m.Name + " AS pgr_t SET ")
	for j, c := range set {
		if j > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.cols[c].name + " = v.pgr_" + strconv.Itoa(from+j+1))
	}
	n := from + len(set)
	b.WriteString(" FROM " + unnest(1, n) + " AS v(" + aliases(1, n) + ") WHERE " + match + origin)
	return asserted(b.String())
}

// asserted wraps a set statement so that it fails unless it changed one row per element of
// its first array.
func asserted(sql string) string {
	return "WITH pgr AS (" + sql + " RETURNING 1) SELECT 1 / (pg_catalog.count(*) = pg_catalog.cardinality($1))::int FROM pgr"
}

// originMatch is the condition, with origin checks, that the row was last changed by one of the
// Applier's origins (see checkedSQL).
func (t *Conn) originMatch() string {
	if !t.det.On() || !t.det.OriginCheck() {
		return ""
	}
	ids := make([]string, len(t.det.Ours))
	for i, id := range t.det.Ours {
		ids[i] = "'" + strconv.FormatUint(uint64(id), 10) + "'"
	}
	return " AND COALESCE((pg_catalog.pg_xact_commit_timestamp_origin(pgr_t.xmin)).roident, " + ids[0] + ") IN (" +
		strings.Join(ids, ", ") + ")"
}

// keyMatch matches the target's rows to the key columns of v, the first of its columns.
func keyMatch(m *Table, key []int) string {
	var b strings.Builder
	for j, c := range key {
		if j > 0 {
			b.WriteString(" AND ")
		}
		b.WriteString("pgr_t." + m.cols[c].name + " = v.pgr_" + strconv.Itoa(j+1))
	}
	return b.String()
}

// fullMatch matches the target's rows to a FULL old row, every column of m in v's first columns,
// as whereSQL compares them: with "=" a column NOT NULL on the target, else with IS NOT DISTINCT
// FROM (NULL matches NULL), the text output of a type without equality operator. The key's
// columns, NOT NULL and compared with "=", are what the plan joins on, through their index.
func fullMatch(m *Table) string {
	var b strings.Builder
	for i, c := range m.cols {
		if i > 0 {
			b.WriteString(" AND ")
		}
		l, r := "pgr_t."+c.name, "v.pgr_"+strconv.Itoa(i+1)
		if c.textEq {
			l, r = l+"::text", r+"::text"
		}
		op := " IS NOT DISTINCT FROM "
		if c.notNull {
			op = " = "
		}
		b.WriteString(l + op + r)
	}
	return b.String()
}

// unnest returns the rows of the arrays $from to $from+n-1, side by side.
func unnest(from, n int) string {
	var b strings.Builder
	b.WriteString("ROWS FROM (")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("pg_catalog.unnest($" + strconv.Itoa(from+i) + ")")
	}
	return b.String() + ")"
}

func aliases(from, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("pgr_" + strconv.Itoa(from+i))
	}
	return b.String()
}

// nonKey returns the columns of m not in key.
func nonKey(m *Table, key []int) []int {
	var out []int
	for i := range m.cols {
		if !slices.Contains(key, i) {
			out = append(out, i)
		}
	}
	return out
}

// queueSet queues one set statement of m. It is not prepared: parsed in the batch, after the
// savepoint, whatever the server refuses in it (a rule, a type without the operators) is a
// failed set statement, which falls back to row by row, not an error of the transaction. Once
// per group and table, the parse costs little, and the plan sees the arrays' sizes.
func (t *Conn) queueSet(m *Table, shape string, args setArgs, sql func() string) {
	t.newBatch()
	text := sql()
	t.batch.ExecParams(text, args.vals, args.oids, args.fmts, nil)
	t.bytes += len(text)
	op := shape[1]
	if op == 'P' {
		op = 'I' // the check of inserts undone
	}
	t.ops = append(t.ops, batchOp{op: op, rel: m, set: true})
	t.bytes += 32
	for _, a := range args.vals {
		t.bytes += len(a)
	}
}
