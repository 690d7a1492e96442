package target

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Coalescing: set-based apply of a target transaction (Conn.Coalesce; package apply turns it on
// for the groups of Buffered). Instead of one statement per change, the changes of each table are
// held, reduced to their net effect per replica identity key, and sent at the commit (or when
// they grow past coalesceMaxBytes) as a few set statements per table, in the batch that commits.
// A REPLICA IDENTITY FULL table whose target has a primary key or a replica identity index of
// source columns is keyed by it (Table.Key), as any keyed table: its rows are found by that key
// alone, as PostgreSQL's subscriber finds them. Without one, it is keyed so too when its target
// table has a unique index that identifies a row for sure (see fullKey: the only unique or
// exclusion index, of plain columns, NOT NULL on the target, not partial, not deferrable); its
// updates and deletes name their row by the whole old row of the key's first change, as row by
// row:
//
//   - per key, the changes collapse into what the target must see at the end: an insert then
//     updates become the insert of the final row; updates, the last row; an insert then a
//     delete, nothing; a delete (or updates then a delete) then an insert, the delete and the
//     insert, in that order;
//   - deletes go as one DELETE ... USING unnest($1, ...), updates as one UPDATE ... FROM
//     unnest($1, ...), inserts as one INSERT ... SELECT FROM unnest($1, ...), each value array
//     a parameter of the column's array type; keys inserted and deleted again are checked to be
//     absent (the insert would have found them);
//   - for a FULL table, the DELETE and the UPDATE join on every column of the old row, compared
//     as whereSQL compares them ("=" for a column NOT NULL on the target, else IS NOT DISTINCT
//     FROM; text output for a type without equality), the key's columns among them, so the plan
//     finds the row through the key's index and the row must still equal the old row; the
//     UPDATE writes every column, as row by row. A later change of the key must name the row
//     held (its old row equal to it, as sent), else the table goes row by row. Such a table
//     stays out of the tombstone store (update_deleted is detected by replica identity key
//     only): its fallback reports update_missing, as row by row does;
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
//   - tables without a replica identity key (REPLICA IDENTITY FULL, or none), unless FULL with
//     a target key as above (not when its unique column may be NULL, when it has another unique
//     or exclusion index, or none): their inserts are held when the table has no unique index
//     at all, and an update or delete sends them;
//   - an update of the key, or of a table whose every column is in the key (a set UPDATE would
//     write nothing, and so check nothing); a change whose key or values are not all text or
//     NULL (binary values: Config.Binary) or whose column types have no array type;
//   - an update with unchanged TOASTed values not sent, unless the key's row is held whole
//     (inserted or updated in full earlier in the transaction): the values are taken from it
//     (FULL tables alike: their old row is whole, their new row may lack such values);
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
	// sizes are the changes each table held when its set statements were last queued: its
	// next netTable starts with room for as many (at most sizeHintMax), instead of growing
	// its slices and map change by change. Kept across target transactions.
	sizes map[*Table]int
	// spare holds, per table, the emptied containers of a netTable whose set statements
	// succeeded (recycle), for the table's next one. Kept across target transactions.
	spare map[*Table]*netTable
}

// next returns the coalescer that follows c once its tables are queued or dropped: nothing
// held, what is kept across target transactions kept.
func (c *coalescer) next() coalescer { return coalescer{sizes: c.sizes, spare: c.spare} }

// newNetTable returns the netTable that holds m's changes by key (nil: inserts only), or with
// !ok sends them row by row: with the containers of m's last one (spare), or room for as many
// changes as it held (sizes).
func (c *coalescer) newNetTable(m *Table, key []int, ok bool) *netTable {
	nt := &netTable{m: m, rowPath: !ok, keyed: key != nil, key: key, full: m.Full && key != nil}
	if !ok {
		return nt
	}
	if sp := c.spare[m]; sp != nil {
		delete(c.spare, m)
		nt.log, nt.rows, nt.kbuf, nt.obuf = sp.log, sp.rows, sp.kbuf, sp.obuf
		if nt.keyed {
			nt.keys = sp.keys
		}
	} else if n := c.sizes[m]; n > 0 {
		nt.log, nt.rows = make([]held, 0, n), make([]netRow, 0, n)
		if nt.keyed {
			nt.keys = make(map[string]int, n)
		}
	}
	return nt
}

// recycle keeps the log, rows, keys and key buffers of nt, whose set statements succeeded and
// which nothing refers to any more, emptied for the table's next netTable: none larger than
// sizeHintMax changes, for at most sizeHintTables tables. The tuples they referred to stay in
// the arena blocks they were copied into, which are never reused.
func (c *coalescer) recycle(nt *netTable) {
	if nt.rowPath || cap(nt.log) > sizeHintMax || cap(nt.rows) > sizeHintMax || len(nt.keys) > sizeHintMax {
		return
	}
	if c.spare == nil {
		c.spare = map[*Table]*netTable{}
	}
	if len(c.spare) >= sizeHintTables {
		clear(c.spare)
	}
	clear(nt.log)
	clear(nt.rows)
	clear(nt.keys)
	c.spare[nt.m] = &netTable{log: nt.log[:0], rows: nt.rows[:0], keys: nt.keys, kbuf: nt.kbuf[:0], obuf: nt.obuf[:0]}
	nt.log, nt.rows, nt.keys, nt.kbuf, nt.obuf = nil, nil, nil, nil, nil
}

// sizeHintMax bounds the room a netTable starts with; sizeHintTables bounds the tables whose
// sizes are kept (past it they are forgotten, all at once).
const (
	sizeHintMax    = 2048
	sizeHintTables = 1024
)

// netTable is what one table's held changes come to.
type netTable struct {
	m       *Table
	rowPath bool // its changes go row by row
	keyed   bool // identified by a key (key), else insert-only
	// key: the columns that identify a row, the replica identity key's, or for a REPLICA
	// IDENTITY FULL table (full) those of the target's unique index (see fullKey).
	key  []int
	full bool
	log  []held
	keys map[string]int // net row of each key, in rows
	rows []netRow
	// The most inserts one source transaction made in a row (run: the current transaction's,
	// xid), which decides whether they go through COPY (setCopyMin).
	xid       uint32
	run, most int
	// arena holds the copies of the changes' values; kbuf and obuf build keys.
	arena      arena
	kbuf, obuf []byte
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
	// key: a tuple holding the key's values (its first change's); for a FULL table whose first
	// change is an update or a delete, that change's old row, whole, which the target's row must
	// equal.
	key decoding.Tuple
}

// Coalesce turns set-based apply on or off for the changes that follow (see coalesce.go).
// Changes already held are sent at the commit either way.
func (t *Conn) Coalesce(on bool) { t.coalesce = on }

// Stepwise turns on or off applying the changes that follow one statement at a time, each
// resolved before the next is sent (and none set-based): as a batch cannot when a conflict's
// resolution must write before statements that follow it (ErrOutOfOrder). It costs a round
// trip per change.
func (t *Conn) Stepwise(on bool) { t.stepwise = on }

// curSrc is the source transaction of the change being queued, in detector.srcs.
func (t *Conn) curSrc() int32 {
	if t.srcOverride >= 0 {
		return t.srcOverride
	}
	return int32(len(t.det.Srcs) - 1)
}

// setEligible says whether m's changes may be held, and by which key (nil: inserts only).
func (t *Conn) setEligible(ctx context.Context, m *Table) (key []int, ok bool, err error) {
	if m.Triggers || m.rules || len(m.cols) == 0 {
		return nil, false, nil
	}
	for _, c := range m.cols {
		if c.arrayOID == 0 || c.delim == 0 {
			return nil, false, nil
		}
	}
	rc, err := t.conflictInfo(ctx, m)
	if err != nil {
		return nil, false, err
	}
	switch {
	case m.Full:
		if k := fullKey(m, rc); k != nil {
			return k, true, nil
		}
	case m.idErr == nil && len(m.Key) > 0:
		return m.Key, rc.Count == 1 && rc.KeyIndex && rc.OnConflict, nil
	}
	return nil, rc.Count == 0, nil
}

// FullKey returns, for a REPLICA IDENTITY FULL table, the columns of its target's key: its
// primary key or replica identity index, by which its rows are found (Table.Key), else a unique
// index that identifies its rows for sure (as set statements key them, see fullKey); or nil: for
// any other table, or one without such an index.
func (t *Conn) FullKey(ctx context.Context, m *Table) ([]int, error) {
	switch {
	case !m.fullSource:
		return nil, nil
	case !m.Full:
		return m.Key, nil // the target's replica identity index or primary key
	}
	rc, err := t.conflictInfo(ctx, m)
	if err != nil {
		return nil, err
	}
	return fullKey(m, rc), nil
}

// fullKey returns the columns of the target's unique index that identify the rows of m, a
// REPLICA IDENTITY FULL table, for sure, or nil: the table's only unique or exclusion index, a
// plain one (columns, no expression, no predicate, not deferrable) of source columns, each NOT
// NULL on the target and of a type with an equality operator. At most one row can then equal
// a FULL old row, and it holds the old row's key.
func fullKey(m *Table, rc *detect.Indexes) []int {
	if rc.Count != 1 || !rc.OnConflict || len(rc.Unique) != 1 {
		return nil
	}
	cols := rc.Unique[0].Cols
	for _, c := range cols {
		if !m.cols[c].notNull || m.cols[c].textEq {
			return nil
		}
	}
	return cols
}

// absorb holds a change of m when it can; false means the caller applies it row by row (the
// table's held changes were queued first).
func (t *Conn) absorb(ctx context.Context, m *Table, op byte, tup, old decoding.Tuple, oldKind byte) (bool, error) {
	c := &t.co
	nt := c.tables[m]
	if nt == nil {
		key, ok, err := t.setEligible(ctx, m)
		if err != nil {
			return false, err
		}
		if c.tables == nil {
			c.tables = map[*Table]*netTable{}
		}
		nt = c.newNetTable(m, key, ok)
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
	for _, col := range old { // held too: a key, or a FULL table's whole old row
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

// appendKey appends the key of tup (text values of the key columns) to b, or returns false when
// one is missing, NULL or not text.
func (nt *netTable) appendKey(b []byte, tup decoding.Tuple) ([]byte, bool) {
	for _, i := range nt.key {
		if i >= len(tup) || tup[i].Kind != decoding.ColumnText {
			return b, false
		}
		b = strconv.AppendInt(b, int64(len(tup[i].Data)), 10)
		b = append(b, ':')
		b = append(b, tup[i].Data...)
	}
	return b, true
}

// add holds a change, or returns false, changing nothing, when it cannot be held.
func (nt *netTable) add(op byte, tup, old decoding.Tuple, oldKind byte, src int32) bool {
	m := nt.m
	if !nt.keyed {
		if op != 'I' || len(tup) != len(m.cols) || !textRow(tup, false) {
			return false
		}
		tup = nt.arena.clone(tup)
		nt.log = append(nt.log, held{op: op, tup: tup, src: src})
		nt.rows = append(nt.rows, netRow{first: 'I', row: tup})
		return true
	}
	var ok bool
	switch op {
	case 'I':
		if len(tup) != len(m.cols) || !textRow(tup, false) {
			return false
		}
		nt.kbuf, ok = nt.appendKey(nt.kbuf[:0], tup)
	case 'U':
		if len(tup) != len(m.cols) || !textRow(tup, true) {
			return false
		}
		if !nt.full && len(nt.key) == len(m.cols) {
			return false // a table of only the key: a set UPDATE would write nothing, nor find its row
		}
		nt.kbuf, ok = nt.appendKey(nt.kbuf[:0], tup)
		if nt.full && !wholeRow(m, old, oldKind) {
			return false
		}
		if ok && (oldKind == 'K' || oldKind == 'O') {
			var okOld bool
			nt.obuf, okOld = nt.appendKey(nt.obuf[:0], old)
			ok = okOld && string(nt.obuf) == string(nt.kbuf) // else an update of the key
		}
	case 'D':
		if nt.full {
			if !wholeRow(m, old, oldKind) {
				return false
			}
		} else if oldKind != 'K' && oldKind != 'O' {
			return false
		}
		nt.kbuf, ok = nt.appendKey(nt.kbuf[:0], old)
	}
	if !ok {
		return false
	}
	i, seen := nt.keys[string(nt.kbuf)]
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
		if seen && nt.full && !sameTuple(old, r.row) {
			return false // not the row held: row by row finds no row, or another
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
		h.tup = nt.arena.clone(tup)
		if op == 'U' && (oldKind == 'K' || oldKind == 'O') {
			h.old = nt.arena.clone(old)
		}
	case 'D':
		h.old = nt.arena.clone(old)
	}
	nt.log = append(nt.log, h)
	if !seen {
		if nt.keys == nil {
			nt.keys = map[string]int{}
		}
		i = len(nt.rows)
		nt.keys[nt.arena.str(nt.kbuf)] = i
		r = netRow{first: op, key: h.tup}
		if op == 'D' || (nt.full && op == 'U') {
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
			r.row = nt.arena.clone(final)
		}
	case 'D':
		r.row = nil
	}
	nt.rows[i] = r
	return true
}

// wholeRow reports whether old is a FULL old row a set statement can match: sent (kind 'O'),
// every column, text or NULL.
func wholeRow(m *Table, old decoding.Tuple, oldKind byte) bool {
	return oldKind == 'O' && len(old) == len(m.cols) && textRow(old, false)
}

// sameTuple reports whether a and b hold the same values, as sent.
func sameTuple(a, b decoding.Tuple) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Kind != b[i].Kind || string(a[i].Data) != string(b[i].Data) {
			return false
		}
	}
	return true
}

// arena hands out copies of tuples from larger blocks of memory, so that holding a change costs
// no allocation of its own. Memory handed out is never written again: a block is dropped (left
// to the collector, with the tuples that point into it) once full, never reused.
type arena struct {
	cols []decoding.Column
	data []byte
}

// Block sizes of an arena: the first blocks are small (a table with few changes in a group
// holds little), later ones up to the maximum.
const (
	arenaMinCols, arenaMaxCols = 16, 256
	arenaMinData, arenaMaxData = 256, 8 << 10
)

// str returns a string of b's bytes, copied into the arena: its memory is never written again,
// which is what a string needs (unsafe.String).
func (a *arena) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	a.reserve(len(b))
	d := len(a.data)
	a.data = append(a.data, b...)
	return unsafe.String(&a.data[d], len(b))
}

// reserve makes room for n more bytes in the current data block, taking a new one if needed.
func (a *arena) reserve(n int) {
	if a.data == nil || n > cap(a.data)-len(a.data) { // never nil: an empty value is not NULL
		a.data = make([]byte, 0, max(n, min(2*cap(a.data), arenaMaxData), arenaMinData))
	}
}

// clone returns a copy of tup, its values' bytes included, which nothing else refers to.
func (a *arena) clone(tup decoding.Tuple) decoding.Tuple {
	n := 0
	for _, c := range tup {
		n += len(c.Data)
	}
	if a.cols == nil || len(tup) > cap(a.cols)-len(a.cols) { // never nil: a tuple held is not the absent row
		a.cols = make([]decoding.Column, 0, max(len(tup), min(2*cap(a.cols), arenaMaxCols), arenaMinCols))
	}
	a.reserve(n)
	s := len(a.cols)
	a.cols = a.cols[:s+len(tup)]
	out := a.cols[s : s+len(tup) : s+len(tup)]
	for i, c := range tup {
		out[i] = decoding.Column{Kind: c.Kind}
		if c.Data != nil {
			d := len(a.data)
			a.data = append(a.data, c.Data...)
			out[i].Data = a.data[d:len(a.data):len(a.data)]
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
	rows := t.co.rows
	t.co = t.co.next()
	t.co.rows = rows
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
	t.co = t.co.next()
	t.co.noteSizes(order)
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
	for _, sql := range setPlanOn {
		t.Control(sql)
		t.ops[len(t.ops)-1].set = true
	}
	var rows rowCounts
	for _, nt := range sets {
		t.failed = append(t.failed, nt)
		t.queueTableSets(nt, &rows)
	}
	for _, sql := range setPlanOff {
		t.Control(sql)
		t.ops[len(t.ops)-1].set = true
	}
	t.Control("RELEASE SAVEPOINT pgr_set")
	t.ops[len(t.ops)-1].set, t.ops[len(t.ops)-1].setEnd = true, true
	t.co.rows = rows
	return nil
}

// setPlanOn and setPlanOff surround the set statements of a target transaction: between them
// the planner joins a set statement's value arrays to its table by a nested loop, one probe of
// the key's index per row, as PostgreSQL's subscriber finds each row, and neither by a hash or
// merge join, which reads the whole table (or its whole index), nor by a scan of the whole table
// joined to the arrays row by row. For a group of a few thousand rows of a table of a hundred
// thousand, held in shared buffers, the planner's costs (a random page read per probe) favour
// the whole-table joins, which took two to three times as long as the probes; with a higher
// random_page_cost it scans the table and compares each of its rows with every row of the group.
// Every table applied so has a unique index on the columns the statements join on. The settings
// are local to the transaction, and setPlanOff sets them back to the session's own (RESET:
// apply's sessions never SET them), so that statements after the set statements, and the
// triggers they fire, plan as the target's configuration says. A failed set statement rolls back
// to the savepoint, which undoes setPlanOn.
var (
	setPlanOn = []string{"SELECT pg_catalog.set_config('enable_hashjoin', 'off', true), " +
		"pg_catalog.set_config('enable_mergejoin', 'off', true), pg_catalog.set_config('enable_seqscan', 'off', true)"}
	setPlanOff = []string{"RESET enable_hashjoin", "RESET enable_mergejoin", "RESET enable_seqscan"}
)

// noteSizes records the changes each table of order held (see coalescer.sizes).
func (c *coalescer) noteSizes(order []*netTable) {
	if len(c.sizes) > sizeHintTables {
		clear(c.sizes)
	}
	for _, nt := range order {
		if nt.rowPath {
			continue
		}
		if c.sizes == nil {
			c.sizes = map[*Table]int{}
		}
		c.sizes[nt.m] = min(len(nt.log), sizeHintMax)
	}
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
	if !errors.As(failed, &pgErr) || pgsession.TransientSQLState(pgErr.Code) {
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
	if err := t.resolveAll(ctx, ops, missed); err != nil {
		return err
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
		}, keyOIDs(m, nt.key))
	}
	// A keyed table's rows are named by the key; a FULL table's by the whole old row.
	named := func(rows []decoding.Tuple) ([][]byte, []uint32) {
		if nt.full {
			return allArrays(m, rows), allOIDs(m)
		}
		return keyArrays(m, nt.key, rows), keyOIDs(m, nt.key)
	}
	if len(delKeys) > 0 {
		arrays, oids := named(delKeys)
		t.queueSet(m, "SD", arrays, func() string { return setDeleteSQL(m, nt.key, nt.full, t.originMatch()) }, oids)
	}
	if set := setColumns(m, nt.key, nt.full); len(upd) > 0 && len(set) > 0 { // a table of only the key has nothing to write
		old := upd
		if nt.full {
			old = updOld
		}
		arrays, oids := named(old)
		for _, c := range set {
			arrays = append(arrays, columnArray(m, upd, c))
			oids = append(oids, m.cols[c].arrayOID)
		}
		t.queueSet(m, "SU", arrays, func() string { return setUpdateSQL(m, nt.key, nt.full, t.originMatch()) }, oids)
	}

	if len(ins) > 0 {
		t.queueSet(m, "SI", allArrays(m, ins), func() string {
			return asserted("INSERT INTO " + m.Name + " " + m.insertCols + " SELECT * FROM " +
				unnest(1, len(m.cols)) + " ON CONFLICT DO NOTHING")
		}, allOIDs(m))
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

func keyOIDs(m *Table, key []int) []uint32 {
	oids := make([]uint32, len(key))
	for j, c := range key {
		oids[j] = m.cols[c].arrayOID
	}
	return oids
}

// allOIDs returns the array types of every column of m.
func allOIDs(m *Table) []uint32 {
	oids := make([]uint32, len(m.cols))
	for c := range m.cols {
		oids[c] = m.cols[c].arrayOID
	}
	return oids
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

// keyArrays returns the arrays of the key columns of rows.
func keyArrays(m *Table, key []int, rows []decoding.Tuple) [][]byte {
	out := make([][]byte, len(key))
	for j, c := range key {
		out[j] = columnArray(m, rows, c)
	}
	return out
}

// allArrays returns the arrays of every column of rows.
func allArrays(m *Table, rows []decoding.Tuple) [][]byte {
	out := make([][]byte, len(m.cols))
	for c := range m.cols {
		out[c] = columnArray(m, rows, c)
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
