package target

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/replication"
)

// Coalescing: set-based apply of a target transaction (Conn.Coalesce; package apply turns it on
// for the groups of Buffered). Instead of one statement per change, the changes of each table are
// held, reduced to their net effect per replica identity key, and sent at the commit (or when
// they grow past coalesceMaxBytes) as a few set statements per table, in the batch that commits:
//
//   - per key, the changes collapse into what the target must see at the end: an insert then
//     updates become the insert of the final row; updates, the last row; an insert then a
//     delete, nothing; a delete (or updates then a delete) then an insert, the delete and the
//     insert, in that order;
//   - deletes go as one DELETE ... USING unnest($1, ...), updates as one UPDATE ... FROM
//     unnest($1, ...), inserts as one INSERT ... SELECT FROM unnest($1, ...), each value array
//     a parameter of the column's array type; keys inserted and deleted again are checked to be
//     absent (the insert would have found them);
//   - each set statement asserts that it changed exactly the rows it names (an UPDATE or DELETE
//     whose row is missing or, with origin checks, was last changed by another origin; an
//     INSERT whose key exists, which ON CONFLICT DO NOTHING skips), and fails otherwise;
//   - the set statements go after SAVEPOINT pgr_set. When one fails, for whatever reason (an
//     assertion, a unique violation, a value the column refuses), the transaction is rolled
//     back to the savepoint and the held changes are sent again one statement each, in their
//     order, as without coalescing: conflicts are then detected, resolved, counted and
//     reported per change, and an error names its change, exactly as row by row. Nothing else
//     of the transaction is undone, and no round trip is spent unless a set statement failed.
//
// The net effect is what row-by-row apply leaves when nothing conflicts; the fallback makes it
// so when something does. A table's changes go row by row instead (the table, for the rest of
// the target transaction, once a change of it cannot be held; the changes held before are sent
// first, in order) where a set statement would change what the target sees or what conflict
// detection reports:
//
//   - tables with triggers that fire for the apply session (foreign keys included, unless the
//     session runs with session_replication_role = replica): they would see other rows, in
//     another order; tables with rules, which rewrite each statement;
//   - tables with a unique or exclusion index other than one on exactly the replica identity key
//     (the intermediate rows the reduction skips could have conflicted on it), with a deferrable
//     one, or with a key the target does not index uniquely;
//   - tables without a replica identity key (REPLICA IDENTITY FULL, or none): their inserts
//     are held when the table has no unique index at all, and an update or delete sends them;
//   - an update of the key, and a change whose key or values are not all text or NULL (binary
//     values: Config.Binary) or whose column types have no array type;
//   - an update with unchanged TOASTed values not sent, unless the key's row is held whole
//     (inserted or updated in full earlier in the transaction): the values are taken from it;
//   - a truncate (of the tables it names), a savepoint or a rollback to one;
//   - a table into which one source transaction inserted at least setCopyMin rows in a row:
//     its changes go row by row at the commit, the inserts through COPY (a bulk load is what
//     COPY is for; the inserts of many small transactions go in the batch that commits).
const (
	coalesceMaxBytes = 4 << 20
	setCopyMin       = 32
)

// coalescer holds the changes of the target transaction that go as set statements.
type coalescer struct {
	tables map[*Table]*netTable
	order  []*netTable // in the order of their first change
	bytes  int
	rows   rowCounts // the changes the set statements in flight apply, counted once they succeed
}

// netTable is what one table's held changes come to.
type netTable struct {
	m       *Table
	rowPath bool // its changes go row by row
	keyed   bool // identified by the replica identity key, else insert-only
	log     []held
	keys    map[string]int // net row of each key, in rows
	rows    []netRow
	// The most inserts one source transaction made in a row (run: the current transaction's,
	// xid), which decides whether they go through COPY (setCopyMin).
	xid       uint32
	run, most int
}

// held is one change as it arrived (its values copied), to send it again row by row.
type held struct {
	op      byte // 'I', 'U' or 'D'
	tup     decoding.Tuple
	old     decoding.Tuple
	oldKind byte
	src     int32 // the source transaction, in detector.srcs
}

// netRow is the net effect of a key's changes.
type netRow struct {
	first byte           // the kind of its first change
	del   bool           // the row it had before the first change is deleted, then one inserted
	row   decoding.Tuple // the row at the end; nil when there is none
	key   decoding.Tuple // a tuple holding the key's values (its first change's)
}

// Coalesce turns set-based apply on or off for the changes that follow (see coalesce.go).
// Changes already held are sent at the commit either way.
func (t *Conn) Coalesce(on bool) { t.coalesce = on }

// curSrc is the source transaction of the change being queued, in detector.srcs.
func (t *Conn) curSrc() int32 {
	if t.srcOverride >= 0 {
		return t.srcOverride
	}
	return int32(len(t.det.Srcs) - 1)
}

// setEligible says whether m's changes may be held.
func (t *Conn) setEligible(ctx context.Context, m *Table) (keyed, ok bool, err error) {
	if m.Triggers || m.rules || len(m.cols) == 0 {
		return false, false, nil
	}
	for _, c := range m.cols {
		if c.arrayOID == 0 || c.delim == 0 {
			return false, false, nil
		}
	}
	rc, err := t.conflictInfo(ctx, m)
	if err != nil {
		return false, false, err
	}
	if !m.Full && m.idErr == nil && len(m.Key) > 0 {
		return true, rc.Count == 1 && rc.KeyIndex && rc.OnConflict, nil
	}
	return false, rc.Count == 0, nil
}

// absorb holds a change of m when it can; false means the caller applies it row by row (the
// table's held changes were queued first).
func (t *Conn) absorb(ctx context.Context, m *Table, op byte, tup, old decoding.Tuple, oldKind byte) (bool, error) {
	c := &t.co
	nt := c.tables[m]
	if nt == nil {
		keyed, ok, err := t.setEligible(ctx, m)
		if err != nil {
			return false, err
		}
		if c.tables == nil {
			c.tables = map[*Table]*netTable{}
		}
		nt = &netTable{m: m, rowPath: !ok, keyed: keyed}
		c.tables[m] = nt
		c.order = append(c.order, nt)
	}
	if nt.rowPath {
		return false, nil
	}
	if !nt.add(op, tup, old, oldKind, t.curSrc()) {
		return false, t.sendRowByRow(ctx, nt)
	}
	if op == 'I' {
		if nt.run == 0 || nt.xid != t.det.Remote.Xid {
			nt.xid, nt.run = t.det.Remote.Xid, 0
		}
		nt.run++
		nt.most = max(nt.most, nt.run)
	} else {
		nt.run = 0
	}
	for _, col := range tup {
		c.bytes += len(col.Data) + 8
	}
	if c.bytes >= coalesceMaxBytes {
		return true, t.flushSets(ctx)
	}
	return true, nil
}

// textRow reports whether every value of tup is text or NULL (unchanged ones too, with
// unchanged).
func textRow(tup decoding.Tuple, unchanged bool) bool {
	for _, c := range tup {
		switch c.Kind {
		case decoding.ColumnText, decoding.ColumnNull:
		case decoding.ColumnUnchanged:
			if !unchanged {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// keyOf returns the key of tup (text values of the key columns), or false when one is missing,
// NULL or not text.
func (nt *netTable) keyOf(tup decoding.Tuple) (string, bool) {
	var b []byte
	for _, i := range nt.m.Key {
		if i >= len(tup) || tup[i].Kind != decoding.ColumnText {
			return "", false
		}
		b = strconv.AppendInt(b, int64(len(tup[i].Data)), 10)
		b = append(b, ':')
		b = append(b, tup[i].Data...)
	}
	return string(b), true
}

// add holds a change, or returns false, changing nothing, when it cannot be held.
func (nt *netTable) add(op byte, tup, old decoding.Tuple, oldKind byte, src int32) bool {
	m := nt.m
	if !nt.keyed {
		if op != 'I' || len(tup) != len(m.cols) || !textRow(tup, false) {
			return false
		}
		tup = cloneTuple(tup)
		nt.log = append(nt.log, held{op: op, tup: tup, src: src})
		nt.rows = append(nt.rows, netRow{first: 'I', row: tup})
		return true
	}
	var key string
	var ok bool
	switch op {
	case 'I':
		if len(tup) != len(m.cols) || !textRow(tup, false) {
			return false
		}
		key, ok = nt.keyOf(tup)
	case 'U':
		if len(tup) != len(m.cols) || !textRow(tup, true) {
			return false
		}
		key, ok = nt.keyOf(tup)
		if ok && (oldKind == 'K' || oldKind == 'O') {
			k, okOld := nt.keyOf(old)
			ok = okOld && k == key // else an update of the key
		}
	case 'D':
		if oldKind != 'K' {
			return false
		}
		key, ok = nt.keyOf(old)
	}
	if !ok {
		return false
	}
	i, seen := nt.keys[key]
	var r netRow
	if seen {
		r = nt.rows[i]
	}
	switch op {
	case 'I':
		if seen && r.row != nil {
			return false // the row exists: the source would not insert it
		}
	case 'U', 'D':
		if seen && r.row == nil {
			return false // there is no row to change
		}
	}
	final := tup // the row at the end
	if op == 'U' && !textRow(tup, false) {
		if !seen {
			return false // unchanged values of a row not held
		}
		final = make(decoding.Tuple, len(tup))
		for j, c := range tup {
			if c.Kind == decoding.ColumnUnchanged {
				c = r.row[j]
			}
			final[j] = c
		}
	}
	h := held{op: op, oldKind: oldKind, src: src}
	switch op {
	case 'I', 'U':
		h.tup = cloneTuple(tup)
		if op == 'U' && (oldKind == 'K' || oldKind == 'O') {
			h.old = cloneTuple(old)
		}
	case 'D':
		h.old = cloneTuple(old)
	}
	nt.log = append(nt.log, h)
	if !seen {
		if nt.keys == nil {
			nt.keys = map[string]int{}
		}
		i = len(nt.rows)
		nt.keys[key] = i
		r = netRow{first: op, key: h.tup}
		if op == 'D' {
			r.key = h.old
		}
		nt.rows = append(nt.rows, r)
	}
	switch op {
	case 'I':
		if r.first != 'I' {
			r.del = true // deleted, then inserted again
		}
		r.row = h.tup
	case 'U':
		r.row = h.tup
		if &final[0] != &tup[0] {
			r.row = cloneTuple(final)
		}
	case 'D':
		r.row = nil
	}
	nt.rows[i] = r
	return true
}

func cloneTuple(tup decoding.Tuple) decoding.Tuple {
	n := 0
	for _, c := range tup {
		n += len(c.Data)
	}
	buf := make([]byte, 0, n)
	out := make(decoding.Tuple, len(tup))
	for i, c := range tup {
		out[i].Kind = c.Kind
		if c.Data != nil {
			s := len(buf)
			buf = append(buf, c.Data...)
			out[i].Data = buf[s:len(buf):len(buf)]
		}
	}
	return out
}

// sendRowByRow queues nt's held changes row by row, in order, and sends its later changes so.
func (t *Conn) sendRowByRow(ctx context.Context, nt *netTable) error {
	nt.rowPath = true
	log := nt.log
	nt.log, nt.rows, nt.keys = nil, nil, nil
	return t.replay(ctx, nt.m, log)
}

// replay applies held changes row by row, each named by its own source transaction.
func (t *Conn) replay(ctx context.Context, m *Table, log []held) error {
	defer func() { t.srcOverride = -1 }()
	for _, h := range log {
		t.srcOverride = h.src
		var err error
		switch h.op {
		case 'I':
			err = t.Insert(ctx, m, h.tup)
		case 'U':
			err = t.update(ctx, m, &decoding.Update{OldKind: h.oldKind, Old: h.old, New: h.tup})
		case 'D':
			err = t.delete(ctx, m, &decoding.Delete{OldKind: h.oldKind, Old: h.old})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unhold sends every held change row by row (a savepoint, a rollback to one), and forgets the
// tables' state.
func (t *Conn) unhold(ctx context.Context) error {
	order := t.co.order
	t.co = coalescer{rows: t.co.rows}
	for _, nt := range order {
		if err := t.replay(ctx, nt.m, nt.log); err != nil {
			return err
		}
	}
	return nil
}

// unholdTables sends the held changes of the tables a truncate names row by row, and their
// later changes so.
func (t *Conn) unholdTables(ctx context.Context, ms []*Table) error {
	for _, m := range ms {
		if nt := t.co.tables[m]; nt != nil && !nt.rowPath {
			if err := t.sendRowByRow(ctx, nt); err != nil {
				return err
			}
		}
	}
	return nil
}

// holding reports whether changes are held.
func (t *Conn) holding() bool {
	for _, nt := range t.co.order {
		if len(nt.log) > 0 {
			return true
		}
	}
	return false
}

// errSetFailed says that a set statement failed and the transaction was rolled back to the
// savepoint before them: their changes are to be sent row by row (replayFailed).
var errSetFailed = errors.New("apply: a set statement failed")

// flushSets sends the held changes as set statements, now (see queueSets).
func (t *Conn) flushSets(ctx context.Context) error {
	if err := t.queueSets(ctx); err != nil {
		return err
	}
	err := t.FlushBatch(ctx)
	if err == errSetFailed {
		return t.replayFailed(ctx)
	}
	return err
}

// queueSets queues the held changes: tables with a run of setCopyMin inserts row by row
// (their inserts go through COPY, sent now), then the set statements of the others after
// SAVEPOINT pgr_set. The tables' state is cleared; what the set statements apply is kept in
// failed until they succeed (see FlushBatch) or fail (replayFailed).
func (t *Conn) queueSets(ctx context.Context) error {
	order := t.co.order
	t.co = coalescer{}
	t.failed = t.failed[:0]
	var sets []*netTable
	for _, nt := range order {
		switch {
		case len(nt.log) == 0:
		case nt.most >= setCopyMin:
			if err := t.replay(ctx, nt.m, nt.log); err != nil {
				return err
			}
		default:
			sets = append(sets, nt)
		}
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	if len(sets) == 0 {
		return nil
	}
	t.Control("SAVEPOINT pgr_set")
	t.ops[len(t.ops)-1].set = true
	var rows rowCounts
	for _, nt := range sets {
		t.failed = append(t.failed, nt)
		t.queueTableSets(nt, &rows)
	}
	t.Control("RELEASE SAVEPOINT pgr_set")
	t.ops[len(t.ops)-1].set, t.ops[len(t.ops)-1].setEnd = true, true
	t.co.rows = rows
	return nil
}

// replayFailed sends the changes of the set statements that failed row by row.
func (t *Conn) replayFailed(ctx context.Context) error {
	failed := t.failed
	t.failed = nil
	t.setFallbacks++
	for _, nt := range failed {
		if err := t.replay(ctx, nt.m, nt.log); err != nil {
			return err
		}
	}
	return nil
}

// setFailed handles a set statement that failed: the transaction goes back to the savepoint
// before the set statements, and the conflicts the batch's statements before it met are
// resolved. err is the server's error, returned as it is when starting again can cure it or the
// connection broke (there is nothing to roll back to then).
func (t *Conn) setFailed(ctx context.Context, first, failed error, ops []batchOp, missed []int) error {
	var pgErr *pgconn.PgError
	if !errors.As(failed, &pgErr) || replication.TransientSQLState(pgErr.Code) {
		return first
	}
	t.co.rows = rowCounts{}
	t.stats.RoundTrips.Add(1)
	err := t.PG.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_set; RELEASE SAVEPOINT pgr_set; "+
		"SELECT pg_catalog.set_config('pgreorder.missed', '', true)").Close()
	if err != nil {
		return err
	}
	t.log.Debug("a set statement failed: its changes are sent again one by one", "err", failed)
	for _, j := range missed {
		if err := t.resolveMissed(ctx, ops[j]); err != nil {
			return err
		}
	}
	return errSetFailed
}

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
	var probe, delKeys, upd, ins []decoding.Tuple
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
			upd = append(upd, r.row)
		}
		if r.first != 'I' && (r.row == nil || r.del) {
			delKeys = append(delKeys, r.key)
		}
		if r.row != nil && (r.first == 'I' || r.del) {
			ins = append(ins, r.row)
		}
	}
	if len(probe) > 0 {
		t.queueSet(m, "SP", t.keyArrays(m, probe), func() string {
			return "SELECT 1 / (NOT EXISTS (SELECT FROM " + m.Name + " AS pgr_t, " + unnest(1, len(m.Key)) + " AS v(" + aliases(1, len(m.Key)) + ") WHERE " + t.keyMatch(m) + "))::int"
		}, keyOIDs(m))
	}
	if len(delKeys) > 0 {
		t.queueSet(m, "SD", t.keyArrays(m, delKeys), func() string {
			return asserted("DELETE FROM " + m.Name + " AS pgr_t USING " + unnest(1, len(m.Key)) + " AS v(" + aliases(1, len(m.Key)) + ") WHERE " + t.keyMatch(m) + t.originMatch())
		}, keyOIDs(m))
	}
	if len(upd) > 0 {
		others := nonKey(m)
		if len(others) > 0 {
			arrays := t.keyArrays(m, upd)
			oids := keyOIDs(m)
			for _, c := range others {
				arrays = append(arrays, columnArray(m, upd, c))
				oids = append(oids, m.cols[c].arrayOID)
			}
			t.queueSet(m, "SU", arrays, func() string {
				var b strings.Builder
				b.WriteString("UPDATE " + m.Name + " AS pgr_t SET ")
				for j, c := range others {
					if j > 0 {
						b.WriteString(", ")
					}
					b.WriteString(m.cols[c].name + " = v.pgr_" + strconv.Itoa(len(m.Key)+j+1))
				}
				n := len(m.Key) + len(others)
				b.WriteString(" FROM " + unnest(1, n) + " AS v(" + aliases(1, n) + ") WHERE " +
					t.keyMatch(m) + t.originMatch())
				return asserted(b.String())
			}, oids)
		}
	}
	if len(ins) > 0 {
		arrays := make([][]byte, len(m.cols))
		oids := make([]uint32, len(m.cols))
		for c := range m.cols {
			arrays[c] = columnArray(m, ins, c)
			oids[c] = m.cols[c].arrayOID
		}
		t.queueSet(m, "SI", arrays, func() string {
			return asserted("INSERT INTO " + m.Name + " " + m.insertCols + " SELECT * FROM " +
				unnest(1, len(m.cols)) + " ON CONFLICT DO NOTHING")
		}, oids)
	}
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
func (t *Conn) keyMatch(m *Table) string {
	var b strings.Builder
	for j, c := range m.Key {
		if j > 0 {
			b.WriteString(" AND ")
		}
		b.WriteString("pgr_t." + m.cols[c].name + " = v.pgr_" + strconv.Itoa(j+1))
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

func keyOIDs(m *Table) []uint32 {
	oids := make([]uint32, len(m.Key))
	for j, c := range m.Key {
		oids[j] = m.cols[c].arrayOID
	}
	return oids
}

func nonKey(m *Table) []int {
	var out []int
	for i := range m.cols {
		isKey := false
		for _, k := range m.Key {
			isKey = isKey || k == i
		}
		if !isKey {
			out = append(out, i)
		}
	}
	return out
}

// keyArrays returns the arrays of the key columns of rows.
func (t *Conn) keyArrays(m *Table, rows []decoding.Tuple) [][]byte {
	out := make([][]byte, len(m.Key))
	for j, c := range m.Key {
		out[j] = columnArray(m, rows, c)
	}
	return out
}

// columnArray returns the text of the array of column c's values in rows: each element quoted
// (so that neither the delimiter nor braces, spaces or the word NULL in a value mean anything),
// NULL unquoted.
func columnArray(m *Table, rows []decoding.Tuple, c int) []byte {
	n := 2
	for _, r := range rows {
		n += len(r[c].Data) + 3
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, r := range rows {
		if i > 0 {
			b = append(b, m.cols[c].delim)
		}
		v := r[c]
		if v.Kind == decoding.ColumnNull {
			b = append(b, "NULL"...)
			continue
		}
		b = append(b, '"')
		for _, ch := range v.Data {
			if ch == '"' || ch == '\\' {
				b = append(b, '\\')
			}
			b = append(b, ch)
		}
		b = append(b, '"')
	}
	return append(b, '}')
}

// queueSet queues one set statement of m. It is not prepared: parsed in the batch, after the
// savepoint, whatever the server refuses in it (a rule, a type without the operators) is a
// failed set statement, which falls back to row by row, not an error of the transaction. Once
// per group and table, the parse costs little, and the plan sees the arrays' sizes.
func (t *Conn) queueSet(m *Table, shape string, arrays [][]byte, sql func() string, oids []uint32) {
	t.newBatch()
	text := sql()
	t.batch.ExecParams(text, arrays, oids, nil, nil)
	t.bytes += len(text)
	op := shape[1]
	if op == 'P' {
		op = 'I' // the check of inserts undone
	}
	t.ops = append(t.ops, batchOp{op: op, rel: m, set: true})
	t.bytes += 32
	for _, a := range arrays {
		t.bytes += len(a)
	}
}
