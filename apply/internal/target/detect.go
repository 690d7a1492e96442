package target

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/decoding"
)

// Conflict detection keeps the applier's fast paths as they are and pays only where something
// conflicts:
//
//   - Inserts go as INSERT ... ON CONFLICT DO NOTHING (short runs) or through COPY after a
//     savepoint (long runs; on a unique violation the run is rolled back to it and sent again
//     as INSERT ... ON CONFLICT DO NOTHING). An insert that affects no row met a unique index:
//     the local rows of every unique index are looked up, and the conflict reported
//     (insert_exists, or multiple_unique_conflicts when several indexes conflict).
//   - Updates and deletes are sent as before, plus, when the target tracks commit timestamps
//     and the Applier has a replication origin, a condition that the row was last changed by
//     one of the Applier's origins. One that affects no row is looked up: found, the row was
//     changed by another origin (*_origin_differs); missing, it is update_missing (or
//     update_deleted when a tombstone for its key is newer than the source transaction) or
//     delete_missing.
//   - An update that sets a column of a unique index goes after a savepoint, at the end of its
//     batch; a unique violation rolls back to it and is update_exists (or
//     multiple_unique_conflicts).
//   - Checked statements return the rows they changed and mark the transaction when none; the
//     batch that commits checks the mark after a savepoint, before its COMMIT, so that a
//     conflict holds the commit back (see commitCheck) and nothing else costs a round trip.
//
// Lookups and resolutions run on the connection applying the transaction, inside it, in the
// order of the statements.

// Detection is what a session knows about the target for conflict detection; shared by its
// targets, read-only once made.
type Detection struct {
	Config  *conflict.Config
	TrackTS bool     // the target has track_commit_timestamp on
	Ours    []uint32 // the Applier's replication origins' ids, when it has origins
	Origin  string   // the Applier's (the leader's) origin name, or ""
	Tomb    *Tombstones
	LogSQL  string // inserts conflict rows into conflict.Config.LogTable, or ""
	Log     *slog.Logger
}

// SetDetection turns conflict detection on for the connection's next transactions, with the
// session's d (nil: off).
func (t *Conn) SetDetection(d *Detection) { t.det.Detection = d }

// on reports whether conflict detection is on.
func (d *detector) on() bool { return d.Detection != nil }

// originCheck reports whether updates and deletes check the origin of the row they change.
func (d *Detection) originCheck() bool { return d.TrackTS && len(d.Ours) > 0 }

// remoteTxn is the source transaction a target applies, as conflict reports name it.
type remoteTxn struct {
	xid        uint32
	commitTime time.Time // zero until known (a transaction applied before its commit arrived)
	origin     string
	end        decoding.LSN
}

// relConflict is what detection needs of a target table: its unique indexes.
type relConflict struct {
	unique []uniqueIndex
	// onConflict: inserts may use ON CONFLICT DO NOTHING (the table has unique or exclusion
	// indexes, none deferrable).
	onConflict bool
	inUnique   []bool // per source column: part of a unique index
	// indexes counts the table's unique and exclusion indexes; keyIndex says that one of them
	// is a plain unique index on exactly the replica identity key's columns (see coalesce.go).
	indexes  int
	keyIndex bool
}

type uniqueIndex struct {
	name string
	cols []int // source columns; nil when the index uses a column the source does not send or an expression
}

const uniqueQuery = `SELECT c.relname, i.indimmediate, i.indisunique AND i.indexprs IS NULL AND i.indpred IS NULL,
	coalesce((SELECT pg_catalog.string_agg(a.attname, ',' ORDER BY k.o) FROM pg_catalog.unnest(i.indkey) WITH ORDINALITY k(n, o)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n), '')
FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::oid AND (i.indisunique OR i.indisexclusion) AND i.indisvalid AND i.indislive
ORDER BY c.relname`

// conflictInfo returns the unique indexes of m's target table, read the first time.
func (t *Conn) conflictInfo(ctx context.Context, m *Table) (*relConflict, error) {
	if rc := t.det.cinfo[m.info]; rc != nil {
		return rc, nil
	}
	rows, err := Query(ctx, t.PG, uniqueQuery, strconv.FormatUint(uint64(m.oid), 10))
	if err != nil {
		return nil, fmt.Errorf("apply: reading the unique indexes of %s: %w", m.Name, err)
	}
	byName := map[string]int{}
	for i, c := range m.info.Rel.Columns {
		byName[c.Name] = i
	}
	rc := &relConflict{onConflict: len(rows) > 0, inUnique: make([]bool, len(m.cols)), indexes: len(rows)}
	for _, r := range rows {
		if string(r[1]) != "t" {
			rc.onConflict = false // deferrable: ON CONFLICT refuses it as an arbiter
		}
		if string(r[2]) != "t" {
			continue // exclusion constraint, expression or partial index: not looked up
		}
		ix := uniqueIndex{name: string(r[0])}
		for name := range strings.SplitSeq(string(r[3]), ",") {
			i, ok := byName[name]
			if !ok {
				ix.cols = nil
				break
			}
			ix.cols = append(ix.cols, i)
			rc.inUnique[i] = true
		}
		if ix.cols != nil {
			rc.unique = append(rc.unique, ix)
			rc.keyIndex = rc.keyIndex || sameColumns(ix.cols, m.key)
		}
	}
	if t.det.cinfo == nil {
		t.det.cinfo = map[*Relation]*relConflict{}
	}
	t.det.cinfo[m.info] = rc
	if t.det.on() && t.det.Tomb != nil && !m.full && len(m.key) > 0 {
		t.det.Tomb.want(m)
	}
	return rc, nil
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

// checkedSQL is the statement s sends with detection: plain plus its check.
func (t *Conn) checkedSQL(m *Table, s *stmt, shape string) string {
	switch shape[0] {
	case 'I':
		rc, err := t.conflictInfo(context.Background(), m)
		if err == nil && rc.onConflict {
			return counted(s.plain + " ON CONFLICT DO NOTHING")
		}
	case 'U', 'D':
		s.full = m.full
		if shape[0] == 'D' {
			s.where = []byte(shape[1:])
		}
		if t.det.originCheck() {
			ids := make([]string, len(t.det.Ours))
			for i, id := range t.det.Ours {
				ids[i] = "'" + strconv.FormatUint(uint64(id), 10) + "'"
			}
			// A row last changed by a transaction without commit timestamp (frozen, older than
			// the tracking, or this one) counts as the Applier's.
			return counted(s.plain + " AND COALESCE((pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident, " +
				ids[0] + ") IN (" + strings.Join(ids, ", ") + ")")
		}
		return counted(s.plain)
	}
	return s.plain
}

// counted wraps a checked statement so that it returns the number of rows it changed and, when
// none, marks the transaction (pgreorder.missed), which the commit's check reads.
func counted(sql string) string {
	return "WITH pgr AS (" + sql + " RETURNING 1) SELECT c.n, CASE WHEN c.n = 0 THEN " +
		"pg_catalog.set_config('pgreorder.missed', 'on', true) END FROM (SELECT pg_catalog.count(*) AS n FROM pgr) c"
}

// hasChecked reports whether the batch holds checked statements.
func (t *Conn) hasChecked() bool {
	if !t.det.on() {
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
	err := t.PG.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_commit; RELEASE SAVEPOINT pgr_commit; "+
		"SELECT pg_catalog.set_config('pgreorder.missed', '', true)").Close()
	if err != nil {
		return err
	}
	for _, j := range missed {
		if err := t.resolveMissed(ctx, ops[j]); err != nil {
			return err
		}
	}
	return errRecommit
}

// fmtUnchanged marks a kept value the source did not send (an unchanged TOASTed value).
const fmtUnchanged = -1

// keep copies a statement's parameters for conflict resolution; it returns where they are.
func (d *detector) keep(params [][]byte, formats []int16) (at, n int32) {
	at = int32(len(d.argv))
	for i, p := range params {
		var f int16
		if i < len(formats) {
			f = formats[i]
		}
		d.argf = append(d.argf, f)
		if p == nil {
			d.argv = append(d.argv, nil)
			continue
		}
		start := len(d.arena)
		d.arena = append(d.arena, p...)
		d.argv = append(d.argv, d.arena[start:len(d.arena):len(d.arena)])
	}
	return at, int32(len(params))
}

// keepTuple copies a source row.
func (d *detector) keepTuple(tup decoding.Tuple) (at, n int32) {
	at = int32(len(d.argv))
	for _, c := range tup {
		switch c.Kind {
		case decoding.ColumnNull:
			d.argv, d.argf = append(d.argv, nil), append(d.argf, 0)
		case decoding.ColumnUnchanged:
			d.argv, d.argf = append(d.argv, nil), append(d.argf, fmtUnchanged)
		default:
			f := int16(0)
			if c.Kind == decoding.ColumnBinary {
				f = 1
			}
			start := len(d.arena)
			d.arena = append(d.arena, c.Data...)
			d.argv, d.argf = append(d.argv, d.arena[start:len(d.arena):len(d.arena)]), append(d.argf, f)
		}
	}
	return at, int32(len(tup))
}

// kept returns kept values; the arena is not reused until resetArgs.
func (d *detector) kept(at, n int32) ([][]byte, []int16) {
	return d.argv[at : at+n : at+n], d.argf[at : at+n : at+n]
}

func (d *detector) resetArgs() {
	if !d.on() {
		return
	}
	clear(d.argv)
	d.argv, d.argf, d.arena = d.argv[:0], d.argf[:0], d.arena[:0]
	if cap(d.arena) > 4*batchMaxBytes {
		d.arena = nil
	}
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
			if s != 0 && rc.inUnique[i] {
				st.risky = true
			}
		}
	}
	op := batchOp{op: 'U', rel: m, keyAt: int32(sets), guarded: st.risky}
	if st.risky {
		// At the end of the batch, which is sent at once: a violation skips nothing after it.
		t.Control("SAVEPOINT pgr_guard")
	}
	op.row, op.nrow = t.det.keepTuple(u.New)
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
	if !t.det.on() {
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
	return isCode(err, "23505") || isCode(err, "23P01")
}

// exec runs one statement of conflict resolution and returns its rows as text.
func (t *Conn) exec(ctx context.Context, sql string, params [][]byte, oids []uint32, formats []int16) (*pgconn.Result, error) {
	t.stats.RoundTrips.Add(1)
	t.stats.Statements.Add(1)
	if allZero(formats) {
		formats = nil
	}
	res := t.PG.ExecParams(ctx, sql, params, oids, formats, nil).Read()
	return res, res.Err
}

// localQuery selects the rows of m that cond (with parameters from $1) names, with what a
// report says of them: xmin, tableoid, ctid, the source columns, and with commit timestamps
// the commit time (microseconds since the epoch) and origin name.
func (t *Conn) localQuery(m *Table, cond []byte) string {
	var b strings.Builder
	b.WriteString("SELECT r.*")
	if t.det.TrackTS {
		b.WriteString(`, (pg_catalog.date_part('epoch', ts."timestamp") * 1000000)::int8, o.roname`)
	}
	b.WriteString(" FROM (SELECT xmin AS pgr_xmin, tableoid AS pgr_tableoid, ctid AS pgr_ctid")
	for _, c := range m.cols {
		b.WriteString(", " + c.name)
	}
	b.WriteString(" FROM " + m.Name + " WHERE ")
	b.Write(cond)
	b.WriteString(") r")
	if t.det.TrackTS {
		b.WriteString(" LEFT JOIN LATERAL pg_catalog.pg_xact_commit_timestamp_origin(r.pgr_xmin) ts ON true" +
			" LEFT JOIN pg_catalog.pg_replication_origin o ON o.roident = ts.roident")
	}
	return b.String()
}

// localRow is a row localQuery returned.
type localRow struct {
	conflict.LocalRow
	tableoid, ctid string
}

func (t *Conn) parseLocal(m *Table, r [][]byte) localRow {
	var l localRow
	x, _ := strconv.ParseUint(string(r[0]), 10, 32)
	l.Xid = uint32(x)
	l.tableoid, l.ctid = string(r[1]), string(r[2])
	n := len(m.cols)
	l.Row = make([]conflict.ColumnValue, n)
	for i := range n {
		l.Row[i] = conflict.ColumnValue{Name: m.info.Rel.Columns[i].Name, Value: textValue(r[3+i], 0)}
	}
	if t.det.TrackTS && len(r) >= 5+n {
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

// textValue renders a value for a report: text as it is, binary as \x hex, nil for NULL.
func textValue(v []byte, format int16) *string {
	switch {
	case format == fmtUnchanged:
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

// identityOf describes the replica identity op names.
func identityOf(m *Table, st *stmt, key [][]byte, formats []int16) []conflict.ColumnValue {
	var out []conflict.ColumnValue
	k := 0
	add := func(i int, s byte) {
		cv := conflict.ColumnValue{Name: m.info.Rel.Columns[i].Name}
		if s == 1 && k < len(key) {
			cv.Value = textValue(key[k], formats[k])
			k++
		}
		out = append(out, cv)
	}
	if st.full {
		for i, s := range st.where {
			if s != 0 {
				add(i, s)
			}
		}
	} else {
		for j, i := range m.key {
			add(i, st.where[j])
		}
	}
	return out
}

// rowOf describes a kept source row.
func rowOf(m *Table, row [][]byte, formats []int16) []conflict.ColumnValue {
	out := make([]conflict.ColumnValue, 0, len(row))
	for i, v := range row {
		if formats[i] == fmtUnchanged {
			continue
		}
		out = append(out, conflict.ColumnValue{Name: m.info.Rel.Columns[i].Name, Value: textValue(v, formats[i])})
	}
	return out
}

// newConflict starts the report of a conflict of the transaction being applied.
func (d *detector) newConflict(ct conflict.Type, m *Table) *conflict.Report {
	r := d.opSrc
	c := &conflict.Report{Type: ct, Relation: m.Name, RemoteXid: r.xid, RemoteFinalLSN: r.end,
		RemoteCommitTime: r.commitTime, RemoteOrigin: r.origin}
	return c
}

// resolve decides what to do about c: it returns whether to apply the source change, or an
// error when the resolution is conflict.Error. The report is kept until the transaction commits.
func (d *detector) resolve(c *conflict.Report, op Op) (bool, error) {
	r := d.Config.Resolution(c.Type)
	apply := false
	switch r {
	case conflict.ApplyRemote:
		apply = true
	case conflict.LastUpdateWins:
		apply = d.remoteWins(c)
		if apply {
			r, c.Winner = conflict.ApplyRemote, conflict.RemoteWins
		} else {
			r, c.Winner = conflict.Skip, conflict.LocalWins
		}
	case conflict.Error:
		c.Resolution = r
		return false, &ChangeError{Kind: KindConflict, Op: op, Relation: c.Relation, Err: newConflictError(c)}
	}
	c.Resolution = r
	d.reports = append(d.reports, c)
	return apply, nil
}

// remoteWins compares the source transaction's commit time with the local rows' (for
// update_deleted, the deletion's): the later wins. A source transaction whose commit has not
// arrived yet commits after now. Equal times are decided by the rows' text, the greater
// winning, so that two nodes replicating to each other pick the same version.
func (d *detector) remoteWins(c *conflict.Report) bool {
	rt := d.opSrc.commitTime
	if rt.IsZero() {
		rt = d.now()
	}
	for _, l := range c.Local {
		switch {
		case l.CommitTime.IsZero() || l.CommitTime.Before(rt):
		case l.CommitTime.After(rt):
			return false
		default:
			if rowText(l.Row) >= rowText(c.Remote) {
				return false
			}
		}
	}
	return true
}

func rowText(row []conflict.ColumnValue) string {
	var b strings.Builder
	for _, c := range row {
		if c.Value == nil {
			b.WriteString("\x00N")
		} else {
			b.WriteString("\x00V" + *c.Value)
		}
	}
	return b.String()
}

// completeReports fills in the commit of the source transaction in reports made before it
// arrived (a transaction applied as its parts arrive).
func (d *detector) completeReports() {
	for _, c := range d.reports {
		if c.RemoteCommitTime.IsZero() {
			c.RemoteCommitTime = d.remote.commitTime
		}
		if c.RemoteFinalLSN == 0 {
			c.RemoteFinalLSN = d.remote.end
		}
		if c.RemoteOrigin == "" {
			c.RemoteOrigin = d.remote.origin
		}
	}
}

// emitReports logs and counts the conflicts of the transaction that just committed.
func (d *detector) emitReports(stats *Counters, log *slog.Logger) {
	for _, c := range d.reports {
		stats.Conflicts[c.Type].Add(1)
		LogConflict(c, log, slog.LevelWarn)
	}
	d.dropReports()
}

func (d *detector) dropReports() {
	clear(d.reports)
	d.reports, d.marks = d.reports[:0], d.marks[:0]
}

// source records the source transaction being applied: its xid, and once its commit arrived, c.
func (d *detector) source(xid uint32, c *SourceCommit) {
	d.remote = remoteTxn{xid: xid}
	if c != nil {
		d.remote.commitTime, d.remote.origin, d.remote.end = c.Time, c.Origin, c.End
	}
	if !d.on() {
		return
	}
	if n := len(d.srcs); n > 0 && d.srcs[n-1].xid == xid {
		d.srcs[n-1] = d.remote // its commit arrived
	} else {
		d.srcs = append(d.srcs, d.remote)
	}
}

// savepoint marks the reports made before the savepoint of subtransaction sub.
func (d *detector) savepoint(sub uint32) {
	if d.on() {
		d.marks = append(d.marks, reportMark{sub: sub, n: len(d.reports)})
	}
}

// rollbackTo drops the reports made since the savepoint of sub: the subtransaction's conflicts
// are undone with it.
func (d *detector) rollbackTo(sub uint32) {
	for i, m := range d.marks {
		if m.sub == sub {
			clear(d.reports[m.n:])
			d.reports, d.marks = d.reports[:m.n], d.marks[:i+1]
			break
		}
	}
}

// rollback forgets the target transaction rolled back.
func (d *detector) rollback() {
	d.resetArgs()
	d.dropReports()
	d.srcs = d.srcs[:0]
}

// committed records that the target transaction committed: its conflicts are counted and
// logged, and the apply lag is the tombstones'.
func (d *detector) committed(stats *Counters, log *slog.Logger) {
	if d.on() && d.Tomb != nil {
		d.Tomb.committed(d.remote.commitTime)
	}
	d.emitReports(stats, log)
	d.srcs = d.srcs[:0]
}

// reportMark is the number of conflict reports made before a savepoint.
type reportMark struct {
	sub uint32
	n   int
}

// srcOf returns the source transaction op belongs to: a group (Buffered) applies several in
// one target transaction, and its conflicts are resolved after later ones were queued.
func (d *detector) srcOf(op batchOp) remoteTxn {
	if op.src >= 0 && int(op.src) < len(d.srcs) {
		return d.srcs[op.src]
	}
	return d.remote
}

// resolveMissed resolves a checked statement that affected no row.
func (t *Conn) resolveMissed(ctx context.Context, op batchOp) error {
	t.det.resolved++
	t.det.opSrc = t.det.srcOf(op)
	switch op.op {
	case 'I':
		return t.insertConflict(ctx, op)
	case 'U', 'D':
		return t.rowMissed(ctx, op)
	}
	return nil
}

// uniqueLocals looks up, for each unique index of m, the local row holding the key of row;
// skip names a row not to count (the one an UPDATE changes).
func (t *Conn) uniqueLocals(ctx context.Context, m *Table, row [][]byte, formats []int16, skip *localRow) ([]conflict.LocalRow, []localRow, error) {
	rc, err := t.conflictInfo(ctx, m)
	if err != nil {
		return nil, nil, err
	}
	var reps []conflict.LocalRow
	var rows []localRow
	for _, ix := range rc.unique {
		var cond []byte
		var params [][]byte
		var fmts []int16
		var oids []uint32
		var key []conflict.ColumnValue
		usable := true
		for j, i := range ix.cols {
			if row[i] == nil || formats[i] == fmtUnchanged {
				usable = false // NULLs do not conflict; an unsent value cannot be compared
				break
			}
			if j > 0 {
				cond = append(cond, " AND "...)
			}
			cond = append(cond, m.cols[i].name+" = $"+strconv.Itoa(j+1)...)
			params, fmts, oids = append(params, row[i]), append(fmts, formats[i]), append(oids, m.cols[i].typeOID)
			key = append(key, conflict.ColumnValue{Name: m.info.Rel.Columns[i].Name, Value: textValue(row[i], formats[i])})
		}
		if !usable {
			continue
		}
		res, err := t.exec(ctx, t.localQuery(m, cond), params, oids, fmts)
		if err != nil {
			return nil, nil, err
		}
		for _, r := range res.Rows {
			l := t.parseLocal(m, r)
			if skip != nil && l.tableoid == skip.tableoid && l.ctid == skip.ctid {
				continue
			}
			l.Index, l.Key = ix.name, key
			reps = append(reps, l.LocalRow)
			rows = append(rows, l)
		}
	}
	return reps, rows, nil
}

// deleteLocals deletes the local rows (once each).
func (t *Conn) deleteLocals(ctx context.Context, m *Table, rows []localRow) error {
	seen := map[string]bool{}
	for _, l := range rows {
		k := l.tableoid + "/" + l.ctid
		if seen[k] {
			continue
		}
		seen[k] = true
		_, err := t.exec(ctx, "DELETE FROM "+m.Name+" WHERE tableoid = $1::oid AND ctid = $2::tid",
			[][]byte{[]byte(l.tableoid), []byte(l.ctid)}, nil, nil)
		if err != nil {
			return t.statementError(batchOp{op: 'D', rel: m}, err)
		}
	}
	return nil
}

// insertConflict resolves an INSERT ... ON CONFLICT DO NOTHING that inserted nothing.
func (t *Conn) insertConflict(ctx context.Context, op batchOp) error {
	m := op.rel
	row, formats := t.det.kept(op.arg, op.narg)
	// A local transaction may insert a conflicting row between the lookup and the INSERT (the
	// target is written concurrently, which is why there are conflicts): the INSERT runs after a
	// savepoint, and a unique violation rolls back to it and resolves again against the rows
	// now there, a few times at most.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		reports := len(t.det.reports)
		reps, rows, err := t.uniqueLocals(ctx, m, row, formats, nil)
		if err != nil {
			return err
		}
		if len(reps) > 0 {
			ct := conflict.InsertExists
			if len(reps) > 1 {
				ct = conflict.MultipleUniqueConflicts
			}
			c := t.det.newConflict(ct, m)
			c.Remote, c.Local = rowOf(m, row, formats), reps
			apply, err := t.det.resolve(c, OpInsert)
			if err != nil || !apply {
				return err
			}
			if err := t.deleteLocals(ctx, m, rows); err != nil {
				return err
			}
		}
		// With no conflicting row left (gone meanwhile, or an exclusion constraint), the plain
		// INSERT says which.
		if _, err := t.exec(ctx, "SAVEPOINT pgr_insert", nil, nil, nil); err != nil {
			return err
		}
		_, err = t.exec(ctx, op.st.plain, row, op.st.oids, formats)
		if err == nil {
			t.rows.inserts++
			_, err = t.exec(ctx, "RELEASE SAVEPOINT pgr_insert", nil, nil, nil)
			return err
		}
		if !isCode(err, "23505") || attempt == attempts {
			return t.statementError(op, err)
		}
		if _, err := t.exec(ctx, "ROLLBACK TO SAVEPOINT pgr_insert", nil, nil, nil); err != nil {
			return err
		}
		clear(t.det.reports[reports:]) // resolved again below
		t.det.reports = t.det.reports[:reports]
	}
}

// rowMissed resolves an UPDATE or DELETE that changed no row: its row was changed by another
// origin, or is missing (or was deleted).
func (t *Conn) rowMissed(ctx context.Context, op batchOp) error {
	m, st := op.rel, op.st
	params, formats := t.det.kept(op.arg, op.narg)
	key, keyFormats := params[op.keyAt:], formats[op.keyAt:]
	var remote []conflict.ColumnValue
	var newRow [][]byte
	var newFormats []int16
	if op.op == 'U' {
		newRow, newFormats = t.det.kept(op.row, op.nrow)
		remote = rowOf(m, newRow, newFormats)
	}
	opName := opName(op.op)
	if t.det.originCheck() {
		cond, oids := whereSQL(nil, m, st.where, st.full, 1, nil)
		if st.full {
			cond = append(cond, " LIMIT 1"...)
		}
		res, err := t.exec(ctx, t.localQuery(m, cond), key, oids, keyFormats)
		if err != nil {
			return err
		}
		if len(res.Rows) > 0 {
			l := t.parseLocal(m, res.Rows[0])
			ct := conflict.UpdateOriginDiffers
			if op.op == 'D' {
				ct = conflict.DeleteOriginDiffers
			}
			c := t.det.newConflict(ct, m)
			c.Remote, c.Identity, c.IdentityFull, c.Local = remote, identityOf(m, st, key, keyFormats), st.full, []conflict.LocalRow{l.LocalRow}
			apply, err := t.det.resolve(c, opName)
			if err != nil || !apply {
				return err
			}
			if _, err := t.exec(ctx, st.plain, params, st.oids, formats); err != nil {
				if op.guarded && isViolation(err) {
					return t.statementError(op, err)
				}
				return t.statementError(op, err)
			}
			t.checkResult(batchOp{op: op.op}, pgconn.NewCommandTag("X 1"))
			return nil
		}
	}
	if op.op == 'D' {
		c := t.det.newConflict(conflict.DeleteMissing, m)
		c.Identity, c.IdentityFull = identityOf(m, st, key, keyFormats), st.full
		_, err := t.det.resolve(c, opName)
		if err == nil && c.Resolution == conflict.ApplyRemote {
			c.Note = "no row to delete"
		}
		return err
	}
	ct := conflict.UpdateMissing
	var deleted *conflict.LocalRow
	if t.det.Tomb != nil && !st.full && len(m.key) > 0 {
		d, err := t.det.Tomb.lookup(ctx, t, m, key, keyFormats)
		if err != nil {
			return err
		}
		rt := t.det.opSrc.commitTime
		if d != nil && (rt.IsZero() || d.CommitTime.After(rt)) {
			ct, deleted = conflict.UpdateDeleted, d
		}
	}
	c := t.det.newConflict(ct, m)
	c.Remote, c.Identity, c.IdentityFull = remote, identityOf(m, st, key, keyFormats), st.full
	if deleted != nil {
		c.Local = []conflict.LocalRow{*deleted}
	}
	apply, err := t.det.resolve(c, opName)
	if err != nil || !apply {
		return err
	}
	// The source's change wins: insert its new row, when the source sent all of it.
	if slices.Contains(newFormats, fmtUnchanged) {
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
	if _, err := t.exec(ctx, sql, newRow, t.insertOIDs(m), newFormats); err != nil {
		return t.statementError(batchOp{op: 'I', rel: m}, err)
	}
	t.rows.inserts++
	return nil
}

// insertSQL is the plain INSERT of every source column of m.
func (t *Conn) insertSQL(m *Table) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + m.Name + " " + m.copyCols + " VALUES (")
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

// updateExists resolves a guarded UPDATE, the last statement of its batch, that violated a
// unique constraint: the transaction is rolled back to the guard, the conflicts of the
// statements before it (missed) resolved, and the conflicting local rows looked up.
func (t *Conn) updateExists(ctx context.Context, op batchOp, cause error, ops []batchOp, missed []int) error {
	t.stats.RoundTrips.Add(1)
	if err := t.PG.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_guard; RELEASE SAVEPOINT pgr_guard").Close(); err != nil {
		return err
	}
	for _, j := range missed {
		if err := t.resolveMissed(ctx, ops[j]); err != nil {
			return err
		}
	}
	t.det.opSrc = t.det.srcOf(op)
	m, st := op.rel, op.st
	params, formats := t.det.kept(op.arg, op.narg)
	key, keyFormats := params[op.keyAt:], formats[op.keyAt:]
	newRow, newFormats := t.det.kept(op.row, op.nrow)
	// The row being updated is not a conflict of its own update.
	cond, oids := whereSQL(nil, m, st.where, st.full, 1, nil)
	if st.full {
		cond = append(cond, " LIMIT 1"...)
	}
	res, err := t.exec(ctx, t.localQuery(m, cond), key, oids, keyFormats)
	if err != nil {
		return err
	}
	var self *localRow
	if len(res.Rows) > 0 {
		l := t.parseLocal(m, res.Rows[0])
		self = &l
		// Values the source did not send are the local row's.
		for i, f := range newFormats {
			if f == fmtUnchanged && l.Row[i].Value != nil {
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
	c := t.det.newConflict(ct, m)
	c.Remote, c.Identity, c.IdentityFull, c.Local = rowOf(m, newRow, newFormats), identityOf(m, st, key, keyFormats), st.full, reps
	apply, err := t.det.resolve(c, OpUpdate)
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
	return nil
}

// numConflictTypes is the number of conflict types, for arrays indexed by them.
const numConflictTypes = int(conflict.MultipleUniqueConflicts) + 1

// conflictIdents and resolutionIdents are the Go names of the constants, for hints.
var (
	conflictIdents = [numConflictTypes]string{
		conflict.InsertExists: "InsertExists", conflict.UpdateOriginDiffers: "UpdateOriginDiffers",
		conflict.UpdateExists: "UpdateExists", conflict.UpdateMissing: "UpdateMissing",
		conflict.DeleteOriginDiffers: "DeleteOriginDiffers", conflict.UpdateDeleted: "UpdateDeleted",
		conflict.DeleteMissing: "DeleteMissing", conflict.MultipleUniqueConflicts: "MultipleUniqueConflicts",
	}
	resolutionIdents = map[conflict.Resolution]string{
		conflict.Default: "Default", conflict.Error: "Error", conflict.Skip: "Skip",
		conflict.ApplyRemote: "ApplyRemote", conflict.LastUpdateWins: "LastUpdateWins",
	}
)

// newConflictError is the error of conflict c, which stops Run, with its hint in terms of Config.
func newConflictError(c *conflict.Report) *conflict.StopError {
	e := &conflict.StopError{Report: c}
	rs := e.Resolutions()
	h := "set Config.Conflicts.Resolutions[conflict." + conflictIdents[c.Type] + "] to conflict." + resolutionIdents[rs[0]]
	if len(rs) > 1 {
		h += " (or conflict." + resolutionIdents[rs[1]] + ")"
	}
	e.Hint = h + " to get past it"
	return e
}
