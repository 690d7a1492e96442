package target

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// SetDetection turns conflict detection on for the connection's next transactions, with the
// session's d (nil: off).
func (t *Conn) SetDetection(d *detect.Detection) { t.det.Detection = d }

// SetSettle makes the connection call settle before it resolves a conflict (of a unique index,
// and a missing row or one another origin changed), on connections whose transaction
// may be applied while transactions before it in the source's commit order have not committed
// (the workers of Eager and Parallel): settle waits for those and says whether it had to. A row
// another transaction still in flight is about to delete, or to move off the value, is not a
// conflict the source had, and only the committed rows tell: after a wait the rows are looked up
// again (and the statement sent again), and only what is still there is a conflict. nil (the
// default): conflicts are resolved as met.
func (t *Conn) SetSettle(settle func(context.Context) (bool, error)) { t.settle = settle }

// settled calls the settle function, if any (see SetSettle).
func (t *Conn) settled(ctx context.Context) (bool, error) {
	if t.settle == nil {
		return false, nil
	}
	return t.settle(ctx)
}

// conflictInfo returns the unique indexes of m's target table, read the first time.
func (t *Conn) conflictInfo(ctx context.Context, m *Table) (*detect.Indexes, error) {
	if rc := t.indexes[m.info]; rc != nil {
		return rc, nil
	}
	rows, err := Query(ctx, t.pg, detect.UniqueQuery, strconv.FormatUint(uint64(m.OID), 10))
	if err != nil {
		return nil, fmt.Errorf("apply: reading the unique indexes of %s: %w", m.Name, err)
	}
	rc := detect.ParseIndexes(rows, &m.Table)
	if t.indexes == nil {
		t.indexes = map[*Relation]*detect.Indexes{}
	}
	t.indexes[m.info] = rc
	if t.det.On() && t.det.Tomb != nil && !m.Full && len(m.Key) > 0 {
		t.det.Tomb.Want(&m.Table)
	}
	return rc, nil
}

// checkedSQL is the statement s sends with detection: plain plus its check.
func (t *Conn) checkedSQL(m *Table, s *stmt, shape string) string {
	onConflict := false
	switch shape[0] {
	case 'I':
		rc, err := t.conflictInfo(context.Background(), m)
		onConflict = err == nil && rc.OnConflict
	case 'U', 'D':
		s.full = m.Full
		if shape[0] == 'D' {
			s.where = []byte(shape[1:])
		}
	}
	return t.det.CheckedSQL(shape[0], s.plain, onConflict)
}

// hasChecked reports whether the batch holds checked statements.
func (t *Conn) hasChecked() bool {
	if !t.det.On() {
		return false
	}
	for i := range t.ops {
		if t.ops[i].st != nil {
			return true
		}
	}
	return false
}

// commitCheck queues, before the commit, a check that fails when a checked statement of the
// transaction changed no row, after a savepoint: the batch that commits holds its last
// statements, whose conflicts must be resolved before the commit. The check failing skips the
// commit and leaves the transaction as it was at the savepoint; see heldBack.
func (t *Conn) commitCheck() {
	t.Control("SAVEPOINT pgr_commit")
	// Divides by zero when marked (not a constant: the planner would fold it and fail always).
	t.Control("SELECT 1 / (pg_catalog.current_setting('pgreorder.missed', true) IS DISTINCT FROM 'on')::int")
	t.ops[len(t.ops)-1].check = true
	t.Control("RELEASE SAVEPOINT pgr_commit")
}

// errRecommit says that the commit was held back by its check: send it again.
var errRecommit = errors.New("apply: commit held back by a conflict")

// heldBack undoes the failed check and resolves the conflicts of the batch.
func (t *Conn) heldBack(ctx context.Context, ops []batchOp, missed []int) error {
	t.stats.RoundTrips.Add(1)
	err := t.pg.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_commit; RELEASE SAVEPOINT pgr_commit; "+
		"SELECT pg_catalog.set_config('pgreorder.missed', '', true)").Close()
	if err != nil {
		return err
	}
	if err := t.resolveAll(ctx, ops, missed); err != nil {
		return err
	}
	return errRecommit
}

// queueUpdate queues an UPDATE with detection: kept for resolution, and alone after a
// savepoint when it may violate a unique constraint.
func (t *Conn) queueUpdate(ctx context.Context, m *Table, st *stmt, u *decoding.Update, whereAt int, full bool,
	params [][]byte, formats []int16, sets int) error {
	if st.where == nil {
		st.where, st.full = bytes.Clone(t.shape[whereAt:]), full
		rc, err := t.conflictInfo(ctx, m)
		if err != nil {
			return err
		}
		for i, s := range t.shape[1:whereAt] {
			if s != 0 && rc.InUnique[i] {
				st.risky = true
			}
		}
	}
	op := batchOp{op: 'U', rel: m, keyAt: int32(sets), guarded: st.risky}
	if st.risky {
		// At the end of the batch, which is sent at once: a violation skips nothing after it.
		t.Control("SAVEPOINT pgr_guard")
	}
	op.row, op.nrow = t.det.KeepTuple(u.New)
	t.queue(st, params, formats, op)
	if st.risky {
		t.Control("RELEASE SAVEPOINT pgr_guard")
		return t.FlushBatch(ctx)
	}
	return t.maybeFlush(ctx)
}

// settleChecks sends the batch when it holds checked statements, so that the conflicts they
// meet are resolved before what comes next: a savepoint, a rollback to one, or the commit
// (which must not go in the same round trip as statements whose conflicts may stop it). With
// detection, a transaction whose last changes are not sent yet takes one round trip more.
func (t *Conn) settleChecks(ctx context.Context) error {
	if !t.det.On() {
		return nil
	}
	for i := range t.ops {
		if t.ops[i].st != nil {
			return t.FlushBatch(ctx)
		}
	}
	return nil
}

// isViolation reports whether err is a unique or exclusion constraint violation.
func isViolation(err error) bool {
	return pgsession.IsCode(err, pgsession.UniqueViolation) || pgsession.IsCode(err, pgsession.ExclusionViolation)
}

// exec runs one statement of conflict resolution and returns its rows as text.
func (t *Conn) exec(ctx context.Context, sql string, params [][]byte, oids []uint32, formats []int16) (*pgconn.Result, error) {
	t.stats.RoundTrips.Add(1)
	t.stats.Statements.Add(1)
	if allZero(formats) {
		formats = nil
	}
	res := t.pg.ExecParams(ctx, sql, params, oids, formats, nil).Read()
	return res, res.Err
}

// resolve decides what to do about c (see Detector.Resolve); a conflict resolved as an error
// is a change the target refused, in statement op.
func (t *Conn) resolve(c *conflict.Report, op Op) (bool, error) {
	apply, stop := t.det.Resolve(c)
	if stop != nil {
		return false, &ChangeError{Kind: KindConflict, Op: op, Relation: c.Relation, Err: stop}
	}
	return apply, nil
}

// resolveAll resolves, in their order, the checked statements of a batch that affected no row
// (missed). The batch ran every statement before any resolution: an UPDATE or DELETE may have
// missed a row that a resolution before it then writes (an insert that goes through after all,
// the source's row inserted over a local one). Once a resolution wrote a row, each later one
// sends its statement again first (see rowMissed), as applying the changes one by one would.
//
// A resolution that writes after statements that followed it in the batch took effect on the
// same table cannot be put in its place: those statements ran against the rows as they stood
// before it (an UPDATE met the local row an apply_remote insert then replaces, a DELETE removed
// the conflicting row, so the insert goes through). Then the resolution returns ErrOutOfOrder,
// and the transaction is applied again one statement at a time (Stepwise). ops are the
// statements of the batch that ran (a failed statement and those after it are not among them).
func (t *Conn) resolveAll(ctx context.Context, ops []batchOp, missed []int) error {
	t.wrote = false
	defer func() { t.later = false }()
	for n, j := range missed {
		t.later = laterRan(ops, missed[n+1:], j)
		if err := t.resolveMissed(ctx, ops[j]); err != nil {
			return err
		}
	}
	return nil
}

// laterRan reports whether a statement after ops[j], on its table, took effect: one not in
// missed (the later statements that affected no row, in order).
func laterRan(ops []batchOp, missed []int, j int) bool {
	m := ops[j].rel
	for k := j + 1; k < len(ops); k++ {
		if len(missed) > 0 && missed[0] == k {
			missed = missed[1:]
			continue
		}
		if ops[k].rel == m && ops[k].op != 0 {
			return true
		}
	}
	return false
}

// ErrOutOfOrder is the error (in a *ChangeError) of a conflict resolution that would write
// after later statements of its batch changed the same table (see resolveAll). Package apply
// applies the transaction again with Stepwise on; with it on, the error cannot occur.
var ErrOutOfOrder = errors.New("apply: a conflict's resolution writes rows after later statements of its batch changed the table")

// outOfOrder is ErrOutOfOrder for op.
func outOfOrder(op batchOp) error {
	return &ChangeError{Kind: KindConflict, Op: opName(op.op), Relation: op.rel.Name, Err: ErrOutOfOrder}
}

// lateError is the error of a resolution's write that failed: ErrOutOfOrder for a unique
// violation when later statements of the batch changed the table (one of them may hold the
// key, which would have been the one to conflict had the changes gone one at a time).
func (t *Conn) lateError(op batchOp, err error) error {
	if t.later && isViolation(err) {
		return outOfOrder(op)
	}
	return t.statementError(op, err)
}

// resolveMissed resolves a checked statement that affected no row.
func (t *Conn) resolveMissed(ctx context.Context, op batchOp) error {
	t.det.Resolved++
	t.det.OpSrc = t.det.SrcOf(op.src)
	switch op.op {
	case 'I':
		return t.insertConflict(ctx, op)
	case 'U', 'D':
		return t.rowMissed(ctx, op)
	}
	return nil
}

// allLocal reports whether every row was last changed by a local transaction that committed
// with a timestamp: rows the origin check keeps statements off (a row without a commit
// timestamp, such as one this transaction wrote, counts as the Applier's).
func allLocal(rows []conflict.LocalRow) bool {
	for _, r := range rows {
		if r.Origin != "" || r.CommitTime.IsZero() {
			return false
		}
	}
	return true
}

// skipsInserts reports whether an INSERT's unique conflicts are skipped whichever they are:
// then the rows a batch's later statements changed do not change what is done (the report
// names the local rows as they stand when it is resolved).
func (t *Conn) skipsInserts() bool {
	c := t.det.Config
	return c.Resolution(conflict.InsertExists) == conflict.Skip && c.Resolution(conflict.MultipleUniqueConflicts) == conflict.Skip
}

// uniqueLocals looks up, for each unique index of m, the local row holding the key of row;
// skip names a row not to count (the one an UPDATE changes).
func (t *Conn) uniqueLocals(ctx context.Context, m *Table, row [][]byte, formats []int16, skip *detect.LocalRow) ([]conflict.LocalRow, []detect.LocalRow, error) {
	rc, err := t.conflictInfo(ctx, m)
	if err != nil {
		return nil, nil, err
	}
	var reps []conflict.LocalRow
	var rows []detect.LocalRow
	lock := t.det.Locks(conflict.InsertExists, conflict.UpdateExists, conflict.MultipleUniqueConflicts)
	for _, ix := range rc.Unique {
		var cond []byte
		var params [][]byte
		var fmts []int16
		var oids []uint32
		var key []conflict.ColumnValue
		usable := true
		for j, i := range ix.Cols {
			if row[i] == nil || formats[i] == detect.FmtUnchanged {
				usable = false // NULLs do not conflict; an unsent value cannot be compared
				break
			}
			if j > 0 {
				cond = append(cond, " AND "...)
			}
			cond = append(cond, m.cols[i].name+" = $"+strconv.Itoa(j+1)...)
			params, fmts, oids = append(params, row[i]), append(fmts, formats[i]), append(oids, m.cols[i].typeOID)
			key = append(key, conflict.ColumnValue{Name: m.info.Rel.Columns[i].Name, Value: detect.TextValue(row[i], formats[i])})
		}
		if !usable {
			continue
		}
		res, err := t.exec(ctx, t.det.LocalQuery(&m.Table, cond, lock), params, oids, fmts)
		if err != nil {
			return nil, nil, err
		}
		for _, r := range res.Rows {
			l := t.det.ParseLocal(&m.Table, r)
			if skip != nil && l.TableOID == skip.TableOID && l.CTID == skip.CTID {
				continue
			}
			l.Index, l.Key = ix.Name, key
			reps = append(reps, l.LocalRow)
			rows = append(rows, l)
		}
	}
	return reps, rows, nil
}

// deleteLocals deletes the local rows (once each).
func (t *Conn) deleteLocals(ctx context.Context, m *Table, rows []detect.LocalRow) error {
	seen := map[string]bool{}
	for _, l := range rows {
		k := l.TableOID + "/" + l.CTID
		if seen[k] {
			continue
		}
		seen[k] = true
		_, err := t.exec(ctx, "DELETE FROM "+m.Name+" WHERE tableoid = $1::oid AND ctid = $2::tid",
			[][]byte{[]byte(l.TableOID), []byte(l.CTID)}, nil, nil)
		if err != nil {
			return t.statementError(batchOp{op: 'D', rel: m}, err)
		}
	}
	return nil
}

// insertConflict resolves an INSERT ... ON CONFLICT DO NOTHING that inserted nothing.
func (t *Conn) insertConflict(ctx context.Context, op batchOp) error {
	row, formats := t.det.Kept(op.arg, op.narg)
	return t.insertResolved(ctx, op, row, formats, op.st.plain, op.st.oids)
}

// insertResolved inserts row into op's table with the plain INSERT sql, resolving the unique
// conflicts it meets as insert_exists or multiple_unique_conflicts.
func (t *Conn) insertResolved(ctx context.Context, op batchOp, row [][]byte, formats []int16, sql string, oids []uint32) error {
	m := op.rel
	// A local transaction may insert a conflicting row between the lookup and the INSERT (the
	// target is written concurrently, which is why there are conflicts): the INSERT runs after a
	// savepoint, and a unique violation rolls back to it and resolves again against the rows
	// now there, a few times at most.
	const attempts = 3
	// The rows in the way may go with transactions before it that have not committed (on a
	// worker): wait for them before anything is looked up (a wait after the lookup would leave
	// it stale).
	if _, err := t.settled(ctx); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		reports := len(t.det.Reports)
		reps, rows, err := t.uniqueLocals(ctx, m, row, formats, nil)
		if err != nil {
			return err
		}
		if t.later && !(t.det.OriginCheck() && len(reps) > 0 && allLocal(reps)) && !t.skipsInserts() {
			// Later statements of the batch may have changed the rows found (or deleted the one
			// the statement met): which conflict it was, and so its resolution, is not known.
			// (The origin check keeps them off rows last changed locally.)
			return outOfOrder(op)
		}
		if len(reps) > 0 {
			ct := conflict.InsertExists
			if len(reps) > 1 {
				ct = conflict.MultipleUniqueConflicts
			}
			c := t.det.NewConflict(ct, &m.Table)
			c.Remote, c.Local = detect.RowOf(&m.Table, row, formats), reps
			apply, err := t.resolve(c, OpInsert)
			if err != nil || !apply {
				return err
			}
			if err := t.deleteLocals(ctx, m, rows); err != nil {
				return err
			}
		} else if t.later {
			return outOfOrder(op) // a later statement may have deleted the conflicting row
		}
		// With no conflicting row left (gone meanwhile, or an exclusion constraint), the plain
		// INSERT says which.
		if _, err := t.exec(ctx, "SAVEPOINT pgr_insert", nil, nil, nil); err != nil {
			return err
		}
		_, err = t.exec(ctx, sql, row, oids, formats)
		if err == nil {
			t.rows.inserts++
			t.wrote = true
			_, err = t.exec(ctx, "RELEASE SAVEPOINT pgr_insert", nil, nil, nil)
			return err
		}
		if !pgsession.IsCode(err, pgsession.UniqueViolation) || attempt == attempts {
			return t.lateError(op, err)
		}
		if _, err := t.exec(ctx, "ROLLBACK TO SAVEPOINT pgr_insert", nil, nil, nil); err != nil {
			return err
		}
		clear(t.det.Reports[reports:]) // resolved again below
		t.det.Reports = t.det.Reports[:reports]
	}
}

// rowMissed resolves an UPDATE or DELETE that changed no row: its row was changed by another
// origin, or is missing (or was deleted).
func (t *Conn) rowMissed(ctx context.Context, op batchOp) error {
	m, st := op.rel, op.st
	params, formats := t.det.Kept(op.arg, op.narg)
	key, keyFormats := params[op.keyAt:], formats[op.keyAt:]
	var remote []conflict.ColumnValue
	var newRow [][]byte
	var newFormats []int16
	if op.op == 'U' {
		newRow, newFormats = t.det.Kept(op.row, op.nrow)
		remote = detect.RowOf(&m.Table, newRow, newFormats)
	}
	opName := opName(op.op)
	// The statement may have run before transactions ahead of it in commit order committed (on
	// a worker): a row they write, or delete resolving a conflict of a key they do not track.
	waited, err := t.settled(ctx)
	if err != nil {
		return err
	}
	if t.wrote || waited {
		// A resolution before it in the batch wrote a row, which it may be about, or earlier
		// transactions committed meanwhile: again first. (A row this transaction wrote counts
		// as the Applier's for the origin check.)
		n, err := t.sendAgain(ctx, op, t.det.OriginChecked(op.op, st.plain))
		if err != nil || n < 0 {
			return err
		}
		if n > 0 {
			if t.later {
				return outOfOrder(op) // the row may be one a later statement wrote
			}
			return nil
		}
	}
	if t.det.OriginCheck() {
		cond, oids := whereSQL(nil, m, st.where, st.full, 1, nil)
		if st.full {
			cond = append(cond, " LIMIT 1"...)
		}
		ct := conflict.UpdateOriginDiffers
		if op.op == 'D' {
			ct = conflict.DeleteOriginDiffers
		}
		res, err := t.exec(ctx, t.det.LocalQuery(&m.Table, cond, t.det.Locks(ct)), key, oids, keyFormats)
		if err != nil {
			return err
		}
		if len(res.Rows) > 0 {
			l := t.det.ParseLocal(&m.Table, res.Rows[0])
			if t.later && l.Origin == "" && l.CommitTime.IsZero() {
				// Written by this transaction (which the statement would have changed): by a
				// later statement of the batch, the row missing when this one ran.
				return outOfOrder(op)
			}
			c := t.det.NewConflict(ct, &m.Table)
			c.Remote, c.Identity, c.IdentityFull, c.Local = remote, detect.IdentityOf(&m.Table, st.where, st.full, key, keyFormats), st.full, []conflict.LocalRow{l.LocalRow}
			apply, err := t.resolve(c, opName)
			if err != nil || !apply {
				return err
			}
			if n, err := t.sendAgain(ctx, op, st.plain); err != nil || n != 0 {
				return err
			}
			// The row went meanwhile (a local transaction deleted it).
			return t.rowMissed(ctx, op)
		}
	}
	if op.op == 'D' {
		c := t.det.NewConflict(conflict.DeleteMissing, &m.Table)
		c.Identity, c.IdentityFull = detect.IdentityOf(&m.Table, st.where, st.full, key, keyFormats), st.full
		_, err := t.resolve(c, opName)
		if err == nil && c.Resolution == conflict.ApplyRemote {
			c.Note = "no row to delete"
		}
		return err
	}
	ct := conflict.UpdateMissing
	var deleted *conflict.LocalRow
	if t.det.Tomb != nil && !st.full && len(m.Key) > 0 {
		d, err := t.det.Tomb.Lookup(ctx, t.exec, &m.Table, key, keyFormats)
		if err != nil {
			return err
		}
		rt := t.det.OpSrc.CommitTime
		if d != nil && (rt.IsZero() || d.CommitTime.After(rt)) {
			ct, deleted = conflict.UpdateDeleted, d
		}
	}
	c := t.det.NewConflict(ct, &m.Table)
	c.Remote, c.Identity, c.IdentityFull = remote, detect.IdentityOf(&m.Table, st.where, st.full, key, keyFormats), st.full
	if deleted != nil {
		c.Local = []conflict.LocalRow{*deleted}
	}
	apply, err := t.resolve(c, opName)
	if err != nil || !apply {
		return err
	}
	// The source's change wins: insert its new row, when the source sent all of it.
	if slices.Contains(newFormats, detect.FmtUnchanged) {
		c.Note = "the source did not send every column (unchanged TOASTed values): not inserted"
		return nil
	}
	ins := t.insertStmt(m)
	if err := t.prepareStatements(ctx); err != nil {
		return err
	}
	sql := ins.plain
	if sql == "" {
		sql = t.insertSQL(m)
	}
	// The new row may meet unique conflicts of its own: resolved as an INSERT's.
	return t.insertResolved(ctx, batchOp{op: 'I', rel: m}, newRow, newFormats, sql, t.insertOIDs(m))
}

// insertSQL is the plain INSERT of every source column of m.
func (t *Conn) insertSQL(m *Table) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + m.Name + " " + m.insertCols + " VALUES (")
	for i := range m.cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("$" + strconv.Itoa(i+1))
	}
	b.WriteString(")")
	return b.String()
}

func (t *Conn) insertOIDs(m *Table) []uint32 {
	oids := make([]uint32, len(m.cols))
	for i, c := range m.cols {
		oids[i] = c.typeOID
	}
	return oids
}

// sendAgain sends the UPDATE or DELETE op again with sql, its parameters, and returns the rows it
// changed (counted), or -1 when it was an UPDATE that violated a unique constraint and that
// conflict was resolved instead. An UPDATE that may violate one runs after a savepoint.
func (t *Conn) sendAgain(ctx context.Context, op batchOp, sql string) (int64, error) {
	tag, failed, err := t.sendGuarded(ctx, op, sql, op.guarded)
	switch {
	case err != nil:
		return 0, err
	case failed != nil && (!op.guarded || !isViolation(failed)):
		return 0, t.lateError(op, failed)
	case failed != nil && t.later:
		return 0, outOfOrder(op) // a later statement may hold the key
	case failed != nil:
		return -1, t.updateConflict(ctx, op, t.statementError(op, failed))
	}
	n := tag.RowsAffected()
	if n > 0 {
		t.checkResult(batchOp{op: op.op, rel: op.rel}, tag)
		t.wrote = true
	}
	return n, nil
}

// updateAgain sends the guarded UPDATE op again, after a savepoint: done when it went through.
// A unique violation rolls back to the savepoint and is not done; a row that is gone now is
// resolved as the statement's other conflicts are.
func (t *Conn) updateAgain(ctx context.Context, op batchOp) (bool, error) {
	tag, failed, err := t.sendGuarded(ctx, op, op.st.plain, true)
	switch {
	case err != nil:
		return false, err
	case failed != nil && isViolation(failed):
		return false, nil
	case failed != nil:
		return false, t.statementError(op, failed)
	case tag.RowsAffected() == 0:
		return true, t.resolveMissed(ctx, op)
	}
	t.checkResult(batchOp{op: 'U', rel: op.rel}, tag)
	t.wrote = true
	return true, nil
}

// sendGuarded sends op's statement sql with op's parameters, after a savepoint when guard is
// set. The statement's own error is returned as failed, for the caller to name; a unique
// violation after the savepoint has been rolled back to it by then. err is any other failure
// (of the savepoint's commands), and the transaction is then unusable.
func (t *Conn) sendGuarded(ctx context.Context, op batchOp, sql string, guard bool) (tag pgconn.CommandTag, failed, err error) {
	params, formats := t.det.Kept(op.arg, op.narg)
	if guard {
		if _, err := t.exec(ctx, "SAVEPOINT pgr_guard", nil, nil, nil); err != nil {
			return tag, nil, err
		}
	}
	res, failed := t.exec(ctx, sql, params, op.st.oids, formats)
	switch {
	case failed != nil && guard && isViolation(failed):
		_, err = t.exec(ctx, "ROLLBACK TO SAVEPOINT pgr_guard", nil, nil, nil)
		return tag, failed, err
	case failed != nil:
		return tag, failed, nil
	case guard:
		_, err = t.exec(ctx, "RELEASE SAVEPOINT pgr_guard", nil, nil, nil)
	}
	return res.CommandTag, nil, err
}

// updateExists resolves a guarded UPDATE, the last statement of its batch, that violated a
// unique constraint: the transaction is rolled back to the guard, the conflicts of the
// statements before it (missed) resolved, and the conflicting local rows looked up.
func (t *Conn) updateExists(ctx context.Context, op batchOp, cause error, ops []batchOp, missed []int) error {
	t.stats.RoundTrips.Add(1)
	if err := t.pg.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_guard; RELEASE SAVEPOINT pgr_guard").Close(); err != nil {
		return err
	}
	if err := t.resolveAll(ctx, ops, missed); err != nil {
		return err
	}
	if t.wrote {
		// A resolution of a statement before it wrote, or deleted, a row: the one in the way,
		// perhaps. The UPDATE again, and only a violation now is a conflict.
		if done, err := t.updateAgain(ctx, op); done || err != nil {
			return err
		}
	}
	return t.updateConflict(ctx, op, cause)
}

// updateConflict resolves the unique conflicts of the guarded UPDATE op, which failed with
// cause (a unique violation) and was rolled back: the conflicting local rows are looked up, and
// the resolution decides.
func (t *Conn) updateConflict(ctx context.Context, op batchOp, cause error) error {
	t.det.OpSrc = t.det.SrcOf(op.src)
	// The rows in the way may go with transactions before it that have not committed (on a
	// worker): wait for them before anything is looked up, and after a wait the UPDATE again;
	// only a violation now is a conflict. (A wait after the lookup would leave it stale.)
	waited, err := t.settled(ctx)
	if err != nil {
		return err
	}
	if waited {
		if done, err := t.updateAgain(ctx, op); done || err != nil {
			return err
		}
	}
	m, st := op.rel, op.st
	params, formats := t.det.Kept(op.arg, op.narg)
	key, keyFormats := params[op.keyAt:], formats[op.keyAt:]
	newRow, newFormats := t.det.Kept(op.row, op.nrow)
	// The row being updated is not a conflict of its own update.
	cond, oids := whereSQL(nil, m, st.where, st.full, 1, nil)
	if st.full {
		cond = append(cond, " LIMIT 1"...)
	}
	res, err := t.exec(ctx, t.det.LocalQuery(&m.Table, cond, t.det.Locks(conflict.UpdateExists, conflict.MultipleUniqueConflicts)), key, oids, keyFormats)
	if err != nil {
		return err
	}
	var self *detect.LocalRow
	if len(res.Rows) > 0 {
		l := t.det.ParseLocal(&m.Table, res.Rows[0])
		self = &l
		// Values the source did not send are the local row's.
		for i, f := range newFormats {
			if f == detect.FmtUnchanged && l.Row[i].Value != nil {
				newRow[i], newFormats[i] = []byte(*l.Row[i].Value), 0
			}
		}
	}
	reps, rows, err := t.uniqueLocals(ctx, m, newRow, newFormats, self)
	if err != nil {
		return err
	}
	if len(reps) == 0 {
		return cause // an exclusion constraint, or not a conflict this can resolve
	}
	ct := conflict.UpdateExists
	if len(reps) > 1 {
		ct = conflict.MultipleUniqueConflicts
	}
	c := t.det.NewConflict(ct, &m.Table)
	c.Remote, c.Identity, c.IdentityFull, c.Local = detect.RowOf(&m.Table, newRow, newFormats), detect.IdentityOf(&m.Table, st.where, st.full, key, keyFormats), st.full, reps
	apply, err := t.resolve(c, OpUpdate)
	if err != nil || !apply {
		return err
	}
	if err := t.deleteLocals(ctx, m, rows); err != nil {
		return err
	}
	tag, err := t.exec(ctx, st.plain, params, st.oids, formats)
	if err != nil {
		return t.statementError(op, err)
	}
	t.checkResult(batchOp{op: 'U', rel: m}, tag.CommandTag)
	t.wrote = true
	return nil
}
