package target

import (
	"context"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
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
//     a parameter of the column's array type (binary for integers and text, see columnArray);
//     keys inserted and deleted again are checked to be absent (the insert would have found
//     them);
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
